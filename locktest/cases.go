package locktest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// ttl is the lease TTL of the cases that depend on time.
const ttl = 600 * time.Millisecond

func testMutualExclusion(t *testing.T, s *Store) {
	const clients, workers, rounds = 3, 4, 20
	var inside, grants atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, clients*workers)
	for range clients {
		c := client(t, s)
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				m := c.Mutex("locktest/exclusion")
				for range rounds {
					l, err := m.Lock(t.Context())
					if err != nil {
						errs <- err
						return
					}
					if !inside.CompareAndSwap(0, 1) {
						errs <- errors.New("two holders inside the critical section at once")
					}
					grants.Add(1)
					time.Sleep(100 * time.Microsecond)
					inside.Store(0)
					if err := l.Unlock(t.Context()); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got, want := grants.Load(), int32(clients*workers*rounds); got != want {
		t.Errorf("%d grants, want %d", got, want)
	}
}

func testFencesIncrease(t *testing.T, s *Store) {
	a, b := client(t, s), client(t, s)
	var last uint64
	for i := range 1000 {
		c := a
		if i%2 == 1 {
			c = b
		}
		l, err := c.Mutex("locktest/fences").TryLock(t.Context())
		if err != nil {
			t.Fatalf("grant %d: %v", i, err)
		}
		if l.Fence() <= last {
			t.Fatalf("grant %d: fence %d after %d, want strictly greater", i, l.Fence(), last)
		}
		last = l.Fence()
		unlock(t, l)
	}
}

func testHolderReported(t *testing.T, s *Store) {
	a, b := client(t, s), client(t, s)
	held := lock(t, a.Mutex("locktest/holder", dlock.WithMetadata("nightly report #7")))
	if !strings.HasSuffix(held.Owner(), "|nightly report #7") {
		t.Errorf("Owner() = %q, want the metadata at its end", held.Owner())
	}
	_, err := b.Mutex("locktest/holder").TryLock(t.Context())
	var no *dlock.NotObtainedError
	if !errors.As(err, &no) || !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock = %v, want a *NotObtainedError", err)
	}
	if no.Holder != held.Owner() {
		t.Errorf("Holder = %q, want %q", no.Holder, held.Owner())
	}
	if no.HolderTTL <= 0 || no.HolderTTL > dlock.DefaultTTL {
		t.Errorf("HolderTTL = %v, want in (0, %v]", no.HolderTTL, dlock.DefaultTTL)
	}
	unlock(t, held)
}

func testNonOwnerRefused(t *testing.T, s *Store) {
	a := client(t, s)
	held := lock(t, a.Mutex("locktest/nonowner"))
	other := s.NewBackend(t)
	ctx := t.Context()
	const stranger = "00000000000000000000000000000000"
	if res, err := other.Release(ctx, "locktest/nonowner", stranger); err != nil || res.Held {
		t.Errorf("Release by a non-owner = %+v, %v; want not held", res, err)
	}
	if ok, err := other.Renew(ctx, "locktest/nonowner", stranger, time.Minute); err != nil || ok {
		t.Errorf("Renew by a non-owner = %v, %v; want false", ok, err)
	}
	res, err := other.Acquire(ctx, driver.AcquireRequest{Key: "locktest/nonowner", Token: stranger, Owner: "x", TTL: time.Minute, Reentrant: true})
	if err != nil || res.Acquired {
		t.Errorf("Acquire by a non-owner = %+v, %v; want not acquired", res, err)
	}
	if err := held.Err(); err != nil {
		t.Fatalf("holder's lease ended: %v", err)
	}
	mustBeHeldByOther(t, client(t, s).Mutex("locktest/nonowner"))
	unlock(t, held)
}

func testExpiryLetsAnotherIn(t *testing.T, s *Store) {
	a, b := client(t, s), client(t, s)
	first := lock(t, a.Mutex("locktest/expiry", dlock.WithTTL(ttl), dlock.WithAutoRenew(false),
		dlock.WithSafetyMargin(ttl/4)))
	second := lock(t, b.Mutex("locktest/expiry", dlock.WithRetry(dlock.ExponentialBackoff(10*time.Millisecond, 50*time.Millisecond))))
	// The first holder must have been told before the store let anyone in.
	select {
	case <-first.Done():
	default:
		t.Fatal("a second owner got the lock while the first lease was still shown as held")
	}
	if r := lostReason(t, first.Err()); r != dlock.LostExpired {
		t.Errorf("reason = %v, want %v", r, dlock.LostExpired)
	}
	if second.Fence() <= first.Fence() {
		t.Errorf("fence %d after %d, want greater", second.Fence(), first.Fence())
	}
	if err := first.Unlock(t.Context()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Unlock of the expired lease = %v, want ErrNotHeld", err)
	}
	unlock(t, second)
}

func testAutoRenewKeepsLease(t *testing.T, s *Store) {
	a, b := client(t, s), client(t, s)
	held := lock(t, a.Mutex("locktest/renew", dlock.WithTTL(ttl)))
	other := b.Mutex("locktest/renew")
	end := time.Now().Add(5 * ttl)
	for time.Now().Before(end) {
		mustBeHeldByOther(t, other)
		if err := held.Err(); err != nil {
			t.Fatalf("lease ended while auto-renewed: %v", err)
		}
		time.Sleep(ttl / 6)
	}
	if d := time.Until(held.Deadline()); d <= 0 || d > ttl {
		t.Errorf("Deadline() is %v away, want within (0, %v]", d, ttl)
	}
	unlock(t, held)
	l, err := other.TryLock(t.Context())
	if err != nil {
		t.Fatalf("TryLock after Unlock: %v", err)
	}
	unlock(t, l)
}

func testManualRefresh(t *testing.T, s *Store) {
	a, b := client(t, s), client(t, s)
	held := lock(t, a.Mutex("locktest/refresh", dlock.WithTTL(ttl), dlock.WithAutoRenew(false)))
	for range 6 {
		time.Sleep(ttl / 4)
		before := held.Deadline()
		if err := held.Refresh(t.Context()); err != nil {
			t.Fatalf("Refresh: %v", err)
		}
		if !held.Deadline().After(before) {
			t.Fatalf("Refresh did not move the deadline on")
		}
	}
	mustBeHeldByOther(t, b.Mutex("locktest/refresh"))
	waitDone(t, held, 2*ttl)
	if r := lostReason(t, held.Err()); r != dlock.LostExpired {
		t.Errorf("reason = %v, want %v", r, dlock.LostExpired)
	}
	if err := held.Refresh(t.Context()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Refresh after loss = %v, want ErrNotHeld", err)
	}
}

func testDeletedBehindHolder(t *testing.T, s *Store) {
	a := client(t, s)
	held := lock(t, a.Mutex("locktest/deleted", dlock.WithTTL(ttl)))
	ctx := held.Context()
	s.Delete(t, "locktest/deleted")
	// The next renewal, at most TTL/3 away, finds the token gone.
	took := waitDone(t, held, ttl/3+ttl/4)
	if r := lostReason(t, held.Err()); r != dlock.LostMissing {
		t.Errorf("reason = %v, want %v", r, dlock.LostMissing)
	}
	if ctx.Err() == nil || !errors.Is(context.Cause(ctx), dlock.ErrLost) {
		t.Errorf("Context() not cancelled with the loss: err %v, cause %v", ctx.Err(), context.Cause(ctx))
	}
	t.Logf("loss noticed %v after the delete", took)
}

func testStoreKilled(t *testing.T, s *Store) {
	a := client(t, s)
	held := lock(t, a.Mutex("locktest/killed", dlock.WithTTL(ttl)))
	ctx := held.Context()
	s.Kill(t)
	select {
	case <-ctx.Done():
	case <-time.After(2 * ttl):
		t.Fatalf("Context() not cancelled %v after the store died", 2*ttl)
	}
	now := time.Now()
	if deadline := held.Deadline(); !now.Before(deadline) {
		t.Errorf("Context() cancelled %v after Deadline()", now.Sub(deadline))
	}
	if r := lostReason(t, held.Err()); r != dlock.LostUnreachable {
		t.Errorf("reason = %v, want %v", r, dlock.LostUnreachable)
	}
	if err := held.Unlock(t.Context()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Unlock after loss = %v, want ErrNotHeld", err)
	}
}

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
	unlock(t, short)
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
	waitDone(t, old, 2*ttl)
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

func testWokenByRelease(t *testing.T, s *Store) {
	a, b := client(t, s), client(t, s)
	held := lock(t, a.Mutex("locktest/woken", dlock.WithTTL(time.Minute)))
	retry := dlock.ExponentialBackoff(10*time.Millisecond, 50*time.Millisecond)
	if _, ok := s.NewBackend(t).(driver.Notifier); ok {
		// With notifications the waiter must not depend on polling at all:
		// left to its retry schedule or the holder's TTL it would wait a minute.
		retry = dlock.ExponentialBackoff(time.Hour, time.Hour)
	}
	got := make(chan *dlock.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		l, err := b.Mutex("locktest/woken", dlock.WithRetry(retry)).Lock(t.Context())
		if err != nil {
			errc <- err
			return
		}
		got <- l
	}()
	time.Sleep(200 * time.Millisecond) // let the waiter settle into its wait
	unlock(t, held)
	select {
	case l := <-got:
		unlock(t, l)
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("waiter not woken by the release")
	}
}

func testOneClientManyWaiters(t *testing.T, s *Store) {
	const waiters = 16
	holder := client(t, s)
	sp := newSpy(s.NewBackend(t))
	c := clientOn(t, sp)
	held := lock(t, holder.Mutex("locktest/herd"))
	var wg sync.WaitGroup
	var inside atomic.Int32
	// The waiters start one after another, each once the one before has
	// been refused: what is measured is the cost of a release, not first
	// tries on cold connections at once (which Redlock's 50ms node timeout
	// does not always allow under the race detector).
	for range waiters {
		busy, onBusy := busySignal()
		out := make(chan outcome, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := c.Mutex("locktest/herd", onBusy).Lock(t.Context())
			if err != nil {
				t.Error(err)
				out <- outcome{err: err}
				return
			}
			if !inside.CompareAndSwap(0, 1) {
				t.Error("two holders at once")
			}
			time.Sleep(2 * time.Millisecond)
			inside.Store(0)
			if err := l.Unlock(t.Context()); err != nil {
				t.Error(err)
			}
		}()
		waitBusy(t, "a waiter", busy, out)
	}
	time.Sleep(300 * time.Millisecond)
	unlock(t, held)
	wg.Wait()
	acquires, _, _ := sp.counts()
	// Each waiter tries once on arrival and once when it becomes the active
	// waiter; each grant costs the next active waiter one failed attempt; a few
	// more come from the safety-net timer. A herd would be ~waiters²/2.
	if limit := 4*waiters + 10; acquires > limit {
		t.Errorf("%d acquire attempts for %d waiters, want at most %d (a thundering herd?)", acquires, waiters, limit)
	}
	t.Logf("%d acquire attempts for %d waiters", acquires, waiters)
}

func testCancelledWaitLeavesNothing(t *testing.T, s *Store) {
	const name = "locktest/cancel"
	a := client(t, s)
	held := lock(t, a.Mutex(name))
	wb := s.NewBackend(t)
	b := dlock.New(wb)

	ctx, cancel := context.WithCancel(t.Context())
	type result struct {
		err error
		at  time.Time
	}
	done := make(chan result, 1)
	go func() {
		_, err := b.Mutex(name).Lock(ctx)
		done <- result{err, time.Now()}
	}()
	time.Sleep(150 * time.Millisecond)
	cancelled := time.Now()
	cancel()
	r := <-done
	if !errors.Is(r.err, dlock.ErrNotObtained) || !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled Lock = %v, want ErrNotObtained and context.Canceled", r.err)
	}
	var no *dlock.NotObtainedError
	if !errors.As(r.err, &no) || no.Holder != held.Owner() {
		t.Errorf("cancelled Lock does not name the holder: %v", r.err)
	}
	if took := r.at.Sub(cancelled); took > 500*time.Millisecond {
		t.Errorf("Lock returned %v after cancellation", took)
	}
	unlock(t, held)

	// Cancel attempts at random points on a free lock, including while the
	// acquire is on its way to the store.
	for i := range 200 {
		ctx, cancel := context.WithTimeout(t.Context(), time.Duration(rand.IntN(400))*time.Microsecond)
		var l *dlock.Lease
		var err error
		if i%2 == 0 {
			l, err = b.Mutex(name).Lock(ctx)
		} else {
			l, err = b.Mutex(name).TryLock(ctx)
		}
		cancel()
		if err == nil {
			if err := l.Unlock(t.Context()); err != nil {
				t.Fatalf("Unlock: %v", err)
			}
		} else if !errors.Is(err, dlock.ErrNotObtained) && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("attempt %d: %v", i, err)
		}
	}
	if err := b.Close(); err != nil { // waits for clean-ups in flight
		t.Fatalf("Close: %v", err)
	}
	if left := s.Leftovers(t, name); len(left) > 0 {
		t.Errorf("left on the store after every owner released: %v", left)
	}
}

func testWithWait(t *testing.T, s *Store) {
	a, b := client(t, s), client(t, s)
	held := lock(t, a.Mutex("locktest/withwait"))
	start := time.Now()
	_, err := b.Mutex("locktest/withwait", dlock.WithWait(150*time.Millisecond)).Lock(t.Context())
	if !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock with WithWait = %v, want ErrNotObtained and DeadlineExceeded", err)
	}
	if took := time.Since(start); took < 150*time.Millisecond {
		t.Errorf("gave up after %v, before WithWait's 150ms", took)
	}
	unlock(t, held)
}

func testUnlockAfterLoss(t *testing.T, s *Store) {
	a := client(t, s)
	held := lock(t, a.Mutex("locktest/unlocklost", dlock.WithTTL(ttl)))
	s.Delete(t, "locktest/unlocklost")
	waitDone(t, held, 2*ttl)
	err := held.Unlock(t.Context())
	if !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, dlock.ErrLost) {
		t.Errorf("Unlock after loss = %v, want ErrNotHeld and ErrLost", err)
	}

	// Deleted just before Unlock, with no renewal in between: the store says so.
	held = lock(t, a.Mutex("locktest/unlocklost", dlock.WithTTL(ttl), dlock.WithAutoRenew(false)))
	s.Delete(t, "locktest/unlocklost")
	if err := held.Unlock(t.Context()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Unlock of a deleted lock = %v, want ErrNotHeld", err)
	}
	if r := lostReason(t, held.Err()); r != dlock.LostMissing {
		t.Errorf("reason = %v, want %v", r, dlock.LostMissing)
	}
}

func testUnlockStopsRenewal(t *testing.T, s *Store) {
	sp := newSpy(s.NewBackend(t))
	c := clientOn(t, sp)
	// Renewals every 100ms. (150ms left Redlock's node calls 15ms, TTL/10,
	// which a loaded 2-core machine missed now and then: Lock failed.)
	const short = 300 * time.Millisecond
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := c.Mutex(fmt.Sprintf("locktest/stoprenew/%d", w), dlock.WithTTL(short))
			for range 15 {
				l, err := m.Lock(t.Context())
				if err != nil {
					t.Error(err)
					return
				}
				time.Sleep(time.Duration(rand.IntN(240)) * time.Millisecond)
				if err := l.Unlock(t.Context()); err != nil {
					// A lease whose renewals a loaded machine delayed past
					// its deadline is lost, and its Unlock says so: what
					// this case checks is what comes after an Unlock.
					if l.Err() != nil && errors.Is(err, dlock.ErrNotHeld) {
						continue
					}
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	time.Sleep(2 * short) // any stray renewal would come now
	_, renews, late := sp.counts()
	if renews == 0 {
		t.Fatal("no renewal happened: the case proves nothing")
	}
	if late > 0 {
		t.Errorf("%d of %d renewals reached the store after their lease's Unlock", late, renews)
	}
}

func testDo(t *testing.T, s *Store) {
	a, b := client(t, s), client(t, s)
	boom := errors.New("boom")
	ran := false
	err := a.Do(t.Context(), "locktest/do", func(ctx context.Context) error {
		ran = true
		mustBeHeldByOther(t, b.Mutex("locktest/do"))
		return boom
	})
	if !ran || !errors.Is(err, boom) {
		t.Fatalf("Do = %v (ran %v), want fn's error", err, ran)
	}
	if err := b.Do(t.Context(), "locktest/do", func(context.Context) error { return nil }); err != nil {
		t.Fatalf("Do after the first released: %v", err)
	}
	err = a.Do(t.Context(), "locktest/do", func(ctx context.Context) error {
		s.Delete(t, "locktest/do")
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * ttl):
			return errors.New("fn's context not cancelled after the lease was lost")
		}
	}, dlock.WithTTL(ttl))
	if !errors.Is(err, dlock.ErrLost) || !errors.Is(err, context.Canceled) {
		t.Errorf("Do with a lost lease = %v, want ErrLost joined with fn's error", err)
	}
}

func testInvalidInput(t *testing.T, s *Store) {
	c := client(t, s)
	long := strings.Repeat("n", dlock.MaxNameLength+1)
	for _, tc := range []struct {
		what  string
		m     *dlock.Mutex
		field string
	}{
		{"empty name", c.Mutex(""), "name"},
		{"long name", c.Mutex(long), "name"},
		{"prefix makes it long", c.Mutex(long[:dlock.MaxNameLength-2], dlock.WithKeyPrefix("app:")), "name"},
		{"control character", c.Mutex("a\nb"), "name"},
		{"invalid UTF-8", c.Mutex("a\xffb"), "name"},
		{"leading brace", c.Mutex("}a"), "name"},
		{"zero TTL", c.Mutex("x", dlock.WithTTL(0)), "ttl"},
		{"negative TTL", c.Mutex("x", dlock.WithTTL(-time.Second)), "ttl"},
		{"TTL below minimum", c.Mutex("x", dlock.WithTTL(dlock.MinTTL-1)), "ttl"},
		{"negative wait", c.Mutex("x", dlock.WithWait(-1)), "wait"},
		{"long metadata", c.Mutex("x", dlock.WithMetadata(strings.Repeat("m", dlock.MaxMetadataLength+1))), "metadata"},
		{"long owner ID", c.Mutex("x", dlock.WithOwnerID(strings.Repeat("o", dlock.MaxOwnerIDLength+1))), "owner ID"},
		{"margin over half the TTL", c.Mutex("x", dlock.WithTTL(time.Second), dlock.WithSafetyMargin(600*time.Millisecond)), "safety margin"},
		{"negative margin", c.Mutex("x", dlock.WithSafetyMargin(-time.Second)), "safety margin"},
		{"nil backend", dlock.New(nil).Mutex("x"), "backend"},
		{"nil client", (*dlock.Client)(nil).Mutex("x"), "client"},
	} {
		for op, call := range map[string]func() error{
			"Lock":    func() error { _, err := tc.m.Lock(t.Context()); return err },
			"TryLock": func() error { _, err := tc.m.TryLock(t.Context()); return err },
		} {
			err := call()
			if !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("%s with %s = %v, want ErrInvalid naming %q", op, tc.what, err, tc.field)
			}
		}
	}
	if err := (*dlock.Lease)(nil).Unlock(t.Context()); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Unlock of a nil lease = %v, want ErrInvalid", err)
	}
	if err := new(dlock.Lease).Unlock(t.Context()); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Unlock of a zero lease = %v, want ErrInvalid", err)
	}
	if err := new(dlock.Lease).Refresh(t.Context()); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Refresh of a zero lease = %v, want ErrInvalid", err)
	}
	if err := c.Do(t.Context(), "x", nil); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Do with a nil fn = %v, want ErrInvalid", err)
	}
	if err := dlock.New(s.NewBackend(t), dlock.WithTTL(time.Millisecond)).Do(t.Context(), "x", func(context.Context) error { return nil }); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Do on a Client with a bad default TTL = %v, want ErrInvalid", err)
	}
}

func testCloseStopsEverything(t *testing.T, s *Store) {
	other := client(t, s)
	otherMutex := other.Mutex("locktest/close")
	backend := s.NewBackend(t)
	before := ownGoroutines()

	c := dlock.New(backend)
	held := lock(t, c.Mutex("locktest/close"))
	waitErr := make(chan error, 1)
	go func() {
		_, err := c.Mutex("locktest/close").Lock(t.Context())
		waitErr <- err
	}()
	time.Sleep(100 * time.Millisecond)
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-waitErr; !errors.Is(err, dlock.ErrClosed) || !errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("Lock interrupted by Close = %v, want ErrClosed and ErrNotObtained", err)
	}
	if r := lostReason(t, held.Err()); r != dlock.LostClosed {
		t.Errorf("reason = %v, want %v", r, dlock.LostClosed)
	}
	if _, err := c.Mutex("locktest/close").TryLock(t.Context()); !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("TryLock after Close = %v, want ErrClosed", err)
	}
	checkNoNewGoroutines(t, before)
	// Close released the lock on the store.
	l, err := otherMutex.TryLock(t.Context())
	if err != nil {
		t.Fatalf("TryLock after the holder's Client closed: %v", err)
	}
	unlock(t, l)
}
