//go:build linux

package cli_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRunTakesOverDeadHolder: a dlock run killed with SIGKILL leaves its
// lock on the store for the TTL; a dlock of the same host sees that the
// holder's process has ended and says so, and with --take-over-dead takes
// the lock over at once, as flock would (trying once, or while it waits); a
// live holder is never taken over.
func TestRunTakesOverDeadHolder(t *testing.T) {
	t.Parallel()
	backends := map[string]func(t *testing.T) string{
		"sqlite": func(t *testing.T) string { return sqliteURL(t) },
		"redis":  func(t *testing.T) string { u, _ := redisURL(t); return u },
	}
	for name, mk := range backends {
		t.Run(name, func(t *testing.T) {
			ready := filepath.Join(t.TempDir(), "ready")
			e := newEnv(t, mk(t), "READY="+ready)
			for i, wait := range []string{"0", "20s"} {
				_ = os.Remove(ready)
				// exec: the command's own process, which dies with dlock
				// (its parent death signal), holds the output pipes.
				holder := e.start("run", "--ttl", "30s", "crash", "--", "sh", "-c", `echo x > "$READY"; exec sleep 60`)
				waitFile(t, ready, holder)
				if i == 0 {
					// Alive: not taken over.
					expect(t, e.run("run", "--take-over-dead", "crash", "--", "true"), 75, `"crash" is held by`)
				}
				if err := holder.cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				holder.wait()
				if i == 0 {
					// Without the flag: said, not done.
					expect(t, e.run("run", "crash", "--", "true"), 75, "its process has ended on this host (--take-over-dead")
				}
				start := time.Now()
				r := e.run("run", "--take-over-dead", "--wait", wait, "crash", "--", "true")
				expect(t, r, 0, `whose process has ended on this host; took its lock over`)
				if took := time.Since(start); took > 10*time.Second {
					t.Errorf("--wait %s: took the lock over after %v, not at once (the TTL is 30s)", wait, took)
				}
				if strings.Count(r.stderr, "took its lock over") != 1 {
					t.Errorf("--wait %s: took over more than once:\n%s", wait, r.stderr)
				}
			}
		})
	}
}

// TestRunWaiterHearsHolderDied: a waiting dlock run whose holder, a process
// of this host, is killed says that the holder has ended (its lease would
// keep the lock for a minute more), and with --take-over-dead takes the
// lock over at once, with no new answer from the store to prompt it.
func TestRunWaiterHearsHolderDied(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		for _, takeOver := range []bool{false, true} {
			name := fmt.Sprintf("crash-%t", takeOver)
			ready := filepath.Join(t.TempDir(), "ready")
			e := newEnv(t, backend, "READY="+ready)
			holder := e.start("run", "--ttl", "1m", name, "--", "sh", "-c", `echo x > "$READY"; exec sleep 120`)
			waitFile(t, ready, holder)
			args := []string{"run", "--wait", "5m", name, "--", "true"}
			if takeOver {
				args = append([]string{"run", "--take-over-dead"}, args[1:]...)
			}
			waiter := e.start(args...)
			waitStderr(t, waiter, fmt.Sprintf("%q is held by", name))
			if err := holder.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			holder.wait()
			if !takeOver {
				waitStderr(t, waiter, fmt.Sprintf("%q: its holder's process has ended on this host; its lock stays until its lease expires (--take-over-dead", name))
				continue
			}
			start := time.Now()
			r := waiter.wait()
			expect(t, r, 0, `whose process has ended on this host; took its lock over`)
			if took := time.Since(start); took > 30*time.Second {
				t.Errorf("took the lock over after %v, not at once (the TTL is 1m)", took)
			}
		}
	})
}

// TestRunTakeOverSaysNewFence: the message of a takeover gives the fence
// of the lock taken, the one the command gets in DLOCK_FENCE, not the dead
// holder's.
func TestRunTakeOverSaysNewFence(t *testing.T) {
	t.Parallel()
	ready := filepath.Join(t.TempDir(), "ready")
	e := newEnv(t, sqliteURL(t), "READY="+ready)
	for _, wait := range []string{"0", "20s"} {
		_ = os.Remove(ready)
		holder := e.start("run", "--ttl", "1m", "crash", "--", "sh", "-c", `echo x > "$READY"; exec sleep 120`)
		waitFile(t, ready, holder)
		if err := holder.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		holder.wait()
		r := e.run("run", "--take-over-dead", "--wait", wait, "crash", "--", "sh", "-c", `echo "$DLOCK_FENCE"`)
		expect(t, r, 0, fmt.Sprintf("took its lock over (fence %s)\n", strings.TrimSpace(r.stdout)))
	}
}
