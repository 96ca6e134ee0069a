// The contract's cases for waiting: woken by the release, one Client's many
// waiters, a cancelled wait, WithWait.

package locktest

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

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
	refused := make(chan struct{}, 1)
	onBusy := dlock.WithOnBusy(func(*dlock.NotObtainedError) {
		select {
		case refused <- struct{}{}:
		default:
		}
	})
	go func() {
		_, err := b.Mutex(name, onBusy).Lock(ctx)
		done <- result{err, time.Now()}
	}()
	// Cancelled once the store has refused it (so that it knows the
	// holder), however long a loaded machine took for that answer.
	select {
	case <-refused:
	case r := <-done:
		t.Fatalf("Lock returned before it was cancelled: %v", r.err)
	}
	time.Sleep(50 * time.Millisecond)
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
