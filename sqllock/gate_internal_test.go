package sqllock

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// gateOn returns the write gate of a new SQLiteBackend on the file at path.
func gateOn(t *testing.T, path string) *writeGate {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	g := NewSQLite(db).gate
	if g == nil {
		t.Fatal("a SQLiteBackend on a file has no write gate")
	}
	return g
}

// entered enters g on a goroutine and reports on the channel when it has.
func entered(ctx context.Context, g *writeGate) <-chan func() {
	c := make(chan func(), 1)
	go func() { c <- g.enter(ctx, false) }()
	return c
}

// TestWriteGateWaitsAcrossBackends checks that two Backends on one file
// (two open files, as two processes have) exclude each other through the
// gate, and that the waiter goes in once the holder leaves.
func TestWriteGateWaitsAcrossBackends(t *testing.T) {
	noLeaks(t)
	path := filepath.Join(t.TempDir(), "locks.db")
	a, b := gateOn(t, path), gateOn(t, path)
	// A wait that gives up goes in without the gate (TestWriteGateGivesUp):
	// here no wait may, however slow the machine.
	a.maxWait, b.maxWait = time.Hour, time.Hour

	leaveA := a.enter(t.Context(), false)
	if a.f == nil {
		t.Fatal("the gate opened no file")
	}
	if _, err := os.Stat(path + wakeDirSuffix + "/" + gateFile); err != nil {
		t.Fatalf("gate file: %v", err)
	}
	waiter := entered(t.Context(), b)
	select {
	case <-waiter:
		t.Fatal("the second Backend entered while the first held the gate")
	case <-time.After(100 * time.Millisecond):
	}
	leaveA()
	select {
	case leaveB := <-waiter:
		if b.f == nil {
			t.Fatal("the second Backend went in without the gate")
		}
		// b holds it now: a must wait in turn.
		again := entered(t.Context(), a)
		select {
		case <-again:
			t.Fatal("the first Backend entered while the second held the gate")
		case <-time.After(100 * time.Millisecond):
		}
		leaveB()
		(<-again)()
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter did not go in after the holder left")
	}
}

// TestWriteGateGivesUp checks that a wait that ends with its context lets
// the operation go without the gate; that the Backend's next operations
// skip the gate while that wait goes on (a holder stopped between two
// statements would otherwise cost each of them a wait); and that the
// abandoned wait, once it has the flock, lets go of it and of the
// Backend's turn, after which the gate works again.
func TestWriteGateGivesUp(t *testing.T) {
	noLeaks(t)
	path := filepath.Join(t.TempDir(), "locks.db")
	a, b := gateOn(t, path), gateOn(t, path)
	leaveA := a.enter(t.Context(), false)

	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	b.enter(ctx, false)() // without the gate: leaving does nothing
	if waited := time.Since(start); waited > 2*time.Second {
		t.Fatalf("a wait with a 50ms context returned after %v", waited)
	}
	if !b.stalled.Load() {
		t.Fatal("an abandoned wait left the gate in use")
	}
	// Skips the gate at once: were it to wait for the gate, it would wait
	// until a leaves.
	b.maxWait = time.Hour
	start = time.Now()
	b.enter(t.Context(), false)()
	if waited := time.Since(start); waited > 10*time.Second {
		t.Errorf("an operation behind an abandoned wait waited %v", waited)
	}
	b.maxWait = maxGateWait
	if lockFileNow(b.f) {
		t.Fatal("b took the flock while a held it")
	}

	leaveA() // the abandoned wait takes the flock and lets go of it
	deadline := time.Now().Add(5 * time.Second)
	for b.stalled.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the abandoned wait did not end after a left")
		}
		time.Sleep(time.Millisecond)
	}
	leaveB := b.enter(t.Context(), false)
	if lockFileNow(a.f) {
		t.Fatal("a took the flock while b held the gate")
	}
	leaveB()
	if !lockFileNow(a.f) {
		t.Fatal("the flock stayed taken after b left")
	}
	_ = unlockFile(a.f)
}

// TestWriteGateBudget checks that a wait for the gate gives up after half
// the time left to its context when that is less than the gate's bound.
func TestWriteGateBudget(t *testing.T) {
	noLeaks(t)
	path := filepath.Join(t.TempDir(), "locks.db")
	a, b := gateOn(t, path), gateOn(t, path)
	leaveA := a.enter(t.Context(), false)
	b.maxWait = time.Hour
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	b.enter(ctx, false)()
	if ctx.Err() != nil {
		t.Error("the wait ran until its context ended, not half of it")
	}
	leaveA()
	for b.stalled.Load() {
		time.Sleep(time.Millisecond)
	}
}

// TestWriteGateOff checks that an in-memory database, and a directory
// that others may write, leave the operations without a gate.
func TestWriteGateOff(t *testing.T) {
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	g := NewSQLite(db).gate
	g.enter(t.Context(), false)()
	if !g.off || g.f != nil {
		t.Errorf("in memory: off=%v file=%v, want the gate off", g.off, g.f)
	}

	path := filepath.Join(t.TempDir(), "locks.db")
	if err := os.Mkdir(path+wakeDirSuffix, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path+wakeDirSuffix, 0o777); err != nil {
		t.Fatal(err)
	}
	g = gateOn(t, path)
	g.enter(t.Context(), false)()
	if !g.off || g.f != nil {
		t.Errorf("directory writable by others: off=%v file=%v, want the gate off", g.off, g.f)
	}
}

// noLeaks checks, after the test's clean-ups (which close its databases),
// that it left no goroutine behind.
func noLeaks(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
}

// TestWriteGateLetsHoldersGoFirst checks the turn of a Backend's
// operations at its write gate: a holder's operation (urgent) that comes
// while others wait goes before them, and one that gives up leaves the
// turn to the next.
func TestWriteGateLetsHoldersGoFirst(t *testing.T) {
	noLeaks(t)
	var s turnstile
	ctx := t.Context()
	waiting := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			s.mu.Lock()
			k := len(s.urgent) + len(s.normal)
			s.mu.Unlock()
			if k == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d waiting, want %d", k, n)
			}
		}
	}
	if !s.enter(ctx, false, nil) {
		t.Fatal("an open turnstile kept a caller out")
	}
	order := make(chan string, 3)
	goEnter := func(ctx context.Context, what string, urgent bool) {
		go func() {
			if s.enter(ctx, urgent, nil) {
				order <- what
				s.leave()
				return
			}
			order <- what + " gave up"
		}()
	}
	goEnter(ctx, "waiter", false)
	waiting(1)
	cut, cancel := context.WithCancel(ctx)
	goEnter(cut, "cut holder", true)
	waiting(2)
	goEnter(ctx, "holder", true)
	waiting(3)
	cancel()
	if got := <-order; got != "cut holder gave up" {
		t.Fatalf("first out: %q, want the cancelled one giving up", got)
	}
	s.leave()
	if a, b := <-order, <-order; a != "holder" || b != "waiter" {
		t.Fatalf("turns: %q, %q; want the holder's operation, then the waiter's", a, b)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held || len(s.urgent)+len(s.normal) > 0 {
		t.Fatalf("after everyone left: held %v, %d waiting", s.held, len(s.urgent)+len(s.normal))
	}
}
