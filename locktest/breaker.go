package locktest

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// testBreakIf checks driver.Breaker, on backends that have it: BreakIf
// breaks the exclusive hold of the grant it names by its fence, and only
// that one; a waiter is woken and gets a larger fence; the broken holder
// learns of its loss at its next renewal.
func testBreakIf(t *testing.T, s *Store) {
	br, ok := s.NewBackend(t).(driver.Breaker)
	if !ok {
		t.Log("the backend has no BreakIf (driver.Breaker is optional)")
		return
	}
	const name = "locktest/break"
	a, b, c := client(t, s), client(t, s), client(t, s)
	held := lock(t, a.Mutex(name, dlock.WithTTL(ttl)))
	ctx := t.Context()

	got := make(chan *dlock.Lease, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		l, err := b.Mutex(name).Lock(wctx)
		if err != nil {
			t.Errorf("the waiter's Lock: %v", err)
		}
		got <- l
	}()
	time.Sleep(100 * time.Millisecond) // let the waiter settle into its wait

	if broken, err := br.BreakIf(ctx, name, held.Fence()+1); err != nil || broken {
		t.Fatalf("BreakIf with another fence = %v, %v; want false, nil", broken, err)
	}
	mustBeHeldByOther(t, c.Mutex(name))
	if broken, err := br.BreakIf(ctx, name, held.Fence()); err != nil || !broken {
		t.Fatalf("BreakIf with the holder's fence = %v, %v; want true, nil", broken, err)
	}
	var next *dlock.Lease
	select {
	case next = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter did not get the lock within 5s of the break")
	}
	if next == nil {
		return
	}
	if next.Fence() <= held.Fence() {
		t.Errorf("fence %d after the broken %d, want greater", next.Fence(), held.Fence())
	}
	waitDone(t, held, ttl/3+ttl/4)
	if r := lostReason(t, held.Err()); r != dlock.LostMissing {
		t.Errorf("the broken holder's reason = %v, want %v", r, dlock.LostMissing)
	}
	// The old fence no longer names the hold: the new holder keeps it.
	if broken, err := br.BreakIf(ctx, name, held.Fence()); err != nil || broken {
		t.Errorf("BreakIf with the broken grant's fence again = %v, %v; want false, nil", broken, err)
	}
	mustBeHeldByOther(t, c.Mutex(name))
	unlock(t, next)
	if broken, err := br.BreakIf(ctx, name, next.Fence()); err != nil || broken {
		t.Errorf("BreakIf of a released lock = %v, %v; want false, nil", broken, err)
	}
	if cb, ok := s.NewBackend(t).(driver.Capabler); ok && cb.Supports(driver.CapLockDelay) {
		// A lock-delay, asked for to keep others out after a crash, is
		// never broken.
		d := lock(t, c.Mutex(name+"/delay", dlock.WithLockDelay(time.Second)))
		if broken, err := br.BreakIf(ctx, name+"/delay", d.Fence()); err != nil || broken {
			t.Errorf("BreakIf of a grant with a lock-delay = %v, %v; want false, nil", broken, err)
		}
		mustBeHeldByOther(t, a.Mutex(name+"/delay"))
		unlock(t, d)
	}
	if cb, ok := s.NewBackend(t).(driver.Capabler); ok && cb.Supports(driver.CapShared) {
		r := c.RWMutex(name + "/rw")
		rl, err := r.RLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// A reader is no exclusive hold: nothing to break, whatever fence.
		if broken, err := br.BreakIf(ctx, name+"/rw", rl.Fence()); err != nil || broken {
			t.Errorf("BreakIf of a reader = %v, %v; want false, nil", broken, err)
		}
		mustBeHeldByOther(t, a.Mutex(name+"/rw"))
		unlock(t, rl)
	}
}
