package cli_test

import (
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
