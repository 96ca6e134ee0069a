package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/dlock-go/dlock/internal/cli"
)

// TestGenMan: dlock-gen-man writes a page for dlock and one for each of its
// commands (help aside: dlock.1 covers it), each headed with its command
// (DLOCK-RUN(1)), and each page names the command's flags.
func TestGenMan(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "man")
	if err := genMan(dir); err != nil {
		t.Fatal(err)
	}
	root := cli.Command()
	pages := map[string]*pflag.FlagSet{"dlock.1": root.Flags()}
	for _, c := range root.Commands() {
		if c.Name() == "help" {
			continue
		}
		pages["dlock-"+c.Name()+".1"] = c.Flags()
	}
	if len(pages) < 8 {
		t.Fatalf("only %d commands: %v", len(pages), pages)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(pages) {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("pages %q, want one for each of %d commands", names, len(pages))
	}
	for name, flags := range pages {
		raw, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Error(err)
			continue
		}
		page := string(raw)
		title := strings.ToUpper(strings.TrimSuffix(name, ".1"))
		if !strings.Contains(page, ".TH \""+title+"\" \"1\"") {
			t.Errorf("%s: no man page header naming %s(1): %.80q", name, title, page)
		}
		flags.VisitAll(func(f *pflag.Flag) {
			// The OPTIONS section sets each flag in bold: \fB--ttl\fP.
			if !strings.Contains(page, `\fB--`+f.Name+`\fP`) {
				t.Errorf("%s does not name --%s", name, f.Name)
			}
		})
	}
	run, err := os.ReadFile(filepath.Join(dir, "dlock-run.1"))
	if err == nil && !strings.Contains(string(run), "Exit status") {
		t.Error("dlock-run.1 lacks the help's exit statuses")
	}
}

// TestGenManSynopsis: dlock.1's SYNOPSIS is dlock's usage line, with the
// global flags and COMMAND, as dlock help prints it.
func TestGenManSynopsis(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "man")
	if err := genMan(dir); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "dlock.1"))
	if err != nil {
		t.Fatal(err)
	}
	_, synopsis, ok := strings.Cut(string(raw), ".SH SYNOPSIS\n")
	if !ok {
		t.Fatalf("dlock.1 has no SYNOPSIS:\n%s", raw)
	}
	synopsis, _, _ = strings.Cut(synopsis, ".SH ")
	for _, want := range []string{"dlock [--backend URL]", "[--log-format text|json]", "COMMAND [ARGS...]"} {
		if !strings.Contains(synopsis, want) {
			t.Errorf("dlock.1's SYNOPSIS %q lacks %q", strings.TrimSpace(synopsis), want)
		}
	}
}
