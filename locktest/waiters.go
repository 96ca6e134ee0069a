package locktest

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// supports reports whether backends of s have capability c.
func supports(t *testing.T, s *Store, c driver.Capability) bool {
	cb, ok := s.NewBackend(t).(driver.Capabler)
	return ok && cb.Supports(c)
}

// hasNotifier reports whether backends of s wake waiters by notification.
func hasNotifier(t *testing.T, s *Store) bool {
	_, ok := s.NewBackend(t).(driver.Notifier)
	return ok
}

// mustBeInvalid checks that each call fails with ErrInvalid.
func mustBeInvalid(t *testing.T, what string, calls map[string]func(context.Context) (*dlock.Lease, error)) {
	t.Helper()
	for op, call := range calls {
		l, err := call(t.Context())
		if err == nil {
			_ = l.Unlock(t.Context())
		}
		if !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("%s %s = %v, want ErrInvalid", op, what, err)
		}
	}
}

// outcome is what a Lock (RLock, Acquire) in a goroutine returned.
type outcome struct {
	l   *dlock.Lease
	err error
}

// goLock runs lock in a goroutine; its outcome arrives on the channel.
func goLock(ctx context.Context, lock func(context.Context) (*dlock.Lease, error)) <-chan outcome {
	out := make(chan outcome, 1)
	go func() {
		l, err := lock(ctx)
		out <- outcome{l, err}
	}()
	return out
}

// busySignal returns a WithOnBusy option and the channel that receives the
// first refusal it reports: once it arrives, the waiter made an attempt
// that found the lock held, so a fair waiter is queued and a writer's
// intent is recorded (when the store found readers).
func busySignal() (<-chan *dlock.NotObtainedError, dlock.Option) {
	c := make(chan *dlock.NotObtainedError, 1)
	return c, dlock.WithOnBusy(func(e *dlock.NotObtainedError) {
		select {
		case c <- e:
		default:
		}
	})
}

// waitBusy waits for a waiter's first refusal, failing t if the waiter
// returned first or nothing came in time.
func waitBusy(t *testing.T, what string, busy <-chan *dlock.NotObtainedError, out <-chan outcome) *dlock.NotObtainedError {
	t.Helper()
	select {
	case e := <-busy:
		return e
	case o := <-out:
		if o.err == nil {
			_ = o.l.Unlock(t.Context())
		}
		t.Fatalf("%s returned (%v) before it was refused once", what, o.err)
	case <-time.After(10 * time.Second):
		t.Fatalf("%s was not refused within 10s", what)
	}
	return nil
}

// waitLease waits for a waiter's lease, failing t on an error or timeout.
func waitLease(t *testing.T, what string, out <-chan outcome, limit time.Duration) *dlock.Lease {
	t.Helper()
	select {
	case o := <-out:
		if o.err != nil {
			t.Fatalf("%s: %v", what, o.err)
		}
		return o.l
	case <-time.After(limit):
		t.Fatalf("%s: nothing after %v", what, limit)
	}
	return nil
}

// notYet checks that a waiter has not returned.
func notYet(t *testing.T, what string, out <-chan outcome) {
	t.Helper()
	select {
	case o := <-out:
		if o.err == nil {
			_ = o.l.Unlock(t.Context())
		}
		t.Fatalf("%s returned early: lease %v, err %v", what, o.l != nil, o.err)
	default:
	}
}

// noLeftovers waits up to 10s for the store to hold nothing for the keys
// (clean-ups after a cancelled wait may run in the background).
func noLeftovers(t *testing.T, s *Store, keys ...string) {
	t.Helper()
	noLeftoversWithin(t, s, 10*time.Second, keys...)
}

// noLeftoversWithin waits up to limit for the store to hold nothing for
// the keys.
func noLeftoversWithin(t *testing.T, s *Store, limit time.Duration, keys ...string) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		var left []string
		for _, k := range keys {
			left = append(left, s.Leftovers(t, k)...)
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("left on the store after every owner released and every waiter left: %v", left)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// notObtained checks that err is a *NotObtainedError and returns it.
func notObtained(t *testing.T, what string, l *dlock.Lease, err error) *dlock.NotObtainedError {
	t.Helper()
	var no *dlock.NotObtainedError
	if err == nil {
		_ = l.Unlock(t.Context())
		t.Fatalf("%s succeeded, want ErrNotObtained", what)
	}
	if !errors.As(err, &no) || !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("%s = %v, want a *NotObtainedError", what, err)
	}
	return no
}

// testManyWaitersOneClient checks that waiters of one Client on one name
// cost the store what one waiter costs, whatever their number: only the
// waiter at the Client's local gate tries, refreshes a queue entry or is
// woken by the holder's TTL, the Client holds at most one place in the
// store's queue, and a waiter costs no goroutine besides its own. Plain
// waiters are checked past the point where their wait starves and joins
// the queue, and fair ones from the start.
func testManyWaitersOneClient(t *testing.T, s *Store) {
	const many = 100
	kinds := []struct {
		name string
		opts []dlock.Option
	}{{"plain", nil}}
	if supports(t, s, driver.CapFair) {
		kinds = append(kinds, struct {
			name string
			opts []dlock.Option
		}{"fair", []dlock.Option{dlock.Fair()}})
	}
	_, inspects := s.NewBackend(t).(driver.Inspector)
	for _, kind := range kinds {
		name := "locktest/many-waiters-" + kind.name
		// A short TTL makes the holder's renewals, and queue refreshes,
		// frequent: waiters that each acted on them would show.
		opts := append([]dlock.Option{dlock.WithTTL(600 * time.Millisecond)}, kind.opts...)
		// The holder's own TTL is longer, so that a store slowed down by
		// the waiters' first tries cannot make it lose the lock.
		holder := lock(t, client(t, s).Mutex(name, append(opts, dlock.WithTTL(3*time.Second))...))

		// waitWith starts n waiters in a Client of their own and returns
		// the acquire attempts they make in one second once every one of
		// them has tried, the goroutines they cost beyond their own, and
		// the store's queue entries meanwhile (-1 when it cannot tell).
		waitWith := func(n int) (attempts, extra, queued int) {
			p := newProbe(s.NewBackend(t))
			c := clientOn(t, p.backend())
			before := runtime.NumGoroutine()
			ctx, cancel := context.WithCancel(t.Context())
			var wg sync.WaitGroup
			// The waiters start one after another, each once the one before
			// has been refused: their first tries do not pile up on the
			// store at once (which is not what is measured here).
			for range n {
				busy, onBusy := busySignal()
				wg.Add(1)
				out := make(chan outcome, 1)
				go func() {
					defer wg.Done()
					l, err := c.Mutex(name, append(opts, onBusy)...).Lock(ctx)
					switch {
					case err == nil:
						t.Errorf("%s: a waiter obtained the lock while it was held (holder's lease: %v)", kind.name, holder.Err())
						_ = l.Unlock(t.Context())
					case ctx.Err() == nil:
						t.Errorf("%s: a waiter's Lock failed: %v", kind.name, err)
						out <- outcome{err: err}
					}
				}()
				waitBusy(t, kind.name+" waiter", busy, out)
			}
			time.Sleep(50 * time.Millisecond) // past the starvation switch (1ms)
			start := len(p.recorded())
			time.Sleep(time.Second)
			attempts = len(p.recorded()) - start
			extra = runtime.NumGoroutine() - before - n
			queued = -1
			if inspects {
				info, _, err := s.NewBackend(t).(driver.Inspector).Inspect(t.Context(), name)
				if err != nil {
					t.Fatal(err)
				}
				queued = info.Queued
			}
			cancel()
			wg.Wait()
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			return attempts, extra, queued
		}
		one, _, _ := waitWith(1)
		attempts, extra, queued := waitWith(many)
		t.Logf("%s: %d waiters made %d attempts in 1s (one waiter: %d), %d extra goroutines, %d queue entries",
			kind.name, many, attempts, one, extra, queued)
		if limit := 3*one + 20; attempts > limit {
			t.Errorf("%s: %d waiters of one Client made %d store attempts in 1s, one waiter %d: want at most %d", kind.name, many, attempts, one, limit)
		}
		if extra > 10 {
			t.Errorf("%s: %d waiters cost %d goroutines beyond their own", kind.name, many, extra)
		}
		if queued > 1 {
			t.Errorf("%s: one Client's waiters hold %d entries in the store's queue, want at most 1", kind.name, queued)
		}
		unlock(t, holder)
		noLeftovers(t, s, name)
	}
}
