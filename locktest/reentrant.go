// The contract's cases for re-entry: a reentrant handle, a handle shared by
// goroutines, a shared owner ID, re-entry after a loss.

package locktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

func testReentrant(t *testing.T, s *Store) {
	a, b := client(t, s), client(t, s)
	m := a.Mutex("locktest/reentrant", dlock.Reentrant())
	l1 := lock(t, m)
	l2 := lock(t, m)
	l3, err := m.TryLock(t.Context())
	if err != nil {
		t.Fatalf("TryLock on a reentrant handle that holds the lock: %v", err)
	}
	if l1.Fence() != l2.Fence() || l2.Fence() != l3.Fence() {
		t.Errorf("fences %d, %d, %d: want one grant", l1.Fence(), l2.Fence(), l3.Fence())
	}
	if in, ok := s.NewBackend(t).(driver.Inspector); ok {
		info, held, err := in.Inspect(t.Context(), "locktest/reentrant")
		if err != nil || !held || info.Holds != 3 {
			t.Errorf("Inspect = %+v, %v, %v; want 3 holds", info, held, err)
		}
	}
	other := b.Mutex("locktest/reentrant", dlock.Reentrant())
	unlock(t, l3)
	unlock(t, l1)
	mustBeHeldByOther(t, other)
	if err := l2.Err(); err != nil {
		t.Fatalf("the last hold ended early: %v", err)
	}
	unlock(t, l2)
	l, err := other.TryLock(t.Context())
	if err != nil {
		t.Fatalf("TryLock after the last Unlock: %v", err)
	}
	if l.Fence() <= l1.Fence() {
		t.Errorf("fence %d after %d, want greater", l.Fence(), l1.Fence())
	}
	unlock(t, l)
	// A lease ended by Unlock reports ErrReleased.
	if err := l1.Err(); !errors.Is(err, dlock.ErrReleased) {
		t.Errorf("Err() after Unlock = %v, want ErrReleased", err)
	}
	if err := l1.Unlock(t.Context()); !errors.Is(err, dlock.ErrReleased) {
		t.Errorf("second Unlock = %v, want ErrReleased", err)
	}
}

// testReentrantSharedHandle: goroutines that share a reentrant handle share
// its owner token, so when one goroutine's acquire fails without an answer
// (here: its context ends while the call waits for a connection, before it
// reaches the store), releasing "what it may have taken" would release the
// hold another goroutine of the handle got meanwhile, and a third owner
// would get the lock while that goroutine still holds it.
func testReentrantSharedHandle(t *testing.T, s *Store) {
	const name = "locktest/reentrant-shared"
	p := newProbe(s.NewBackend(t))
	m := clientOn(t, p.backend()).Mutex(name, dlock.Reentrant())
	other := client(t, s).Mutex(name)

	ctx, cancel := context.WithCancel(stalling(t.Context()))
	failed := make(chan error, 1)
	go func() {
		_, err := m.TryLock(ctx)
		failed <- err
	}()
	p.waitStalled(1)
	held := lock(t, m) // another goroutine of the handle gets the lock
	cancel()
	if err := <-failed; err == nil {
		t.Fatal("TryLock whose call never reached the store succeeded")
	}
	// Whatever the failed call leaves to do in the background, the holder
	// keeps the lock.
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
		mustBeHeldByOther(t, other)
		time.Sleep(20 * time.Millisecond)
	}
	if err := held.Err(); err != nil {
		t.Fatalf("the holder's lease ended: %v", err)
	}
	unlock(t, held)
	l, err := other.TryLock(t.Context())
	if err != nil {
		t.Fatalf("TryLock after the holder's Unlock: %v", err)
	}
	unlock(t, l)
	if left := s.Leftovers(t, name); len(left) > 0 {
		t.Errorf("left on the store: %v", left)
	}
}

func testNotReentrantWaits(t *testing.T, s *Store) {
	m := client(t, s).Mutex("locktest/notreentrant")
	held := lock(t, m)
	if _, err := m.TryLock(t.Context()); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("second TryLock on a non-reentrant handle = %v, want ErrNotObtained", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if _, err := m.Lock(ctx); !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second Lock on a non-reentrant handle = %v, want ErrNotObtained and DeadlineExceeded", err)
	}
	unlock(t, held)
	unlock(t, lock(t, m))
}

func testSharedOwnerID(t *testing.T, s *Store) {
	a, b, other := client(t, s), client(t, s), client(t, s)
	const name = "locktest/ownerid"
	opts := []dlock.Option{dlock.WithOwnerID("job-7"), dlock.Reentrant()}
	first := lock(t, a.Mutex(name, opts...))
	// Another handle, in another Client, with the same owner ID is the same
	// owner: it enters at once, into the same grant.
	second, err := b.Mutex(name, opts...).TryLock(t.Context())
	if err != nil {
		t.Fatalf("TryLock with the holder's owner ID: %v", err)
	}
	if second.Fence() != first.Fence() {
		t.Errorf("fences %d and %d, want the same grant", first.Fence(), second.Fence())
	}
	mustBeHeldByOther(t, other.Mutex(name))
	unlock(t, first)
	mustBeHeldByOther(t, other.Mutex(name))
	unlock(t, second)
	l, err := other.Mutex(name).TryLock(t.Context())
	if err != nil {
		t.Fatalf("TryLock after both holds were released: %v", err)
	}
	unlock(t, l)
}

// A holder that shares the owner ID with a shorter TTL must not cut the
// store-side TTL of the other's lease.
func testSharedOwnerShorterTTL(t *testing.T, s *Store) {
	a, b, other := client(t, s), client(t, s), client(t, s)
	const name = "locktest/ownerttl"
	long := lock(t, a.Mutex(name, dlock.WithOwnerID("job-8"), dlock.Reentrant(), dlock.WithTTL(3*time.Second)))
	short := lock(t, b.Mutex(name, dlock.WithOwnerID("job-8"), dlock.Reentrant(), dlock.WithTTL(dlock.MinTTL)))
	// A 50 ms lease may run out before its Unlock on a loaded machine;
	// what is checked is that its end does not end the long one.
	if err := short.Unlock(t.Context()); err != nil && (short.Err() == nil || !errors.Is(err, dlock.ErrNotHeld)) {
		t.Fatalf("Unlock of the short lease: %v", err)
	}
	time.Sleep(4 * dlock.MinTTL)
	mustBeHeldByOther(t, other.Mutex(name))
	if err := long.Err(); err != nil {
		t.Fatalf("long lease ended: %v", err)
	}
	unlock(t, long)
}

// A reentrant handle whose grant vanished from the store gets a fresh grant on
// its next Lock, not a share of the vanished one.
func testReentryAfterLoss(t *testing.T, s *Store) {
	a, other := client(t, s), client(t, s)
	const name = "locktest/reentrylost"
	m := a.Mutex(name, dlock.Reentrant(), dlock.WithTTL(ttl))
	first := lock(t, m)
	s.Delete(t, name)
	second := lock(t, m)
	if second.Fence() <= first.Fence() {
		t.Errorf("fence %d after the grant vanished, want more than %d", second.Fence(), first.Fence())
	}
	if r := lostReason(t, first.Err()); r != dlock.LostMissing {
		t.Errorf("first lease: reason %v, want %v", r, dlock.LostMissing)
	}
	if err := first.Unlock(t.Context()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Unlock of the vanished lease = %v, want ErrNotHeld", err)
	}
	mustBeHeldByOther(t, other.Mutex(name))
	if err := second.Err(); err != nil {
		t.Fatalf("fresh lease ended: %v", err)
	}
	unlock(t, second)
}

// Unlock of an expired lease of a reentrant handle must not release the
// handle's newer grant, which carries the same token.
func testStaleReentrantUnlock(t *testing.T, s *Store) {
	a, other := client(t, s), client(t, s)
	const name = "locktest/stalereentrant"
	m := a.Mutex(name, dlock.Reentrant(), dlock.WithTTL(ttl), dlock.WithAutoRenew(false))
	old := lock(t, m)
	waitDone(t, old, endWait)
	time.Sleep(ttl / 2) // the store lets it go too
	fresh := lock(t, m)
	if err := old.Unlock(t.Context()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Unlock of the expired lease = %v, want ErrNotHeld", err)
	}
	mustBeHeldByOther(t, other.Mutex(name))
	if err := fresh.Err(); err != nil {
		t.Fatalf("fresh lease ended: %v", err)
	}
	unlock(t, fresh)
}
