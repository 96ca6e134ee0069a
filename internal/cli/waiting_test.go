package cli_test

import (
	"database/sql"
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
// lets go, so that its claim keeps the free lock from the later one (and
// between two of its writes: see stopBetweenWrites).
func TestRunWaitSaysFreeLockIsKeptForEarlierWaiter(t *testing.T) {
	t.Parallel()
	const kept = `free, but kept for a waiter ahead of this one (owner `
	for attempt := 1; ; attempt++ {
		dir := t.TempDir()
		url := sqliteURL(t)
		e := newEnv(t, url, "DIR="+dir)
		holder := e.start("run", "x", "--", "sh", "-c", `touch "$DIR/held"; while [ ! -e "$DIR/go" ]; do sleep 0.05; done`)
		waitExists(t, filepath.Join(dir, "held"), holder)
		first := e.start("run", "--wait", "1m", "x", "--", "true")
		waitStderr(t, first, `"x" is held by`)
		time.Sleep(300 * time.Millisecond) // it starves, and claims the next grant
		later := e.start("run", "--wait", "1m", "x", "--", "true")
		waitStderr(t, later, `"x" is held by`)
		stopBetweenWrites(t, first, strings.TrimPrefix(url, "sqlite://"))
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

// stopBetweenWrites stops p with SIGSTOP at a moment when it holds no write
// transaction on the SQLite file at path. A process stopped in the middle
// of a write keeps the file's write lock, and every other process's writes
// wait until it goes on (docs/SQL.md); so after each stop, one write
// transaction of the test's own must get through, else p goes on for a
// moment and is stopped again.
func stopBetweenWrites(t *testing.T, p *proc, path string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(2000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	for i := 0; ; i++ {
		if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		_, err := db.Exec("BEGIN IMMEDIATE")
		if err == nil {
			if _, err := db.Exec("COMMIT"); err != nil {
				t.Fatal(err)
			}
			return
		}
		if i == 20 {
			t.Fatalf("the file's write lock stayed taken in %d stops of %s: %v", i+1, p.cmd, err)
		}
		if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRunWaitSaysWaitingWriterOnce: a reader kept out by a writer that
// waits for the readers says so once, not "now a writer is waiting" each
// time the writer tries again: the writer's owner string names the second
// of its latest attempt, and a new second is not a new writer.
func TestRunWaitSaysWaitingWriterOnce(t *testing.T) {
	t.Parallel()
	u, _ := redisURL(t)
	dir := t.TempDir()
	e := newEnv(t, u, "DIR="+dir)
	r1 := hold(t, e, dir, "r1", true, "run", "--shared", "book")
	w := hold(t, e, dir, "w", false, "run", "--wait", "60s", "book")
	waitStderr(t, w.proc, `"book": 1 reader holds it`)
	res := e.run("run", "--shared", "--wait", "3s", "book", "--", "true")
	if res.code != 75 {
		t.Fatalf("the reader behind the writer: exit %d, want 75; stderr:\n%s", res.code, res.stderr)
	}
	if n := strings.Count(res.stderr, "a writer is waiting"); n != 2 || strings.Contains(res.stderr, "now a writer") {
		t.Errorf("the reader's messages name the waiting writer %d times (want 2: waiting, not obtained):\n%s", n, res.stderr)
	}
	r1.let(t)
	w.running(t)
	w.let(t)
}
