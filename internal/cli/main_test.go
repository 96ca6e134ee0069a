package cli_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/internal/test/testserver"
)

// dlockBin is the dlock binary the tests run, built once by TestMain (with
// the race detector when the tests have it).
var dlockBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dlock-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "cli tests:", err)
		os.Exit(1)
	}
	dlockBin = filepath.Join(dir, "dlock")
	args := []string{"build", "-o", dlockBin}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, "github.com/dlock-go/dlock/cmd/dlock")...)
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "cli tests: go build ./cmd/dlock: %v\n%s", err, out)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	if raceEnabled {
		// The race runtime sleeps a second before a process exits
		// (GORACE atexit_sleep_ms, 1000 by default), for its goroutines'
		// last reports: every dlock run the tests make took a second
		// longer than its work, half of this package's time (311 s
		// against 164 s). A tenth of it still lets a report under way
		// finish; a race found in a dlock run fails its test as before
		// (exit code 66). A setting of the caller's own comes after it,
		// and wins.
		_ = os.Setenv("GORACE", strings.TrimSpace("atexit_sleep_ms=100 "+os.Getenv("GORACE")))
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { _ = os.RemoveAll(dir) }))
}

// result is how one dlock process ended.
type result struct {
	code           int
	stdout, stderr string
	elapsed        time.Duration
}

// env runs dlock for one test: with its own state directory (so the default
// store is never the user's), no DLOCK_* variables from outside, and the
// backend URL given, if any, in DLOCK_BACKEND.
type env struct {
	t     *testing.T
	state string // XDG_STATE_HOME
	vars  []string
}

func newEnv(t *testing.T, backend string, vars ...string) *env {
	t.Helper()
	e := &env{t: t, state: filepath.Join(t.TempDir(), "state")}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DLOCK_") && !strings.HasPrefix(kv, "XDG_STATE_HOME=") {
			e.vars = append(e.vars, kv)
		}
	}
	e.vars = append(e.vars, "XDG_STATE_HOME="+e.state)
	if backend != "" {
		e.vars = append(e.vars, "DLOCK_BACKEND="+backend)
	}
	e.vars = append(e.vars, vars...)
	return e
}

// proc is a dlock process started in the background.
type proc struct {
	t              *testing.T
	cmd            *exec.Cmd
	stdout, stderr syncBuffer
	start          time.Time
	done           chan struct{}
	res            result
}

// start starts dlock with args. The test's clean-up ends it if the test did
// not wait for it.
func (e *env) start(args ...string) *proc {
	e.t.Helper()
	p := &proc{t: e.t, cmd: exec.Command(dlockBin, args...), done: make(chan struct{})}
	p.cmd.Env = e.vars
	p.cmd.Stdout = &p.stdout
	p.cmd.Stderr = &p.stderr
	p.start = time.Now()
	if err := p.cmd.Start(); err != nil {
		e.t.Fatalf("start dlock: %v", err)
	}
	go func() {
		err := p.cmd.Wait()
		p.res = result{
			code:    p.cmd.ProcessState.ExitCode(),
			stdout:  p.stdout.String(),
			stderr:  p.stderr.String(),
			elapsed: time.Since(p.start),
		}
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			p.res.stderr += "\n(wait: " + err.Error() + ")"
		}
		if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			p.res.code = 128 + int(ws.Signal())
		}
		close(p.done)
	}()
	e.t.Cleanup(func() {
		select {
		case <-p.done:
			return
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM) // dlock passes it on to its command
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// stderrSoFar returns what the process has written to stderr until now.
func (p *proc) stderrSoFar() string { return p.stderr.String() }

// syncBuffer is a bytes.Buffer that may be read while a process writes to it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// wait waits for the process to exit, at most a minute.
func (p *proc) wait() result {
	p.t.Helper()
	select {
	case <-p.done:
		return p.res
	case <-time.After(time.Minute):
		p.t.Fatalf("dlock %s still running after a minute; its stderr so far:\n%s", strings.Join(p.cmd.Args[1:], " "), p.stderr.String())
	}
	return result{}
}

// run runs dlock with args to its end.
func (e *env) run(args ...string) result {
	e.t.Helper()
	return e.start(args...).wait()
}

// sqliteURL returns a backend URL for a fresh SQLite file.
func sqliteURL(t *testing.T) string {
	return "sqlite://" + filepath.Join(t.TempDir(), "locks.db")
}

// redisURL returns the backend URL of a fresh redis-server.
func redisURL(t *testing.T) (string, *testserver.Redis) {
	r := testserver.StartRedis(t)
	return "redis://" + r.Addr() + "/0", r
}

// forEachBackend runs test against SQLite and against Redis.
func forEachBackend(t *testing.T, test func(t *testing.T, backend string)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		test(t, sqliteURL(t))
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		u, _ := redisURL(t)
		test(t, u)
	})
}

// waitFile waits until the file at path exists and is not empty, and
// returns its content.
func waitFile(t *testing.T, path string, p *proc) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			return string(b)
		}
		if p != nil {
			select {
			case <-p.done:
				p.t.Fatalf("dlock exited (%d) before %s appeared; stderr:\n%s", p.res.code, path, p.res.stderr)
			default:
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if p != nil {
		t.Fatalf("%s did not appear within 30s; dlock's stderr so far:\n%s", path, p.stderrSoFar())
	}
	t.Fatalf("%s did not appear within 30s", path)
	return ""
}

// expect checks a result's exit code, and that stderr contains each of want.
func expect(t *testing.T, r result, code int, want ...string) {
	t.Helper()
	if r.code != code {
		t.Errorf("exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, code, r.stdout, r.stderr)
		return
	}
	for _, w := range want {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("stderr does not mention %q:\n%s", w, r.stderr)
		}
	}
}
