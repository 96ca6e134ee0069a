package sqllock_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/sqllock"
)

// TestObserveUnannouncedRelease: a SQLite file shared with a process
// whose releases send no wake-up (one using sqllock.New, or one on another
// machine: docs/LOCK-KINDS.md says Observe "reads on that schedule
// throughout" there). A waiting Mutex.Lock on the observer's Client still
// polls and takes the lock within a few seconds of the resignation; Observe
// must see the resignation about as soon, not only when the leader's TTL
// (as last read) has run out.
func TestObserveUnannouncedRelease(t *testing.T) {
	path := filepath.Join(t.TempDir(), "locks.db")
	observer := dlock.New(sqllock.NewSQLite(openSQLite(t, path)))
	defer observer.Close()
	leader := dlock.New(sqllock.New(openSQLite(t, path), sqllock.SQLite), dlock.WithTTL(30*time.Second))
	defer leader.Close()

	ld, err := leader.Election("e").Campaign(t.Context(), "a")
	if err != nil {
		t.Fatal(err)
	}
	seen, err := observer.Election("e").Observe(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got := <-seen; got.Fence != ld.Fence() {
		t.Fatalf("first observed %+v, want the leader", got)
	}
	time.Sleep(200 * time.Millisecond)
	if err := ld.Resign(t.Context()); err != nil {
		t.Fatal(err)
	}
	resigned := time.Now()
	select {
	case got := <-seen:
		if got.Fence != 0 {
			t.Fatalf("observed %+v after the resignation, want no leader", got)
		}
		t.Logf("resignation observed after %v", time.Since(resigned))
	case <-time.After(5 * time.Second):
		t.Fatalf("resignation not observed within 5s (the leader's TTL is 30s)")
	}
}

// TestWaiterUnannouncedRelease is the control: a waiter in the same
// setting takes the lock within a few seconds (it polls).
func TestWaiterUnannouncedRelease(t *testing.T) {
	path := filepath.Join(t.TempDir(), "locks.db")
	waiter := dlock.New(sqllock.NewSQLite(openSQLite(t, path)))
	defer waiter.Close()
	holder := dlock.New(sqllock.New(openSQLite(t, path), sqllock.SQLite), dlock.WithTTL(30*time.Second))
	defer holder.Close()
	l, err := holder.Mutex("m").Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l2, err := waiter.Mutex("m").Lock(t.Context())
		if err == nil {
			_ = l2.Unlock(t.Context())
		}
		got <- err
	}()
	time.Sleep(200 * time.Millisecond)
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("waiter took the lock %v after the release", time.Since(released))
	case <-time.After(5 * time.Second):
		t.Fatal("waiter did not take the lock within 5s")
	}
}
