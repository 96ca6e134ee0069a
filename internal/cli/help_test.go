package cli

import (
	"os"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// TestHelpDocumentsEveryFlag: every command has help and a usage line, and
// each flag a command's parser accepts appears in its help text.
func TestHelpDocumentsEveryFlag(t *testing.T) {
	for _, c := range commandList() {
		if _, ok := helps[c.name]; !ok {
			t.Errorf("no help for %s", c.name)
		}
		if _, ok := synopses[c.name]; !ok {
			t.Errorf("no usage line for %s", c.name)
		}
	}
	for cmd, names := range commandFlags() {
		for _, name := range names {
			if !strings.Contains(helps[cmd], name+" ") && !strings.Contains(helps[cmd], name+", ") {
				t.Errorf("help %s does not document %s", cmd, name)
			}
		}
	}
}

// commandFlags returns, for each command, the flags its parser accepts as
// help writes them (--ttl, -E): its own and, for those that use a store, the
// global ones; without cobra's --help.
func commandFlags() map[string][]string {
	noStore := map[string]bool{"version": true, "help": true, "completion": true}
	out := map[string][]string{}
	root := (&app{connectTimeout: defaultConnectTimeout}).rootCommand()
	for _, c := range root.Commands() {
		add := func(f *pflag.Flag) {
			if f.Name == "help" {
				return
			}
			out[c.Name()] = append(out[c.Name()], flagName(f.Name))
			if f.Shorthand != "" {
				out[c.Name()] = append(out[c.Name()], flagName(f.Shorthand))
			}
		}
		c.LocalFlags().VisitAll(add)
		if !noStore[c.Name()] {
			c.InheritedFlags().VisitAll(add)
		}
	}
	return out
}

// TestHelpStatesLimits: the help says what the default store and dlock run
// do not cover.
func TestHelpStatesLimits(t *testing.T) {
	var overview strings.Builder
	printHelp(&overview, "")
	for _, want := range []string{"processes of one user", "sudo dlock", "sqlite:///var/lib/dlock/locks.db"} {
		if !strings.Contains(overview.String(), want) {
			t.Errorf("dlock help does not say %q", want)
		}
	}
	if strings.Contains(overview.String(), "processes\nof one machine") || strings.Contains(overview.String(), "processes of one machine") {
		t.Error("dlock help still calls the default store machine-wide")
	}
	for _, want := range []string{"every\nprocess of COMMAND's process group", "(setsid", "kill -9", "SIGSTOP", "stops again each time"} {
		if !strings.Contains(runHelp, want) {
			t.Errorf("dlock help run does not say %q", want)
		}
	}
}

// TestCLIPageDocumentsEveryFlag: docs/CLI.md, the command's reference page,
// names every command and every flag each command's parser accepts.
func TestCLIPageDocumentsEveryFlag(t *testing.T) {
	raw, err := os.ReadFile("../../docs/CLI.md")
	if err != nil {
		t.Fatal(err)
	}
	page := string(raw)
	for _, c := range commandList() {
		if !strings.Contains(page, "dlock "+c.name) {
			t.Errorf("docs/CLI.md lacks dlock %s", c.name)
		}
	}
	for cmd, names := range commandFlags() {
		for _, name := range names {
			if !strings.Contains(page, name+" ") && !strings.Contains(page, name+"]") && !strings.Contains(page, name+"`") {
				t.Errorf("docs/CLI.md does not document %s of %s", name, cmd)
			}
		}
	}
}

// TestHelpListsGlobalFlagsWithTheCommandsFlags: in each command's full help
// the global flags (--backend ...) follow the command's own under "Flags:",
// before the exit status, not after it with no heading.
func TestHelpListsGlobalFlagsWithTheCommandsFlags(t *testing.T) {
	for cmd, h := range helps {
		at := strings.Index(h, "\n  --backend URL")
		if at < 0 {
			continue
		}
		flags, exit := strings.Index(h, "\nFlags:\n"), strings.Index(h, "\nExit status")
		if flags < 0 || flags > at || (exit >= 0 && exit < at) || strings.HasSuffix(h[:at], "\n") {
			t.Errorf("dlock help %s: --backend is not in its Flags: list, before Exit status", cmd)
		}
	}
}
