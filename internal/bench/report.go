package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is the outcome of a bench session: where it ran, the baselines
// measured in the same session, and one Result per subject and workload.
type Report struct {
	Machine   Machine                `json:"machine"`
	Store     string                 `json:"store,omitempty"`
	Started   time.Time              `json:"started"`
	Baselines map[string]Percentiles `json:"baselines,omitempty"`
	Results   []Result               `json:"results"`
}

// Machine describes the host a report was measured on.
type Machine struct {
	CPU    string `json:"cpu"`
	CPUs   int    `json:"cpus"`
	OS     string `json:"os"`
	Kernel string `json:"kernel,omitempty"`
	Go     string `json:"go"`
}

// ThisMachine describes the host the process runs on.
func ThisMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH, Go: runtime.Version(), CPU: "unknown"}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}

// Find returns the result of subject on workload, or nil.
func (r *Report) Find(subject, workload string) *Result {
	for i := range r.Results {
		if r.Results[i].Subject == subject && r.Results[i].Workload == workload {
			return &r.Results[i]
		}
	}
	return nil
}

// WriteJSON writes r as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes r as aligned text: the machine, the baselines, then a
// row per result. Durations are in µs.
func (r *Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "machine: %s, %d CPUs, %s %s, %s\n", r.Machine.CPU, r.Machine.CPUs, r.Machine.OS, r.Machine.Kernel, r.Machine.Go)
	if r.Store != "" {
		fmt.Fprintf(w, "store:   %s\n", r.Store)
	}
	for _, k := range sortedKeys(r.Baselines) {
		p := r.Baselines[k]
		fmt.Fprintf(w, "baseline %s: p50 %s µs, p99 %s µs (%d samples)\n", k, us(p.P50), us(p.P99), p.N)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "subject\tworkload\tgrants/s\twait p50\tp99\tp99.9\tblocked p99\tblocked\thandoff p50\tp99\thandoffs\tjain\ttrips/cycle\tops/cycle\tscripts/cycle\tclient cpu\tstore cpu\terrors\t")
	for _, x := range r.Results {
		ops, scripts := "-", "-"
		if x.Ops != nil {
			ops, scripts = fmt.Sprintf("%.2f", x.OpsPerCycle), fmt.Sprintf("%.2f", x.ScriptsPerCycle)
		}
		trips := "-"
		if x.TripsPerCycle > 0 {
			trips = fmt.Sprintf("%.2f", x.TripsPerCycle)
		}
		ho, ho99 := "-", "-"
		if x.Handoff.N > 0 {
			ho, ho99 = us(x.Handoff.P50), us(x.Handoff.P99)
		}
		bl := "-"
		if x.Blocked.N > 0 {
			bl = us(x.Blocked.P99)
		}
		ccpu, scpu := "-", "-"
		if x.ClientCPUPerCycle > 0 {
			ccpu = us(x.ClientCPUPerCycle)
		}
		if x.StoreCPUPerCycle > 0 {
			scpu = us(x.StoreCPUPerCycle)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%d\t%.3f\t%s\t%s\t%s\t%s\t%s\t%d\t\n",
			x.Subject, x.Workload, x.Throughput, us(x.Wait.P50), us(x.Wait.P99), us(x.Wait.P999),
			bl, x.Blocked.N, ho, ho99, x.Handoff.N, x.Jain, trips, ops, scripts, ccpu, scpu, x.Errors)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nwait and handoff in µs; blocked = waits during which another worker was granted the name;")
	fmt.Fprintln(w, "handoff = release returned → a different, already waiting worker's acquire returned;")
	fmt.Fprintln(w, "trips = the client's round trips to the store; ops = commands or statements the store served (Redis counts those scripts run);")
	fmt.Fprintln(w, "scripts = the script calls among ops (EVAL, EVALSHA, FCALL);")
	fmt.Fprintln(w, "client cpu, store cpu = CPU time per grant in µs: of this process (the workers' clients and critical sections, and SQLite's work)")
	fmt.Fprintln(w, "and of the store's servers (Redis: INFO cpu); where they share the cores, CPU per grant bounds grants/s")
	kinds := map[string]bool{}
	for _, x := range r.Results {
		kinds[x.Params.Kind] = true
	}
	if kinds[KindRW] {
		fmt.Fprintln(w, "rw: a reader is blocked only by a writer's grant; handoffs follow writers' releases; jain = the lower of the writers' and the readers'")
	}
	if kinds[KindSemaphore] {
		fmt.Fprintln(w, "sem: no handoffs (a release frees one of several permits)")
	}
	for _, x := range r.Results {
		if x.FirstError != "" {
			fmt.Fprintf(w, "%s %s: first error: %s\n", x.Subject, x.Workload, x.FirstError)
		}
	}
	return nil
}

// us formats d in µs with up to one decimal.
func us(d time.Duration) string {
	v := float64(d) / float64(time.Microsecond)
	if v >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}

// LineProgress returns a Progress that keeps one line on a terminal w up to
// date, and a function that clears it.
func LineProgress(w io.Writer, total int) (p Progress, clear func()) {
	n, last := 0, ""
	p = func(subject, workload string, elapsed time.Duration, grants int64) {
		if key := subject + workload; key != last {
			n, last = n+1, key
		}
		fmt.Fprintf(w, "\r\x1b[K[%d/%d] %s %s: %.1fs, %d grants", n, total, subject, workload, elapsed.Seconds(), grants)
	}
	return p, func() { fmt.Fprint(w, "\r\x1b[K") }
}
