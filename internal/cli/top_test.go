package cli_test

import (
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/dlock-go/dlock/internal/safetext"
)

// terminal is a dlock process whose stdout, stdin and stderr are a pseudo-
// terminal, read by a goroutine of the test.
type terminal struct {
	t    *testing.T
	cmd  *exec.Cmd
	out  syncBuffer
	read chan struct{} // closed when the reader has seen the end
	exit chan struct{} // closed when the process has exited
	code int
}

func (e *env) startInTerminal(args ...string) *terminal {
	e.t.Helper()
	term := &terminal{t: e.t, cmd: exec.Command(dlockBin, args...), read: make(chan struct{}), exit: make(chan struct{})}
	term.cmd.Env = append(e.vars, "TERM=xterm")
	f, err := pty.StartWithSize(term.cmd, &pty.Winsize{Rows: 50, Cols: 220})
	if err != nil {
		e.t.Fatalf("start dlock in a pseudo-terminal: %v", err)
	}
	go func() {
		_, _ = io.Copy(&term.out, f) // ends with EIO once the process has exited and f is closed
		close(term.read)
	}()
	go func() {
		_ = term.cmd.Wait()
		term.code = term.cmd.ProcessState.ExitCode()
		if ws, ok := term.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			term.code = 128 + int(ws.Signal())
		}
		close(term.exit)
	}()
	e.t.Cleanup(func() {
		_ = term.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-term.exit:
		case <-time.After(10 * time.Second):
			_ = term.cmd.Process.Kill()
			<-term.exit
		}
		_ = f.Close()
		<-term.read
	})
	return term
}

// frame returns the last frame top finished drawing: what follows the last
// cursor-home sequence, up to the erase-below that ends a frame.
func (term *terminal) frame() string {
	s := term.out.String()
	end := strings.LastIndex(s, "\x1b[J")
	if end < 0 {
		return ""
	}
	start := strings.LastIndex(s[:end], "\x1b[H")
	if start < 0 {
		return ""
	}
	return strings.ReplaceAll(strings.ReplaceAll(s[start+3:end], "\x1b[K", ""), "\r\n", "\n")
}

// waitFrame waits until a frame satisfies ok, and returns it.
func (term *terminal) waitFrame(what string, within time.Duration, ok func(string) bool) string {
	term.t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if f := term.frame(); ok(f) {
			return f
		}
		select {
		case <-term.exit:
			term.t.Fatalf("dlock top exited (%d) before %s; output:\n%q", term.code, what, term.out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	term.t.Fatalf("no frame with %s within %v; last frame:\n%s", what, within, term.frame())
	return ""
}

// waitStdout waits until p has written a line on stdout (a run without a
// command prints its fence once it holds the lock).
func waitStdout(t *testing.T, p *proc) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(p.stdout.String(), "\n") {
		if time.Now().After(deadline) {
			t.Fatalf("dlock run printed no fence within 30s; stderr:\n%s", p.stderrSoFar())
		}
		select {
		case <-p.done:
			t.Fatalf("dlock run exited (%d) before it held the lock; stderr:\n%s", p.res.code, p.res.stderr)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestTopLiveInATerminal runs dlock top in a pseudo-terminal, on the
// default SQLite file (which does not exist when top starts) and on a real
// redis-server: a lock taken by dlock run appears with its holder and kind,
// a fair waiter shows in its queue, and the lock disappears once released.
// Ctrl-C ends top with status 0 and the cursor shown again.
func TestTopLiveInATerminal(t *testing.T) {
	for _, tc := range []struct {
		name    string
		backend func(t *testing.T) string
	}{
		{"sqlite-default", func(*testing.T) string { return "" }},
		{"redis", func(t *testing.T) string { u, _ := redisURL(t); return u }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, tc.backend(t))
			term := e.startInTerminal("top", "--interval", "100ms")
			term.waitFrame("no locks held", 30*time.Second, func(f string) bool { return strings.Contains(f, "no locks held") })

			holder := e.start("run", "--metadata", "<script>alert(1)</script>", "top-job")
			waitStdout(t, holder)
			f := term.waitFrame("top-job held", 5*time.Second, func(f string) bool {
				return strings.Contains(f, "top-job") && strings.Contains(f, "exclusive")
			})
			if !strings.Contains(f, "<script>alert(1)</script>") || !strings.Contains(f, "NAME") {
				t.Errorf("the frame does not show the holder's metadata under a header:\n%s", f)
			}
			waiter := e.start("run", "--fair", "--wait", "1m", "top-job", "--", "true")
			term.waitFrame("1 queued", 10*time.Second, func(f string) bool { return strings.Contains(f, "1 queued") })

			_ = holder.cmd.Process.Signal(syscall.SIGTERM)
			expect(t, holder.wait(), 0)
			expect(t, waiter.wait(), 0)
			term.waitFrame("top-job gone", 5*time.Second, func(f string) bool {
				return strings.Contains(f, "no locks held") && !strings.Contains(f, "top-job")
			})

			_ = term.cmd.Process.Signal(os.Interrupt)
			select {
			case <-term.exit:
			case <-time.After(10 * time.Second):
				t.Fatal("dlock top did not end within 10s of SIGINT")
			}
			if term.code != 0 {
				t.Errorf("dlock top exited %d after SIGINT, want 0", term.code)
			}
			if out := term.out.String(); !strings.Contains(out, "\x1b[?25h") {
				t.Errorf("dlock top did not show the cursor again: %q", out[max(0, len(out)-200):])
			}
		})
	}
}

// TestTopWaitTimeSaysWhatItCounts: the store does not say when a wait
// began, so top's time for a lock's waiters is the time it has seen them,
// and the cell says "seen", not "queued for", which read as the wait's
// whole length for a waiter that waited long before top started.
func TestTopWaitTimeSaysWhatItCounts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sqliteURL(t))
	holder := e.start("run", "top-wait")
	waitStdout(t, holder)
	e.start("run", "--fair", "--wait", "1m", "top-wait", "--", "true")
	term := e.startInTerminal("top", "--interval", "100ms")
	f := term.waitFrame("a waiting time", 20*time.Second, func(f string) bool {
		return strings.Contains(f, "1 queued") && strings.Contains(f, "s\n") && !strings.HasSuffix(strings.TrimSpace(f), "1 queued")
	})
	if !strings.Contains(f, "1 queued, seen ") || strings.Contains(f, "queued for") {
		t.Errorf("the waiters' time does not say it is the time top has seen them:\n%s", f)
	}
}

// TestTopEscapesInATerminal: an owner string written straight into Redis
// with escape sequences, C1 and bidi controls reaches the terminal escaped;
// the only escape sequences top writes are its own.
func TestTopEscapesInATerminal(t *testing.T) {
	t.Parallel()
	u, srv := redisURL(t)
	rdb := srv.Client(t)
	const hostile = "host\x1b]0;pwned\x07|pid 1|\x1b[2J\u009b31m\u202eexe.txt"
	if err := rdb.HSet(t.Context(), "dlock:{evil\x1b[31m}", "tok", 1, "owner", hostile, "fence", 7).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.PExpire(t.Context(), "dlock:{evil\x1b[31m}", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, u)
	term := e.startInTerminal("top", "--interval", "100ms")
	f := term.waitFrame("the hostile lock", 30*time.Second, func(f string) bool { return strings.Contains(f, "evil") })
	if !strings.Contains(f, `\x1b]0;pwned`) || !strings.Contains(f, `\u202e`) || !strings.Contains(f, `"evil\x1b[31m"`) {
		t.Errorf("the frame does not show the name and owner escaped:\n%s", f)
	}
	for _, own := range []string{"\x1b[?25l", "\x1b[?25h", "\x1b[2J", "\x1b[H", "\x1b[K", "\x1b[J"} {
		f = strings.ReplaceAll(f, own, "")
	}
	out := strings.ReplaceAll(f, "\r", "")
	for _, c := range out {
		if c != '\n' && safetext.Unsafe(c) {
			t.Fatalf("top wrote %U raw in a frame: %q", c, out)
		}
	}
	r := e.run("top")
	for _, c := range r.stdout {
		if c != '\n' && safetext.Unsafe(c) {
			t.Fatalf("top (one-shot) wrote %U raw: %q", c, r.stdout)
		}
	}
}

// TestTopOnce: with stdout not a terminal, top prints one plain table, with
// no escape sequence, and exits.
func TestTopOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend)
		expect(t, e.run("top"), 0)
		holder := e.start("run", "--shared", "top-read")
		waitStdout(t, holder)
		r := e.run("top", "--sort", "wait")
		expect(t, r, 0)
		if !strings.Contains(r.stdout, "top-read") || !strings.Contains(r.stdout, "readers") || strings.Contains(r.stdout, "\x1b") {
			t.Errorf("dlock top (not a terminal) printed:\n%q", r.stdout)
		}
		_ = holder.cmd.Process.Signal(syscall.SIGTERM)
		expect(t, holder.wait(), 0)
		if r := e.run("top"); r.code != 0 || strings.TrimSpace(r.stdout) != "no locks held" {
			t.Errorf("dlock top after the release: exit %d, stdout %q", r.code, r.stdout)
		}
		expect(t, e.run("top", "--sort", "longest"), 64, "--sort")
		expect(t, e.run("top", "a", "b"), 64, "at most one URL")
	})
}
