package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRunWaitSaysFreeLockIsKeptForEarlierWaiter: on SQLite a plain waiter
// that starved claims the lock's next grant; a later plain waiter that finds
// the lock free but claimed is told so, not that "a writer is waiting" for
// readers that do not exist. The earlier waiter is stopped while the holder
// lets go, so that its claim keeps the free lock from the later one.
func TestRunWaitSaysFreeLockIsKeptForEarlierWaiter(t *testing.T) {
	t.Parallel()
	const kept = `free, but kept for a waiter ahead of this one (owner `
	for attempt := 1; ; attempt++ {
		dir := t.TempDir()
		e := newEnv(t, sqliteURL(t), "DIR="+dir)
		holder := e.start("run", "x", "--", "sh", "-c", `touch "$DIR/held"; while [ ! -e "$DIR/go" ]; do sleep 0.05; done`)
		waitExists(t, filepath.Join(dir, "held"), holder)
		first := e.start("run", "--wait", "1m", "x", "--", "true")
		waitStderr(t, first, `"x" is held by`)
		time.Sleep(300 * time.Millisecond) // it starves, and claims the next grant
		later := e.start("run", "--wait", "1m", "x", "--", "true")
		waitStderr(t, later, `"x" is held by`)
		if err := first.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		expect(t, holder.wait(), 0)
		r := later.wait()
		_ = first.cmd.Process.Signal(syscall.SIGCONT)
		expect(t, first.wait(), 0)
		expect(t, r, 0)
		if strings.Contains(r.stderr, "writer") || strings.Contains(r.stderr, "readers") {
			t.Fatalf("a plain waiter speaks of writers and readers:\n%s", r.stderr)
		}
		if strings.Contains(r.stderr, kept) {
			return
		}
		// The claim lapsed before the later waiter looked: try again.
		if attempt == 3 {
			t.Fatalf("in %d attempts the later waiter never said the lock was kept for the earlier one:\n%s", attempt, r.stderr)
		}
	}
}
