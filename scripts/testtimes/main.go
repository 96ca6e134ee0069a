// Command testtimes reads the output of `go test -json` and prints where the
// time went: each package's wall time, slowest first, then the slowest
// tests. scripts/test-times runs the suite through it.
//
//	go test -json ./... | go run ./scripts/testtimes
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

type event struct {
	Time    time.Time
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

type row struct {
	name    string
	elapsed time.Duration
	result  string
}

func main() {
	top := flag.Int("top", 20, "how many of the slowest tests to list")
	echo := flag.Bool("echo", true, "copy the tests' failure output to stderr as it comes")
	flag.Parse()
	pkgs, tests, err := read(os.Stdin, *echo)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testtimes:", err)
		os.Exit(2)
	}
	write(os.Stdout, pkgs, tests, *top)
	for _, p := range pkgs {
		if p.result == "fail" {
			os.Exit(1)
		}
	}
}

// read collects the packages' and top-level tests' results from a go test
// -json stream. With echo, the output of failing tests goes to stderr.
func read(r io.Reader, echo bool) (pkgs, tests []row, err error) {
	out := map[string][]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			if echo {
				fmt.Fprintln(os.Stderr, sc.Text()) // build errors come as plain text
			}
			continue
		}
		key := e.Package + " " + e.Test
		switch e.Action {
		case "output":
			if echo {
				out[key] = append(out[key], e.Output)
			}
		case "pass", "fail", "skip":
			d := time.Duration(e.Elapsed * float64(time.Second))
			switch {
			case e.Test == "":
				pkgs = append(pkgs, row{short(e.Package), d, e.Action})
			case !strings.Contains(e.Test, "/"):
				tests = append(tests, row{short(e.Package) + "." + e.Test, d, e.Action})
			}
			if e.Action == "fail" && echo {
				fmt.Fprint(os.Stderr, strings.Join(out[key], ""))
			}
			delete(out, key)
		}
	}
	return pkgs, tests, sc.Err()
}

func short(pkg string) string {
	if s := strings.TrimPrefix(pkg, "github.com/dlock-go/dlock"); s != pkg {
		if s == "" {
			return "dlock"
		}
		return strings.TrimPrefix(s, "/")
	}
	return pkg
}

func write(w io.Writer, pkgs, tests []row, top int) {
	byTime := func(rs []row) {
		sort.SliceStable(rs, func(i, j int) bool { return rs[i].elapsed > rs[j].elapsed })
	}
	byTime(pkgs)
	byTime(tests)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	var total time.Duration
	fmt.Fprintln(tw, "package\ttime\tresult\t")
	for _, p := range pkgs {
		total += p.elapsed
		fmt.Fprintf(tw, "%s\t%s\t%s\t\n", p.name, p.elapsed.Round(100*time.Millisecond), p.result)
	}
	fmt.Fprintf(tw, "all packages\t%s\t\t\n", total.Round(time.Second))
	tw.Flush()
	if top > len(tests) {
		top = len(tests)
	}
	fmt.Fprintf(w, "\nslowest %d tests\n", top)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, t := range tests[:top] {
		fmt.Fprintf(tw, "%s\t%s\t%s\t\n", t.name, t.elapsed.Round(100*time.Millisecond), t.result)
	}
	tw.Flush()
}
