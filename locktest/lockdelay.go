package locktest

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// supportsLockDelay reports whether backends of s honour dlock.WithLockDelay.
func supportsLockDelay(t *testing.T, s *Store) bool {
	cb, ok := s.NewBackend(t).(driver.Capabler)
	return ok && cb.Supports(driver.CapLockDelay)
}

// testLockDelay checks dlock.WithLockDelay: an expired lease keeps others
// out for the delay, a released lock is free at once, and a late holder's
// Unlock ends the delay. A backend without lock-delay must refuse the option.
func testLockDelay(t *testing.T, s *Store) {
	if !supportsLockDelay(t, s) {
		_, err := client(t, s).Mutex("locktest/delay", dlock.WithLockDelay(time.Second)).TryLock(t.Context())
		if !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("TryLock with WithLockDelay on a backend without it = %v, want ErrInvalid", err)
		}
		return
	}
	const delay = 1500 * time.Millisecond
	opts := []dlock.Option{dlock.WithTTL(ttl), dlock.WithAutoRenew(false), dlock.WithLockDelay(delay)}

	t.Run("Released", func(t *testing.T) {
		a, b := client(t, s), client(t, s)
		unlock(t, lock(t, a.Mutex("locktest/delay-released", opts...)))
		l, err := b.Mutex("locktest/delay-released").TryLock(t.Context())
		if err != nil {
			t.Fatalf("TryLock right after a release: %v (a released lock must be free at once)", err)
		}
		unlock(t, l)
	})

	t.Run("Expired", func(t *testing.T) {
		a, b := client(t, s), client(t, s)
		start := time.Now()
		first := lock(t, a.Mutex("locktest/delay-expired", opts...))
		waitDone(t, first, 10*ttl)
		if r := lostReason(t, first.Err()); r != dlock.LostExpired {
			t.Errorf("reason = %v, want %v", r, dlock.LostExpired)
		}
		other := b.Mutex("locktest/delay-expired", dlock.WithWait(10*delay))
		// Past the TTL, well inside the delay: still out of reach.
		time.Sleep(time.Until(start.Add(ttl + delay/4)))
		if time.Since(start) < ttl+delay-200*time.Millisecond {
			mustBeHeldByOther(t, other)
		}
		if ins, ok := s.NewBackend(t).(driver.Inspector); ok {
			info, held, err := ins.Inspect(t.Context(), "locktest/delay-expired")
			if err != nil || !held || !info.Delayed {
				t.Errorf("Inspect during the delay = %+v, %v, %v; want held and Delayed", info, held, err)
			}
		}
		second := lock(t, other)
		if got := time.Since(start); got < ttl+delay-50*time.Millisecond {
			t.Errorf("second owner got the lock %v after the first acquire, before TTL + delay (%v)", got, ttl+delay)
		}
		if second.Fence() <= first.Fence() {
			t.Errorf("fence %d after %d, want greater", second.Fence(), first.Fence())
		}
		unlock(t, second)
	})

	t.Run("LateUnlockEndsDelay", func(t *testing.T) {
		a, b := client(t, s), client(t, s)
		first := lock(t, a.Mutex("locktest/delay-late", opts...))
		waitDone(t, first, 10*ttl)
		time.Sleep(ttl / 2) // past the store's TTL too
		if err := first.Unlock(t.Context()); !errors.Is(err, dlock.ErrNotHeld) {
			t.Errorf("Unlock of the expired lease = %v, want ErrNotHeld", err)
		}
		l, err := b.Mutex("locktest/delay-late").TryLock(t.Context())
		if err != nil {
			t.Fatalf("TryLock after the late holder's Unlock: %v (its Unlock should end the delay)", err)
		}
		unlock(t, l)
		if left := s.Leftovers(t, "locktest/delay-late"); len(left) != 0 {
			t.Errorf("left on the store after release: %v", left)
		}
	})
}
