package cli_test

import (
	"regexp"
	"strings"
	"testing"
)

// TestShortHelpFitsOnAScreen: --help and -h print the usage line and one
// line a flag, on a screen, and point to 'dlock help', which keeps the
// full text.
func TestShortHelpFitsOnAScreen(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sqliteURL(t))
	for _, args := range [][]string{{"--help"}, {"-h"}, {"run", "--help"}, {"ls", "-h"}, {"bench", "--help"}, {"top", "--help"}} {
		r := e.run(args...)
		expect(t, r, 0)
		lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
		if len(lines) > 30 || !strings.HasPrefix(r.stdout, "usage: dlock") || !strings.Contains(r.stdout, "Run 'dlock help") {
			t.Errorf("dlock %s: %d lines, want the usage line, at most 30 lines and a pointer to 'dlock help':\n%s",
				strings.Join(args, " "), len(lines), r.stdout)
		}
	}
	if r := e.run("run", "--help"); !strings.Contains(r.stdout, "--take-over-dead") || strings.Contains(r.stdout, "Exit status") {
		t.Errorf("dlock run --help lists no flags, or the full help:\n%s", r.stdout)
	}
	if r := e.run("help", "run"); !strings.Contains(r.stdout, "Exit status") {
		t.Errorf("dlock help run lost the full help:\n%s", r.stdout)
	}
}

// TestShortHelpNamesValuesAsTheFullHelpDoes: each flag of a command's
// -h names its value as 'dlock help COMMAND' does (--sort hold|wait, not
// --sort TEXT), and a flag that takes one of a few words names them all.
func TestShortHelpNamesValuesAsTheFullHelpDoes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sqliteURL(t))
	fullLine := regexp.MustCompile(`^  (?:-[a-zA-Z], )?(--[a-z-]+)(?: ([^ ]+))?`)
	shortLine := regexp.MustCompile(`^  (?:-[a-zA-Z], |    )(--[a-z-]+)(?: ([^ ]+))?`)
	for _, cmd := range []string{"run", "ls", "inspect", "release", "bench", "top", "dash"} {
		full := map[string]string{}
		for _, line := range strings.Split(e.run("help", cmd).stdout, "\n") {
			if m := fullLine.FindStringSubmatch(line); m != nil {
				full[m[1]] = m[2]
			}
		}
		short := e.run(cmd, "-h").stdout
		for _, line := range strings.Split(short, "\n") {
			m := shortLine.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			if want, ok := full[m[1]]; ok && m[2] != want {
				t.Errorf("dlock %s -h: %s %s; dlock help %s has %s %s", cmd, m[1], m[2], cmd, m[1], want)
			}
		}
	}
	if r := e.run("top", "-h"); !strings.Contains(r.stdout, "--sort hold|wait") || !strings.Contains(r.stdout, "wait") {
		t.Errorf("dlock top -h does not name both orders of --sort:\n%s", r.stdout)
	}
}

// TestShortHelpGivesDefaults: a flag's line in -h ends with its default
// when it has one, and says none for a flag without.
func TestShortHelpGivesDefaults(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sqliteURL(t))
	line := func(out, flag string) string {
		for l := range strings.SplitSeq(out, "\n") {
			if strings.Contains(l, flag+" ") {
				return l
			}
		}
		t.Fatalf("no line for %s in:\n%s", flag, out)
		return ""
	}
	run := e.run("run", "-h").stdout
	bench := e.run("bench", "-h").stdout
	for _, c := range []struct{ out, flag, want string }{
		{run, "--ttl", "(default $DLOCK_TTL, else 10s)"},
		{run, "--wait", "(default $DLOCK_WAIT, else 0)"},
		{run, "--conflict-exit-code", "(default 75)"},
		{run, "--kill-grace", "(default 2s)"},
		{bench, "--duration", "(default 2s)"},
		{bench, "--workers", "(default 8)"},
		{bench, "--cs", "(default 0,100us,1ms,10ms)"},
		{run, "--metadata", ""},
		{run, "--fair", ""},
		{run, "--lock-delay", ""},
	} {
		l := line(c.out, c.flag)
		if c.want == "" && strings.Contains(l, "default") || c.want != "" && !strings.HasSuffix(l, " "+c.want) {
			t.Errorf("%s: %q; want it to end with %q", c.flag, l, c.want)
		}
	}
}
