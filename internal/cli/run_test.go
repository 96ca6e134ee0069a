package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestRunExcludes runs three dlock processes, two rounds each, on one lock;
// their commands append "start" and "end" lines with nanosecond times and
// their fence to one file. The intervals must never overlap, and the fences
// must grow.
func TestRunExcludes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		out := filepath.Join(t.TempDir(), "log")
		e := newEnv(t, backend, "OUT="+out)
		const procs, rounds = 3, 2
		script := `echo "start $(date +%s%N) $DLOCK_FENCE" >> "$OUT"; sleep 0.2; echo "end $(date +%s%N) $DLOCK_FENCE" >> "$OUT"`
		var wg sync.WaitGroup
		results := make(chan result, procs*rounds)
		for range procs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					results <- e.run("run", "--wait", "30s", "--ttl", "2s", "--kill-grace", "200ms", "shared", "--", "sh", "-c", script)
				}
			}()
		}
		wg.Wait()
		close(results)
		for r := range results {
			expect(t, r, 0)
		}

		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) != 2*procs*rounds {
			t.Fatalf("%d lines, want %d:\n%s", len(lines), 2*procs*rounds, b)
		}
		var lastEnd int64
		var lastFence uint64
		for i := 0; i < len(lines); i += 2 {
			start, sf := parseEvent(t, lines[i], "start")
			end, ef := parseEvent(t, lines[i+1], "end")
			if sf != ef {
				t.Errorf("line %d: start of fence %d followed by end of fence %d:\n%s", i+1, sf, ef, b)
			}
			if start < lastEnd {
				t.Errorf("line %d: interval starts %v before the previous one ended:\n%s", i+1, time.Duration(lastEnd-start), b)
			}
			if sf <= lastFence {
				t.Errorf("line %d: fence %d after fence %d:\n%s", i+1, sf, lastFence, b)
			}
			lastEnd, lastFence = end, sf
		}
	})
}

func parseEvent(t *testing.T, line, kind string) (at int64, fence uint64) {
	t.Helper()
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != kind {
		t.Fatalf("line %q, want %q TIME FENCE", line, kind)
	}
	at, err1 := strconv.ParseInt(f[1], 10, 64)
	fence, err2 := strconv.ParseUint(f[2], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("line %q: %v %v", line, err1, err2)
	}
	return at, fence
}

func TestRunChildEnvironmentAndExitCode(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		e := newEnv(t, backend, "DLOCK_FENCE=stale")
		r := e.run("run", "--metadata", "nightly job", "env-test", "--", "sh", "-c",
			`printf '%s\n%s\n%s\n' "$DLOCK_NAME" "$DLOCK_FENCE" "$DLOCK_OWNER"; exit 7`)
		expect(t, r, 7)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		if len(lines) != 3 {
			t.Fatalf("stdout %q, want three lines", r.stdout)
		}
		if lines[0] != "env-test" {
			t.Errorf("DLOCK_NAME = %q", lines[0])
		}
		if n, err := strconv.ParseUint(lines[1], 10, 64); err != nil || n == 0 {
			t.Errorf("DLOCK_FENCE = %q, want a fence", lines[1])
		}
		if !strings.Contains(lines[2], "|pid ") || !strings.HasSuffix(lines[2], "|nightly job") {
			t.Errorf("DLOCK_OWNER = %q, want host|pid N|time|nightly job", lines[2])
		}

		// The lock was released: the next run gets it at once, with a larger fence.
		r = e.run("run", "env-test", "--", "sh", "-c", `echo "$DLOCK_FENCE"; kill -TERM $$`)
		expect(t, r, 128+int(syscall.SIGTERM))
		if next, _ := strconv.ParseUint(strings.TrimSpace(r.stdout), 10, 64); next <= mustUint(t, lines[1]) {
			t.Errorf("second fence %q is not above the first, %s", r.stdout, lines[1])
		}
	})
}

func mustUint(t *testing.T, s string) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestRunCommandNotFound(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sqliteURL(t))
	expect(t, e.run("run", "x", "--", "no-such-command-dlock-test"), 127, `cannot run "no-such-command-dlock-test": command not found`)
	expect(t, e.run("run", "x", "--", t.TempDir()), 126, "cannot run")
	// The lock was given back each time.
	expect(t, e.run("run", "x", "--", "true"), 0)
}

// TestRunCommandThatCannotStartSaysWhy: a command that exists but cannot
// start is not "command not found": a script whose #! interpreter is
// missing (a Windows line end makes "/bin/sh\r") names it, a path to no
// file says so, and a directory is called one; with the shell's statuses.
func TestRunCommandThatCannotStartSaysWhy(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sqliteURL(t))
	dir := t.TempDir()
	crlf := filepath.Join(dir, "crlf.sh")
	if err := os.WriteFile(crlf, []byte("#!/bin/sh\r\necho hi\r\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	expect(t, e.run("run", "x", "--", crlf), 127, `cannot run "`+crlf+`": its #! line names the interpreter "/bin/sh\r", which was not found`)
	missing := filepath.Join(dir, "missing.sh")
	expect(t, e.run("run", "x", "--", missing), 127, `cannot run "`+missing+`": no such file`)
	expect(t, e.run("run", "x", "--", dir), 126, `cannot run "`+dir+`": is a directory`)
	expect(t, e.run("run", "x", "--", "true"), 0)
}

// TestRunForwardsSignals sends SIGTERM to dlock run: its command's trap
// sees it, and dlock exits with the command's status and releases the lock.
func TestRunForwardsSignals(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		dir := t.TempDir()
		ready, trapped := filepath.Join(dir, "ready"), filepath.Join(dir, "trapped")
		e := newEnv(t, backend, "READY="+ready, "TRAPPED="+trapped)
		p := e.start("run", "sig", "--", "sh", "-c",
			`trap 'echo TERM > "$TRAPPED"; exit 3' TERM; echo $$ > "$READY"; while :; do sleep 0.05; done`)
		waitFile(t, ready, p)
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		r := p.wait()
		expect(t, r, 3)
		if got := waitFile(t, trapped, nil); strings.TrimSpace(got) != "TERM" {
			t.Errorf("trap wrote %q", got)
		}
		expect(t, e.run("run", "sig", "--", "true"), 0) // released
	})
}

// TestRunSignalExitSaid: a command killed by a signal ends dlock with 128+N
// and a message saying so, which a command that exits 137 itself does not
// get.
func TestRunSignalExitSaid(t *testing.T) {
	e := newEnv(t, sqliteURL(t))
	r := e.run("run", "sig", "--", "sh", "-c", `kill -KILL $$`)
	expect(t, r, 137, "dlock: the command was killed by SIGKILL (exit status 137)")
	r = e.run("run", "sig", "--", "sh", "-c", `exit 137`)
	expect(t, r, 137)
	if r.stderr != "" {
		t.Errorf("a command that exited 137 itself: stderr %q, want nothing", r.stderr)
	}
	// SIGPIPE ends a pipeline's writer quietly, as shells have it; -q
	// silences the others.
	for _, args := range [][]string{
		{"run", "sig", "--", "sh", "-c", `kill -PIPE $$`},
		{"run", "-q", "sig", "--", "sh", "-c", `kill -KILL $$`},
	} {
		r := e.run(args...)
		if r.code < 128 || r.stderr != "" {
			t.Errorf("%q: exit %d, stderr %q; want 128+N and nothing said", args, r.code, r.stderr)
		}
	}
}

// TestRunInterruptedWhileWaiting: a signal during the wait ends dlock with
// 128+N and leaves the holder alone.
func TestRunInterruptedWhileWaiting(t *testing.T) {
	t.Parallel()
	backend, _ := redisURL(t)
	ready := filepath.Join(t.TempDir(), "ready")
	e := newEnv(t, backend, "READY="+ready)
	holder := e.start("run", "busy", "--", "sh", "-c", `echo x > "$READY"; sleep 30`)
	waitFile(t, ready, holder)
	waiter := e.start("run", "--wait", "forever", "busy", "--", "true")
	waitStderr(t, waiter, "is held by")
	_ = waiter.cmd.Process.Signal(syscall.SIGINT)
	expect(t, waiter.wait(), 128+int(syscall.SIGINT), "SIGINT while waiting")
	r := e.run("inspect", "busy")
	if r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf("pid %d", holder.cmd.Process.Pid)) {
		t.Errorf("after the interrupted wait, inspect: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// waitStderr waits until p's stderr shows want.
func waitStderr(t *testing.T, p *proc, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if strings.Contains(p.stderrSoFar(), want) {
			return
		}
		select {
		case <-p.done:
			t.Fatalf("dlock exited (%d) before its stderr showed %q:\n%s", p.res.code, want, p.res.stderr)
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("stderr did not show %q within 30s; it showed:\n%s", want, p.stderrSoFar())
}

func TestRunNotObtained(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		ready := filepath.Join(t.TempDir(), "ready")
		e := newEnv(t, backend, "READY="+ready)
		holder := e.start("run", "--metadata", "the holder", "busy", "--", "sh", "-c", `echo x > "$READY"; sleep 30`)
		waitFile(t, ready, holder)
		holderPID := fmt.Sprintf("|pid %d|", holder.cmd.Process.Pid)

		r := e.run("run", "--wait", "0", "busy", "--", "echo", "ran")
		expect(t, r, 75, `"busy" is held by`, holderPID, "the holder", "expires in", "not waiting")
		if r.stdout != "" {
			t.Errorf("the command ran: %q", r.stdout)
		}
		if n := strings.Count(strings.TrimSpace(r.stderr), "\n"); n != 0 {
			t.Errorf("stderr has %d lines, want one:\n%s", n+1, r.stderr)
		}

		r = e.run("run", "--wait", "700ms", "busy", "--", "echo", "ran")
		expect(t, r, 75, "not obtained within 700ms", holderPID, "waiting up to 700ms")
		if r.elapsed < 700*time.Millisecond || r.elapsed > 5*time.Second {
			t.Errorf("gave up after %v, want about 700ms", r.elapsed)
		}
		if strings.Count(r.stderr, "is held by") != 1 {
			t.Errorf("the holder was announced more than once:\n%s", r.stderr)
		}
	})
}

// TestRunConflictExitCode: --conflict-exit-code (-E) sets the status of a
// lock not obtained, whether dlock tried once or waited; with 0 a busy lock
// is a silent success, as with flock -n -E 0; --quiet silences the message
// whatever the code, --verbose brings it back with 0 and says when the lock
// was obtained and released; --timeout is --wait under flock's name.
func TestRunConflictExitCode(t *testing.T) {
	t.Parallel()
	ready := filepath.Join(t.TempDir(), "ready")
	e := newEnv(t, sqliteURL(t), "READY="+ready)
	holder := e.start("run", "busy", "--", "sh", "-c", `echo x > "$READY"; sleep 30`)
	waitFile(t, ready, holder)

	r := e.run("run", "-E", "0", "busy", "--", "echo", "ran")
	expect(t, r, 0)
	if r.stdout != "" || r.stderr != "" {
		t.Errorf("-E 0 on a busy lock: stdout %q, stderr %q; want nothing at all", r.stdout, r.stderr)
	}
	r = e.run("run", "--conflict-exit-code", "3", "busy", "--", "echo", "ran")
	expect(t, r, 3, `"busy" is held by`, "not waiting")
	r = e.run("run", "--quiet", "-E", "9", "--timeout", "300ms", "busy", "--", "echo", "ran")
	expect(t, r, 9)
	if r.stderr != "" || r.elapsed < 300*time.Millisecond {
		t.Errorf("--quiet --timeout 300ms: stderr %q after %v; want nothing, after 300ms of waiting", r.stderr, r.elapsed)
	}
	r = e.run("run", "-E", "0", "--wait", "300ms", "busy", "--", "echo", "ran")
	expect(t, r, 0)
	if r.stderr != "" {
		t.Errorf("-E 0 --wait 300ms on a busy lock: stderr %q, want nothing (no wait messages either)", r.stderr)
	}
	r = e.run("run", "-q", "busy", "--", "echo", "ran")
	expect(t, r, 75)
	if r.stderr != "" {
		t.Errorf("-q: stderr %q, want nothing", r.stderr)
	}
	expect(t, e.run("run", "-E", "0", "-v", "busy", "--", "echo", "ran"), 0, `"busy" is held by`)

	r = e.run("run", "-v", "free", "--", "echo", "ran")
	expect(t, r, 0, `dlock: got "free" (fence `, "after waiting", `dlock: released "free" after holding it`)
	if r.stdout != "ran\n" {
		t.Errorf("stdout %q, want the command's", r.stdout)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-E", "256"}, "--conflict-exit-code 256: want an exit status from 0 to 255"},
		{[]string{"-E", "-1"}, "from 0 to 255"},
		{[]string{"--wait", "1s", "--timeout", "2s"}, "--wait and --timeout are one flag"},
		{[]string{"-q", "--quiet"}, "--quiet and -q are one flag"},
		{[]string{"-q", "-v"}, "--quiet and --verbose exclude each other"},
	} {
		r := e.run(append(append([]string{"run"}, c.args...), "x", "--", "true")...)
		expect(t, r, 64, c.want)
	}
}

// TestRunHoldOnly: "dlock run NAME" without a command holds the lock until
// a signal, for a script that runs several commands under it: it prints the
// fence, keeps the lease renewed past its TTL, and on SIGTERM releases the
// lock and exits 0; a lost lock is exit 76.
func TestRunHoldOnly(t *testing.T) {
	t.Parallel()
	url, dir := sqliteURL(t), t.TempDir()
	e := newEnv(t, url)
	p := e.start("run", "--ttl", "1500ms", "--kill-grace", "100ms", "-v", "held")
	var fence string
	for deadline := time.Now().Add(30 * time.Second); fence == ""; {
		fence = strings.TrimSpace(p.stdout.String())
		if time.Now().After(deadline) {
			t.Fatalf("no fence printed:\n%s", p.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := strconv.ParseUint(fence, 10, 64); err != nil {
		t.Fatalf("stdout %q, want the fence alone", fence)
	}
	time.Sleep(2 * time.Second) // past the TTL: renewed
	expect(t, e.run("run", "held", "--", "true"), 75, `"held" is held by`)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	expect(t, p.wait(), 0, `dlock: SIGTERM: released "held" after holding it`)
	r := e.run("run", "-v", "held", "--", "true")
	expect(t, r, 0, "dlock: got \"held\" (fence ")
	if !strings.Contains(r.stderr, fmt.Sprintf("(fence %d)", mustAtoi(t, fence)+1)) {
		t.Errorf("the next holder's fence is not %s+1:\n%s", fence, r.stderr)
	}

	// Lost: the hold ends with 76 and says so.
	p = e.start("run", "--ttl", "1500ms", "--kill-grace", "100ms", "held")
	for deadline := time.Now().Add(30 * time.Second); strings.TrimSpace(p.stdout.String()) == ""; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no fence printed:\n%s", p.stderr.String())
		}
	}
	expect(t, e.run("release", "--force", "held"), 0)
	expect(t, p.wait(), 76, `lost lock "held"`, "no longer held")

	// A script that dies leaves no hold behind: dlock sees its parent end.
	// The script ends once its dlock has printed the fence: a dlock that
	// starts after its parent ended cannot tell (see startParent).
	script := e.start("--backend", url, "run", "--ttl", "30s", "orphan", "--", "sh", "-c",
		`"$0" run --backend "$1" orphan2 > "$2" & while [ ! -s "$2" ]; do sleep 0.05; done; exit 0`, dlockBin, url, filepath.Join(dir, "fence"))
	expect(t, script.wait(), 0)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		r := e.run("inspect", "orphan2")
		if r.code == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the hold of a script that ended is still there 10s later:\n%s", r.stdout)
		}
	}
	if f, _ := os.ReadFile(filepath.Join(dir, "fence")); strings.TrimSpace(string(f)) == "" {
		t.Error("the orphaned hold printed no fence")
	}

	// A script that dies while dlock waits for the lock: the hold, once
	// granted, sees that its parent has ended and ends too.
	holder := e.start("run", "--ttl", "30s", "late")
	for deadline := time.Now().Add(30 * time.Second); strings.TrimSpace(holder.stdout.String()) == ""; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no fence printed:\n%s", holder.stderr.String())
		}
	}
	lateFence := filepath.Join(dir, "late-fence")
	// The script ends once its dlock waits (it said who holds the lock).
	lateStderr := filepath.Join(dir, "late-stderr")
	waiting := e.start("--backend", url, "run", "--ttl", "30s", "late-script", "--", "sh", "-c",
		`"$0" run --backend "$1" --wait 60s late > "$2" 2> "$3" & until grep -q "is held by" "$3" 2>/dev/null; do sleep 0.05; done; exit 0`,
		dlockBin, url, lateFence, lateStderr)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, _ := os.ReadFile(lateStderr); strings.Contains(string(b), "is held by") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the script's dlock did not start waiting within 30s")
		}
	}
	time.Sleep(time.Second) // the script has ended; its dlock waits
	if err := holder.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	expect(t, holder.wait(), 0)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if f, _ := os.ReadFile(lateFence); strings.TrimSpace(string(f)) != "" {
			break // granted
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiting hold was not granted 30s after the holder's release")
		}
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		r := e.run("inspect", "late")
		if r.code == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a hold granted after its script ended is still there 20s later:\n%s", r.stdout)
		}
	}
	expect(t, waiting.wait(), 0)
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRunEnvDefaults: DLOCK_TTL and DLOCK_WAIT give --ttl and --wait their
// defaults; the flags win; a bad value names its variable.
func TestRunEnvDefaults(t *testing.T) {
	t.Parallel()
	ready := filepath.Join(t.TempDir(), "ready")
	url := sqliteURL(t)
	e := newEnv(t, url, "READY="+ready, "DLOCK_WAIT=400ms", "DLOCK_TTL=1500ms")
	holder := e.start("run", "busy", "--", "sh", "-c", `echo x > "$READY"; sleep 30`)
	waitFile(t, ready, holder)
	var locks []lockJSON
	if r := e.run("ls", "--json"); json.Unmarshal([]byte(r.stdout), &locks) != nil || len(locks) != 1 || locks[0].ExpiresInMS > 1500 {
		t.Errorf("DLOCK_TTL=1500ms: ls --json %s", r.stdout)
	}
	r := e.run("run", "busy", "--", "true")
	expect(t, r, 75, "not obtained within 400ms")
	if r.elapsed < 400*time.Millisecond {
		t.Errorf("gave up after %v, want DLOCK_WAIT's 400ms", r.elapsed)
	}
	expect(t, e.run("run", "--wait", "0", "busy", "--", "true"), 75, "not waiting (--wait 0)")
	expect(t, newEnv(t, url, "DLOCK_TTL=30").run("run", "x", "--", "true"), 64, `DLOCK_TTL="30": 30 has no unit`)
	expect(t, newEnv(t, url, "DLOCK_WAIT=soon").run("run", "x", "--", "true"), 64, `DLOCK_WAIT="soon": want a duration`)
}

// TestRunTTLFromTheEnvironmentIsNamedAsSuch: a TTL that DLOCK_TTL gave and
// dlock run refuses (too short, or too short for --kill-grace) is called
// DLOCK_TTL in the message, not a --ttl the command line does not have.
func TestRunTTLFromTheEnvironmentIsNamedAsSuch(t *testing.T) {
	t.Parallel()
	url := sqliteURL(t)
	for _, c := range []struct {
		vars []string
		args []string
		want string
	}{
		{[]string{"DLOCK_TTL=100ms"}, nil, "DLOCK_TTL=100ms is too short for dlock run"},
		{[]string{"DLOCK_TTL=-1m"}, nil, "DLOCK_TTL=-1m0s is not a time to live: give a positive duration, such as DLOCK_TTL=10s"},
		{[]string{"DLOCK_TTL=2s"}, []string{"--kill-grace", "900ms"}, "--kill-grace 900ms does not fit in half of DLOCK_TTL=2s"},
		{[]string{"DLOCK_TTL=2s"}, []string{"--ttl", "100ms"}, "--ttl 100ms is too short for dlock run"},
	} {
		r := newEnv(t, url, c.vars...).run(append(append([]string{"run"}, c.args...), "x", "--", "true")...)
		expect(t, r, 64, c.want)
	}
}

// TestRunWaitAnnouncesNewHolder: a waiter says who holds the lock, and again
// when the holder changes; then it gets the lock.
func TestRunWaitAnnouncesNewHolder(t *testing.T) {
	t.Parallel()
	backend, _ := redisURL(t)
	dir := t.TempDir()
	e := newEnv(t, backend, "DIR="+dir)
	first := e.start("run", "--metadata", "first", "relay", "--", "sh", "-c", `touch "$DIR/1"; sleep 1`)
	waitExists(t, filepath.Join(dir, "1"), first)
	second := e.start("run", "--wait", "20s", "--metadata", "second", "relay", "--", "sh", "-c", `touch "$DIR/2"; sleep 1`)
	third := e.start("run", "--wait", "20s", "--metadata", "third", "relay", "--", "true")
	for _, p := range []*proc{first, second, third} {
		expect(t, p.wait(), 0)
	}
	r := third.res
	if strings.Count(r.stderr, "held by") < 1 {
		t.Errorf("the third waiter did not say who held the lock:\n%s", r.stderr)
	}
	if strings.Contains(r.stderr, "second") && !strings.Contains(r.stderr, "is now held by") {
		t.Errorf("the holder changed without a message:\n%s", r.stderr)
	}
}

// TestRunPlainWaitSaysOnce: a plain waiter on Redis, which dlock puts in
// the name's queue after a moment so that it is not starved, says who holds
// the lock once, and neither "now held by" for the same holder nor a place
// in a queue it did not ask for.
func TestRunPlainWaitSaysOnce(t *testing.T) {
	t.Parallel()
	backend, _ := redisURL(t)
	ready := filepath.Join(t.TempDir(), "ready")
	e := newEnv(t, backend, "READY="+ready)
	holder := e.start("run", "--metadata", "holder", "plain", "--", "sh", "-c", `echo x > "$READY"; sleep 1.5`)
	waitFile(t, ready, holder)
	r := e.run("run", "--wait", "20s", "plain", "--", "true")
	expect(t, r, 0, `"plain" is held by`)
	expect(t, holder.wait(), 0)
	if n := strings.Count(r.stderr, "held by"); n != 1 {
		t.Errorf("the holder was announced %d times, want once:\n%s", n, r.stderr)
	}
	if strings.Contains(r.stderr, "queue") {
		t.Errorf("a plain wait mentions a queue:\n%s", r.stderr)
	}
}

// waitExists waits for a file to exist, even empty.
func waitExists(t *testing.T, path string, p *proc) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(path); err == nil {
			return
		}
		select {
		case <-p.done:
			t.Fatalf("dlock exited (%d) before %s appeared:\n%s", p.res.code, path, p.res.stderr)
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("%s did not appear", path)
}

// TestRunLockLost deletes the lock behind a running dlock run: the command
// is stopped, dlock exits 76, and all of it happens well before the old
// lease could have expired on the store.
func TestRunLockLost(t *testing.T) {
	const ttl = 6 * time.Second
	// With renewals every TTL/3, the store's expiry of a healthy lease is
	// always at least 2/3 TTL away: the command must be gone by then.
	const limit = 2 * ttl / 3
	cases := []struct {
		name   string
		script string // writes its PID to $READY, then runs until stopped
	}{
		{"stops on SIGTERM", `echo $$ > "$READY"; sleep 30`},
		{"ignores SIGTERM", `trap '' TERM; echo $$ > "$READY"; while :; do sleep 0.05; done`},
	}
	backends := []struct {
		name   string
		url    func(t *testing.T) (string, func(t *testing.T, e *env))
		reason string
	}{
		{"sqlite", func(t *testing.T) (string, func(*testing.T, *env)) {
			return sqliteURL(t), func(t *testing.T, e *env) {
				r := e.run("release", "--force", "lost")
				if r.code != 0 || !strings.Contains(r.stdout, `released "lost"`) {
					t.Errorf("release --force: %d\n%s%s", r.code, r.stdout, r.stderr)
				}
			}
		}, "no longer held"},
		{"redis", func(t *testing.T) (string, func(*testing.T, *env)) {
			u, srv := redisURL(t)
			return u, func(t *testing.T, _ *env) {
				if n, err := srv.Client(t).Del(t.Context(), "dlock:{lost}").Result(); err != nil || n != 1 {
					t.Errorf("DEL dlock:{lost} = %d, %v", n, err)
				}
			}
		}, "no longer held"},
	}
	for _, b := range backends {
		for _, c := range cases {
			t.Run(b.name+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				url, deleteLock := b.url(t)
				ready := filepath.Join(t.TempDir(), "ready")
				e := newEnv(t, url, "READY="+ready)
				p := e.start("run", "--ttl", ttl.String(), "--kill-grace", "300ms", "lost", "--", "sh", "-c", c.script)
				pid, err := strconv.Atoi(strings.TrimSpace(waitFile(t, ready, p)))
				if err != nil {
					t.Fatal(err)
				}
				deleted := time.Now()
				deleteLock(t, e)
				r := p.wait()
				gone := time.Since(deleted)
				expect(t, r, 76, `lost lock "lost"`, b.reason, "SIGTERM now, SIGKILL in 300ms")
				if gone > limit {
					t.Errorf("dlock exited %v after the lock was deleted, want under %v", gone, limit)
				}
				if err := syscall.Kill(-pid, 0); !errors.Is(err, syscall.ESRCH) {
					t.Errorf("the command's process group %d is still there after dlock exited: %v", pid, err)
				}
			})
		}
	}
}

// TestRunLockLostStoreHangs: the store stops answering (redis-server
// stopped with SIGSTOP: connections open, no replies) while the command
// runs; the lease runs out, the command is stopped, and dlock exits as soon
// as the command has ended, not after another wait on the store that does
// not answer (it waited 5s, its connect timeout, to release).
func TestRunLockLostStoreHangs(t *testing.T) {
	url, srv := redisURL(t)
	ready := filepath.Join(t.TempDir(), "ready")
	e := newEnv(t, url, "READY="+ready)
	p := e.start("run", "--ttl", "6s", "--kill-grace", "300ms", "hang", "--", "sh", "-c", `echo $$ > "$READY"; sleep 60`)
	waitFile(t, ready, p)
	srv.Pause(t)
	// When the loss is reported, the command gets SIGTERM and ends at once.
	var lostAt time.Time
	for deadline := time.Now().Add(30 * time.Second); lostAt.IsZero(); {
		select {
		case <-p.done:
			t.Fatalf("dlock exited before it reported the loss:\n%s", p.res.stderr)
		case <-time.After(5 * time.Millisecond):
		}
		if strings.Contains(p.stderr.String(), `lost lock "hang"`) {
			lostAt = time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("no loss reported 30s after the store stopped answering:\n%s", p.stderr.String())
		}
	}
	r := p.wait()
	after := time.Since(lostAt)
	expect(t, r, 76, `lost lock "hang": store unreachable`, "killed by SIGTERM after the lock")
	// dlock tries the release for at most 250ms; the bound leaves room for
	// a loaded machine, and is far below the 5s it took before.
	if after > 2500*time.Millisecond {
		t.Errorf("dlock exited %v after it reported the loss, the command already stopped; want at once", after.Round(time.Millisecond))
	}
}

// TestRunHoldStoreHangs: a hold without a command whose store stops
// answering, ended by a signal, tries the release; a second signal cuts
// that short, dlock exits at once with 69 (the lock was not released) and
// does not wait on the store again while it closes.
func TestRunHoldStoreHangs(t *testing.T) {
	url, srv := redisURL(t)
	e := newEnv(t, url)
	p := e.start("run", "--ttl", "30s", "hang")
	for deadline := time.Now().Add(30 * time.Second); strings.TrimSpace(p.stdout.String()) == ""; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no fence printed:\n%s", p.stderr.String())
		}
	}
	srv.Pause(t)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	second := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	r := p.wait()
	expect(t, r, 69, `could not release "hang"; it expires on the store within 30s`)
	if strings.Contains(r.stderr, "dlock: unlock") {
		t.Errorf("the message repeats the library's prefix:\n%s", r.stderr)
	}
	if took := time.Since(second); took > 2*time.Second {
		t.Errorf("dlock exited %v after the second signal, want at once", took.Round(time.Millisecond))
	}
}

// TestRunUsageErrors: every usage error is found before dlock connects to
// the store, so the store here is one that cannot be opened (its directory
// does not exist): a case that reached it would exit 69, not 64.
func TestRunUsageErrors(t *testing.T) {
	e := newEnv(t, "sqlite://"+filepath.Join(t.TempDir(), "missing", "locks.db"))
	expect(t, e.run("run", "x", "--", "true"), 69, "does not exist")
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"run"}, "missing the lock NAME"},
		{[]string{"run", "x", "sh", "-c", "true"}, "put -- between"},
		{[]string{"run", "--", "true"}, "missing the lock NAME"},
		{[]string{"run", "x", "y", "--", "true"}, "one lock NAME"},
		{[]string{"run", "x", "--"}, "no command after --"},
		{[]string{"run", "--nope", "x", "--", "true"}, "unknown flag --nope"},
		{[]string{"run", "--ttl", "soon", "x", "--", "true"}, `--ttl "soon": want a duration such as 500ms, 30s or 5m`},
		{[]string{"run", "--wait", "5", "x", "--", "true"}, `--wait "5": 5 has no unit; write 5s or 5m`},
		{[]string{"run", "--wait", "-1s", "x", "--", "true"}, "negative"},
		{[]string{"run", "--ttl", "10ms", "x", "--", "true"}, "--ttl 10ms is too short for dlock run"},
		{[]string{"run", "--ttl", "10ms", "--kill-grace", "0s", "x", "--", "true"}, "--kill-grace 0s does not fit in half of --ttl 10ms"},
		{[]string{"run", "-n", "x", "--", "true"}, "unknown flag -n: dlock tries once by default (--wait 0)"},
		{[]string{"run", "-w", "5", "x", "--", "true"}, "unknown flag -w: dlock's is --wait DURATION"},
		{[]string{"run", "--fa", "x", "--", "true"}, "did you mean --fair?"},
		{[]string{"run", "-qv", "x", "--", "true"}, "--quiet and --verbose exclude each other"},
		{[]string{"run", "-ttl", "1s", "x", "--", "true"}, "did you mean --ttl? (long flags take two dashes)"},
		{[]string{"run", "--ttl", "x", "--", "true"}, `--ttl "x": want a duration`},
		{[]string{"run", "x", "sh", "-c", "true"}, "put -- between the lock NAME and the command: dlock run x -- sh -c true"},
		{[]string{"run", "--ttl", "NaN", "x", "--", "true"}, `--ttl "NaN": want a duration`},
		{[]string{"run", "--kill-grace", "5s", "x", "--", "true"}, "--kill-grace 5s does not fit in half of --ttl 10s"},
		{[]string{"run", "--ttl", "1s", "--kill-grace", "2s", "x", "--", "true"}, "--kill-grace 2s does not fit in half of --ttl 1s"},
		{[]string{"run", "--ttl", "600ms", "x", "--", "true"}, "--ttl 600ms is too short for dlock run"},
		{[]string{"run", "--ttl", "-5s", "x", "--", "true"}, "--ttl -5s is not a time to live: give a positive duration, such as --ttl 10s"},
		{[]string{"run", "--ttl", "0s", "x", "--", "true"}, "--ttl 0s is not a time to live"},
		{[]string{"run", "--tll", "1s", "x", "--", "true"}, "unknown flag --tll; did you mean --ttl?"},
		{[]string{"run", "--fair=maybe", "x", "--", "true"}, `--fair "maybe": want true or false, or no value`},
		{[]string{"run", "--metadata", strings.Repeat("m", 600), "x", "--", "true"}, "metadata"},
		{[]string{"run", "bad\tname", "--", "true"}, "control character"},
		{[]string{"run", "", "--", "true"}, "name: empty"},
		{[]string{"run", "}x", "--", "true"}, "may not start with '}'"},
		{[]string{"run", strings.Repeat("n", 1000), "--", "true"}, "name: 1000 bytes, over the limit of 255"},
		{[]string{"run", "--metadata", "\xff", "x", "--", "true"}, "--metadata is not valid UTF-8"},
		{[]string{"run", "--metadata", strings.Repeat("m", 513), "x", "--", "true"}, "--metadata is 513 bytes, over the limit of 512"},
		{[]string{"run", "--fair", "--shared", "--semaphore", "2", "x", "--", "true"}, "--shared and --semaphore exclude each other"},
		{[]string{"run", "--shared", "--semaphore", "2", "x", "--", "true"}, "--shared and --semaphore exclude each other"},
		{[]string{"run", "--semaphore", "0", "x", "--", "true"}, "--semaphore 0: want the number of permits, from 1 to 1048576"},
		{[]string{"run", "--semaphore", "x", "--", "true"}, `--semaphore "x": want a whole number`},
		{[]string{"run", "--shared", "--lock-delay", "5s", "x", "--", "true"}, "--lock-delay does not apply to --shared"},
		{[]string{"run", "--semaphore", "3", "--lock-delay", "5s", "x", "--", "true"}, "--lock-delay does not apply to --semaphore"},
		{[]string{"--connect-timeout", "0s", "ls"}, "--connect-timeout must be positive"},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			t.Parallel()
			r := e.run(c.args...)
			expect(t, r, 64, c.want)
			if c.args[0] == "run" && !strings.Contains(r.stderr, "usage: dlock run") {
				t.Errorf("no usage line:\n%s", r.stderr)
			}
		})
	}
}

// TestRunFlockHabits: flock's bare seconds work with --timeout, flock's -c
// is answered with the sh -c that means the same, and flock's flags that
// dlock has no need of say why.
func TestRunFlockHabits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sqliteURL(t))
	for _, secs := range []string{"5", "0.5", "0"} {
		if r := e.run("run", "-v", "--timeout", secs, "x", "--", "true"); r.code != 0 || !strings.Contains(r.stderr, `got "x"`) {
			t.Errorf("--timeout %s: exit %d:\n%s", secs, r.code, r.stderr)
		}
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"run", "x", "-c", "echo 'hi'"}, `dlock run x -- sh -c 'echo '\''hi'\'''`},
		{[]string{"run", "--command", "make all", "x"}, "dlock run x -- sh -c 'make all'"},
		{[]string{"run", "--nonblock", "x", "--", "true"}, "unknown flag --nonblock: dlock tries once by default (--wait 0)"},
		{[]string{"run", "--nb", "x", "--", "true"}, "unknown flag --nb: dlock tries once by default (--wait 0)"},
		{[]string{"run", "--exclusive", "x", "--", "true"}, "unknown flag --exclusive: a plain dlock run is exclusive"},
		{[]string{"run", "-e", "x", "--", "true"}, "unknown flag -e: a plain dlock run is exclusive"},
		{[]string{"run", "--unlock", "x", "--", "true"}, "unknown flag --unlock: the lock is released when dlock run ends"},
		{[]string{"run", "--no-fork", "x", "--", "true"}, "unknown flag --no-fork: dlock runs the command as its child"},
		{[]string{"run", "--timeout", "-5", "x", "--", "true"}, `--timeout "-5": want a duration`},
	}
	for _, c := range cases {
		expect(t, e.run(c.args...), 64, c.want)
	}
}

// TestRunDefaultBackend: with no backend given, run works on a fresh
// machine, in a SQLite file it creates in the state directory.
func TestRunDefaultBackend(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	r := e.run("run", "demo", "--", "sh", "-c", `echo "holding $DLOCK_NAME, fence $DLOCK_FENCE"`)
	expect(t, r, 0)
	if r.stdout != "holding demo, fence 1\n" {
		t.Errorf("stdout %q", r.stdout)
	}
	dir := filepath.Join(e.state, "dlock")
	st, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o700 {
		t.Errorf("%s has mode %v, want 0700", dir, st.Mode().Perm())
	}
	if _, err := os.Stat(filepath.Join(dir, "locks.db")); err != nil {
		t.Error(err)
	}
	r = e.run("run", "demo", "--", "sh", "-c", `echo "$DLOCK_FENCE"`)
	expect(t, r, 0)
	if r.stdout != "2\n" {
		t.Errorf("second fence %q, want 2", r.stdout)
	}
}

// TestRunInteractiveCommand runs dlock on a terminal (script(1) gives it a
// pseudo-terminal): the command gets the terminal's foreground, so it can
// read from it instead of being stopped by SIGTTIN.
func TestRunInteractiveCommand(t *testing.T) {
	t.Parallel()
	script := testserver.RequireBinary(t, "script") // fails under CI=true when missing
	e := newEnv(t, sqliteURL(t))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, script, "-qec", dlockBin+` run tty -- sh -c 'read a; echo "read $a"'`, "/dev/null")
	cmd.Env = e.vars
	cmd.Stdin = strings.NewReader("hello\n")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "read hello") {
		t.Errorf("script: %v\n%s", err, out)
	}
}

// TestRunHoldsUntilBackgroundProcessesEnd: a process the command leaves
// running in its group keeps the lock held; the next holder starts only
// after it has ended, and its fence is only then superseded.
func TestRunHoldsUntilBackgroundProcessesEnd(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		dir := t.TempDir()
		out := filepath.Join(dir, "log")
		e := newEnv(t, backend, "OUT="+out, "DIR="+dir)
		first := e.start("run", "bg", "--", "sh", "-c",
			`(sleep 2; echo "bg $DLOCK_FENCE" >> "$OUT") & touch "$DIR/started"; exit 5`)
		waitExists(t, filepath.Join(dir, "started"), first)
		second := e.start("run", "--wait", "30s", "bg", "--", "sh", "-c", `echo "next $DLOCK_FENCE" >> "$OUT"`)
		r := first.wait()
		expect(t, r, 5, `holding "bg" until they end`)
		if r.elapsed < 2*time.Second {
			t.Errorf("dlock exited after %v, before its background process (2s)", r.elapsed)
		}
		if b, _ := os.ReadFile(out); !strings.HasPrefix(string(b), "bg ") {
			t.Errorf("when dlock exited, the log was %q, want the background process's line", b)
		}
		expect(t, second.wait(), 0)
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "bg ") || !strings.HasPrefix(lines[1], "next ") {
			t.Fatalf("log:\n%s\nwant the background process's line, then the next holder's", b)
		}
		if f0, f1 := mustUint(t, strings.Fields(lines[0])[1]), mustUint(t, strings.Fields(lines[1])[1]); f1 <= f0 {
			t.Errorf("fences %d then %d", f0, f1)
		}
	})
}

// TestRunLockLostStopsBackgroundProcesses: a lock lost while only the
// command's background processes run still stops them.
func TestRunLockLostStopsBackgroundProcesses(t *testing.T) {
	t.Parallel()
	ready := filepath.Join(t.TempDir(), "ready")
	e := newEnv(t, sqliteURL(t), "READY="+ready)
	p := e.start("run", "--ttl", "6s", "--kill-grace", "300ms", "lostbg", "--", "sh", "-c",
		`trap '' TERM; sleep 30 & echo $! > "$READY"; exit 0`)
	pid, err := strconv.Atoi(strings.TrimSpace(waitFile(t, ready, p)))
	if err != nil {
		t.Fatal(err)
	}
	waitStderr(t, p, "until they end")
	if r := e.run("release", "--force", "lostbg"); r.code != 0 {
		t.Fatalf("release --force: %d\n%s", r.code, r.stderr)
	}
	expect(t, p.wait(), 76, `lost lock "lostbg"`)
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		t.Errorf("the background process %d still runs after dlock exited: %v", pid, err)
	}
}

// TestRunContinuesStoppedCommand: a command, or a process of its group,
// that is stopped is continued.
func TestRunContinuesStoppedCommand(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("dlock finds stopped processes in /proc")
	}
	e := newEnv(t, sqliteURL(t))
	r := e.run("run", "stop", "--", "sh", "-c", `kill -STOP $$; echo continued`)
	expect(t, r, 0, "cannot be suspended; continuing it")
	if r.stdout != "continued\n" {
		t.Errorf("stdout %q", r.stdout)
	}
	r = e.run("run", "stop", "--", "sh", "-c", `sh -c 'kill -STOP $$; echo grandchild'; echo done`)
	expect(t, r, 0, "continuing it")
	if r.stdout != "grandchild\ndone\n" {
		t.Errorf("stdout %q", r.stdout)
	}
}

// TestRunEndsCommandThatKeepsStopping: a command that stops again each time
// it is continued is ended, and the lock released.
func TestRunEndsCommandThatKeepsStopping(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("dlock finds stopped processes in /proc")
	}
	e := newEnv(t, sqliteURL(t))
	r := e.run("run", "--kill-grace", "300ms", "stuck", "--", "sh", "-c", `while :; do kill -STOP $$; done`)
	expect(t, r, 128+int(syscall.SIGTERM), "stops again each time it is continued", "SIGTTIN")
	if r.elapsed > 10*time.Second {
		t.Errorf("took %v", r.elapsed)
	}
	expect(t, e.run("run", "stuck", "--", "true"), 0)
}

// TestRunBackgroundTerminalRead: in the foreground of a terminal but with
// stdin not the terminal, the command runs in the background; one that
// reads from the terminal is stopped by SIGTTIN again and again. dlock must
// end it and release the lock, not hold it forever.
func TestRunBackgroundTerminalRead(t *testing.T) {
	t.Parallel()
	script := testserver.RequireBinary(t, "script") // fails under CI=true when missing
	if runtime.GOOS != "linux" {
		t.Skip("dlock finds stopped processes in /proc")
	}
	e := newEnv(t, sqliteURL(t))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, script, "-qec",
		`echo | `+dlockBin+` run --kill-grace 300ms ttin -- sh -c 'read a </dev/tty; echo "read $a"'`, "/dev/null")
	cmd.Env = e.vars
	cmd.Stdin = strings.NewReader("hello\n")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("dlock still ran after 20s:\n%s", out)
	}
	if !strings.Contains(string(out), "stops again each time it is continued") {
		t.Errorf("script: %v\n%s", err, out)
	}
	expect(t, e.run("run", "ttin", "--", "true"), 0) // released
}

// TestRunKilledDlockKillsCommand: when dlock is killed with SIGKILL, its
// command is killed too (Linux's parent death signal).
func TestRunKilledDlockKillsCommand(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("parent death signals are Linux's")
	}
	ready := filepath.Join(t.TempDir(), "ready")
	e := newEnv(t, sqliteURL(t), "READY="+ready)
	p := e.start("run", "orphan", "--", "sh", "-c", `echo $$ > "$READY"; exec sleep 30`)
	pid, err := strconv.Atoi(strings.TrimSpace(waitFile(t, ready, p)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	// Wait until sh has become sleep, so that it is the command, not sh,
	// that is seen to die.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(procStat(pid), "(sleep)") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// Not p.wait() first: it also waits for dlock's stdout and stderr to be
	// closed, which a command left running would hold open.
	deadline = time.Now().Add(10 * time.Second)
	for {
		st := procStat(pid)
		if st == "" || strings.Contains(st, ") Z ") {
			break // gone, or dead and not yet reaped
		}
		if time.Now().After(deadline) {
			t.Fatalf("the command %d still runs 10s after dlock was killed: %s", pid, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	expect(t, p.wait(), 128+int(syscall.SIGKILL))
}

// procStat returns /proc/PID/stat, or "" when the process is gone.
func procStat(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	return string(b)
}
