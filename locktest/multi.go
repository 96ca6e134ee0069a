package locktest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// multiOrderTTL is the TTL of testMulti's two clients that lock p and q in
// opposite orders.
const multiOrderTTL = 10 * time.Second

// testMulti checks Client.Multi across Clients: one lease and fence per
// name; all or nothing (a TryLock that finds one name held, or a Lock whose
// wait ends, leaves none of the others held); two callers that ask for
// overlapping sets in opposite orders never deadlock and never overlap; a
// waiting Lock gets every name once the last is released; a name lost
// behind the holder's back ends the MultiLease and releases the others;
// Unlock releases everything.
func testMulti(t *testing.T, s *Store) {
	const x, y, z = "locktest/multi-x", "locktest/multi-y", "locktest/multi-z"
	a := client(t, s, dlock.WithTTL(ttl))
	b := client(t, s, dlock.WithTTL(ttl))

	ml, err := a.Multi([]string{z, x, y}).TryLock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got := ml.Names(); len(got) != 3 || got[0] != x || got[1] != y || got[2] != z {
		t.Errorf("Names = %q, want them in key order", got)
	}
	for _, name := range []string{x, y, z} {
		if f, ok := ml.Fence(name); !ok || f == 0 || f != ml.Lease(name).Fence() {
			t.Errorf("Fence(%q) = %d, %v; want its lease's fence", name, f, ok)
		}
	}
	if f, ok := ml.Fence("other"); ok || f != 0 {
		t.Errorf("Fence of a name not held = %d, %v; want 0, false", f, ok)
	}
	for _, name := range []string{x, y, z} {
		mustBeHeldByOther(t, b.Mutex(name))
	}
	if _, err := b.Multi([]string{"locktest/multi-free", y}).TryLock(t.Context()); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("Multi.TryLock over a held name = %v, want ErrNotObtained", err)
	}
	if err := ml.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if ml.Err() == nil || !errors.Is(ml.Err(), dlock.ErrReleased) {
		t.Errorf("Err after Unlock = %v, want ErrReleased", ml.Err())
	}

	// All or nothing: y is held by b alone; a TryLock and a bounded Lock
	// of x and y leave x free.
	held := lock(t, b.Mutex(y))
	_, err = a.Multi([]string{x, y}).TryLock(t.Context())
	var no *dlock.NotObtainedError
	if !errors.As(err, &no) || no.Name != y {
		t.Fatalf("Multi.TryLock with y held = %v, want a *NotObtainedError naming y", err)
	}
	unlock(t, lock(t, b.Mutex(x))) // x was given back
	if _, err := a.Multi([]string{x, y}, dlock.WithWait(100*time.Millisecond)).Lock(t.Context()); !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Multi.Lock with y held and WithWait = %v, want ErrNotObtained and DeadlineExceeded", err)
	}
	unlock(t, lock(t, b.Mutex(x)))

	// A waiting Lock gets both once y is released.
	type result struct {
		ml  *dlock.MultiLease
		err error
	}
	got := make(chan result, 1)
	go func() {
		ml, err := a.Multi([]string{y, x}).Lock(t.Context())
		got <- result{ml, err}
	}()
	time.Sleep(50 * time.Millisecond)
	unlock(t, held)
	var both *dlock.MultiLease
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatal(r.err)
		}
		both = r.ml
	case <-time.After(10 * time.Second):
		t.Fatal("Multi.Lock did not get x and y after y was released")
	}

	// Lost together: y deleted behind the holder's back ends the
	// MultiLease, with y's loss, and x is released.
	s.Delete(t, y)
	select {
	case <-both.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the MultiLease did not end after y was deleted")
	}
	var lost *dlock.LostError
	if err := both.Err(); !errors.As(err, &lost) || lost.Name != y || !errors.Is(context.Cause(both.Context()), dlock.ErrLost) {
		t.Fatalf("Err after y was deleted = %v (cause %v), want y's *LostError", err, context.Cause(both.Context()))
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		l, err := b.Mutex(x).TryLock(t.Context())
		if err == nil {
			unlock(t, l)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("x still held 5s after y was lost: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := both.Unlock(t.Context()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Unlock after a loss = %v, want ErrNotHeld", err)
	}

	// No deadlock and no overlap: a asks for p then q, b for q then p.
	// Their leases outlive any renewal a loaded store may keep waiting:
	// what is checked here is the order, not the expiry.
	a, b = client(t, s, dlock.WithTTL(multiOrderTTL)), client(t, s, dlock.WithTTL(multiOrderTTL))
	const p, q = "locktest/multi-p", "locktest/multi-q"
	var inside atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, c := range []struct {
		c     *dlock.Client
		names []string
	}{{a, []string{p, q}}, {b, []string{q, p}}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := c.c.Multi(c.names)
			for range 20 {
				ml, err := m.Lock(ctx)
				if err != nil {
					errs <- err
					return
				}
				if !inside.CompareAndSwap(0, 1) {
					errs <- errors.New("two holders of p and q at once")
				}
				time.Sleep(time.Millisecond)
				inside.Store(0)
				if err := ml.Unlock(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	noLeftoversWithin(t, s, 3*time.Second, x, y, z, p, q)
}
