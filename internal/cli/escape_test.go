package cli_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/safetext"
)

// A lock's owner string is written by whoever took the lock, and read by
// every user who waits for it, lists it or breaks it. One written by a
// hostile or older program (straight into Redis here) must reach nobody's
// terminal raw: no escape sequence (title, clear screen, OSC 52 to the
// clipboard), no C1 control, no bidi override.
func TestStoredTextIsEscaped(t *testing.T) {
	t.Parallel()
	u, srv := redisURL(t)
	rdb := srv.Client(t)
	const hostile = "host\x1b]0;pwned\x07|pid 1|\x1b[2J\u009b31m\u202eexe.txt|\x1b]52;c;cm0gLXJmIH4=\x07"
	at := strconv.FormatInt(time.Now().UnixMilli(), 10)
	if err := rdb.HSet(t.Context(), "dlock:{evil}", "tok", 1, "owner", hostile, "fence", 7, "at", at).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.PExpire(t.Context(), "dlock:{evil}", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, u)
	clean := func(what string, r result) {
		t.Helper()
		for _, out := range []string{r.stdout, r.stderr} {
			for _, c := range out {
				if safetext.Unsafe(c) && c != '\n' {
					t.Errorf("%s printed %U raw: %q", what, c, out)
					break
				}
			}
		}
		if !strings.Contains(r.stdout+r.stderr, `\x1b`) && !strings.Contains(r.stdout+r.stderr, `\u001b`) {
			t.Errorf("%s does not show the owner, escaped: %q %q", what, r.stdout, r.stderr)
		}
	}
	clean("ls", e.run("ls"))
	clean("ls --json", e.run("ls", "--json"))
	clean("inspect", e.run("inspect", "evil"))
	clean("inspect --json", e.run("inspect", "--json", "evil"))
	clean("top", e.run("top"))
	clean("run (busy)", e.run("run", "evil", "--", "true"))
	clean("run --wait (waiting)", e.run("run", "--wait", "300ms", "evil", "--", "true"))
	clean("release --force", e.run("release", "--force", "evil"))
	if err := rdb.HSet(t.Context(), "dlock:{evil}", "tok", 1, "owner", hostile, "fence", 8, "at", at).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.PExpire(t.Context(), "dlock:{evil}", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	clean("release --force --json", e.run("release", "--force", "--json", "evil"))
}

// Names and metadata with such characters are refused before they reach a
// store, naming the field.
func TestControlCharactersRefused(t *testing.T) {
	e := newEnv(t, sqliteURL(t))
	for _, tc := range []struct{ args []string }{
		{[]string{"run", "--metadata", "a\x1b[2Jb", "x", "--", "true"}},
		{[]string{"run", "--metadata", "a\u009bb", "x", "--", "true"}},
		{[]string{"run", "--metadata", "a\u202eb", "x", "--", "true"}},
		{[]string{"run", "ev\u202eil", "--", "true"}},
	} {
		r := e.run(tc.args...)
		if r.code != 64 || !strings.Contains(r.stderr, "control character") {
			t.Errorf("%q: exit %d, stderr %q; want 64 and the reason", tc.args, r.code, r.stderr)
		}
		for _, c := range r.stderr {
			if safetext.Unsafe(c) && c != '\n' {
				t.Errorf("%q: the error echoes %U raw: %q", tc.args, c, r.stderr)
				break
			}
		}
	}
}
