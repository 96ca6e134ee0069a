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

// tryLockThroughTransient is TryLock of m, tried again while it fails with a
// transient store error (a store whose replicas lag refuses a grant it
// could not make durable) for up to transientFor: a case about fences in
// a thousand grants checks their order, not that every TryLock succeeds.
func tryLockThroughTransient(t *testing.T, m *dlock.Mutex) (*dlock.Lease, error) {
	deadline := time.Now().Add(transientFor)
	for {
		l, err := m.TryLock(t.Context())
		if err == nil || !driver.IsTransient(err) || time.Now().After(deadline) {
			return l, err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// transientFor bounds how long tryLockThroughTransient rides out transient
// store errors.
const transientFor = 10 * time.Second

func testFencesIncrease(t *testing.T, s *Store) {
	a, b := client(t, s), client(t, s)
	var last uint64
	for i := range 1000 {
		c := a
		if i%2 == 1 {
			c = b
		}
		l, err := tryLockThroughTransient(t, c.Mutex("locktest/fences"))
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
	waitDone(t, held, endWait)
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
	// No caller may see the lease held at or past its Deadline: an Err()
	// read after the deadline reports the loss, however late the timer
	// that cancels the context runs on a loaded machine.
	for end := time.Now().Add(2 * ttl); ctx.Err() == nil; time.Sleep(time.Millisecond) {
		deadline := held.Deadline()
		now := time.Now()
		if err := ctx.Err(); err == nil && !now.Before(deadline) {
			t.Fatalf("Context().Err() nil %v after Deadline()", now.Sub(deadline))
		}
		if now.After(end) {
			t.Fatalf("Context() not cancelled %v after the store died", 2*ttl)
		}
	}
	select {
	case <-ctx.Done():
	case <-time.After(2 * ttl):
		t.Fatalf("Context().Done() not closed %v after its Err", 2*ttl)
	}
	if r := lostReason(t, held.Err()); r != dlock.LostUnreachable {
		t.Errorf("reason = %v, want %v", r, dlock.LostUnreachable)
	}
	if err := held.Unlock(t.Context()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Unlock after loss = %v, want ErrNotHeld", err)
	}
}

func testUnlockAfterLoss(t *testing.T, s *Store) {
	a := client(t, s)
	held := lock(t, a.Mutex("locktest/unlocklost", dlock.WithTTL(ttl)))
	s.Delete(t, "locktest/unlocklost")
	waitDone(t, held, endWait)
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
