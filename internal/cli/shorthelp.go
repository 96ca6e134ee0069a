// The short help of --help and -h: the usage line and one line a flag,
// to fit on a screen; 'dlock help COMMAND' and the man pages keep the
// full text.

package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// shortFlagWidth is the width of the flag column of the short help.
const shortFlagWidth = 32

// printShortHelp prints the short help of cmd: its usage line, its flags
// (dlock's global flags for dlock itself, with the commands) one line
// each, and where the full help is.
func printShortHelp(w io.Writer, cmd *cobra.Command) {
	name := usageName(cmd)
	if !cmd.HasParent() {
		name = "dlock"
	}
	fmt.Fprintf(w, "usage: %s\n", synopses[name])
	if name == "dlock" {
		fmt.Fprintln(w, "\nCommands:")
		for _, c := range commandList() {
			fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
		}
		fmt.Fprintln(w, "\nFlags:")
		printFlagLines(w, cmd.PersistentFlags())
		fmt.Fprintln(w, "\nRun 'dlock help' for the backends, environment and exit codes, 'dlock help COMMAND' for a command's full help.")
		return
	}
	fmt.Fprintf(w, "%s.\n", upperFirst(cmd.Short))
	if cmd.NonInheritedFlags().HasAvailableFlags() {
		fmt.Fprintln(w, "\nFlags:")
		printFlagLines(w, cmd.NonInheritedFlags())
	}
	fmt.Fprintf(w, "\nGlobal flags: --backend URL, --password-file PATH, --connect-timeout D, --log-format F (dlock --help).\n")
	fmt.Fprintf(w, "Run 'dlock help %s' (or man dlock-%s) for the full help: details, exit status, examples.\n", name, name)
}

// printFlagLines prints fs's flags that are not hidden, one line each: the
// flag and the first clause of its usage.
func printFlagLines(w io.Writer, fs *pflag.FlagSet) {
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden || f.Name == "help" {
			return
		}
		spelled := "    --" + f.Name
		if f.Shorthand != "" {
			spelled = "-" + f.Shorthand + ", --" + f.Name
		}
		varname, usage := pflag.UnquoteUsage(f)
		if v, ok := valueNames[f.Name]; ok {
			spelled += " " + v
		} else if varname != "" {
			spelled += " " + flagValueName(varname)
		}
		fmt.Fprintf(w, "  %-*s %s\n", shortFlagWidth-2, spelled, withDefault(firstClause(usage), usage, f.DefValue))
	})
}

// withDefault returns short, a flag's usage cut to its first clause, with
// the flag's default after it, when it has one that short does not say:
// the usage's own "(default ...)" when short enough to fit (an environment
// variable's name may come first), else defValue unless it is a zero value.
func withDefault(short, usage, defValue string) string {
	if strings.Contains(short, "default") {
		return short
	}
	if i := strings.Index(usage, "(default"); i >= 0 {
		note, _, _ := strings.Cut(usage[i:], ")")
		note, _, _ = strings.Cut(note, "; ")
		if len(note) <= 40 {
			return short + " " + note + ")"
		}
		return short
	}
	switch defValue {
	case "", "0", "0s", "false", "[]":
		return short
	}
	if len(defValue) > 24 {
		return short // a long list: the full help says it in words
	}
	return short + " (default " + defValue + ")"
}

// valueNames name the values of the flags whose type says too little
// (a string) as the full help and the usage lines do.
var valueNames = map[string]string{
	"backend": "URL", "password-file": "PATH", "log-format": "text|json",
	"sort": "hold|wait", "prefix": "PREFIX", "listen": "HOST:PORT",
	"charts": "DIR", "cs": "LIST", "subjects": "LIST", "workloads": "LIST",
}

// flagValueName is the placeholder of a flag's value in the short help.
func flagValueName(varname string) string {
	switch varname {
	case "int":
		return "N"
	case "string":
		return "TEXT"
	}
	return strings.ToUpper(varname)
}

// firstClause is usage up to its first "; ", and, when that is still
// long, up to a parenthesis after its first words: the part that fits on
// one line.
func firstClause(usage string) string {
	if i := strings.Index(usage, "; "); i > 0 {
		usage = usage[:i]
	}
	if len(usage) > 60 {
		if i := strings.Index(usage[20:], " ("); i >= 0 {
			usage = usage[:20+i]
		}
	}
	return usage
}

// upperFirst returns s with its first letter in upper case.
func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
