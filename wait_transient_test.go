package dlock_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memlock"
)

// flaky is a memlock store whose next acquires fail with an error that
// may heal (driver.Transient) after the store acted on them, as when a
// connection drops with the answer on it.
type flaky struct {
	*memlock.Backend
	fail     atomic.Int64 // acquires still to fail; -1: all of them
	acquires atomic.Int64
	err      error // the error returned, marked transient
}

var errDropped = errors.New("flaky: connection reset after the command ran")

func newFlaky(fail int64) *flaky {
	f := &flaky{Backend: memlock.New(), err: driver.Transient(errDropped)}
	f.fail.Store(fail)
	return f
}

func (f *flaky) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	f.acquires.Add(1)
	res, err := f.Backend.Acquire(ctx, req)
	if err != nil {
		return res, err
	}
	for {
		n := f.fail.Load()
		if n == 0 {
			return res, nil
		}
		if n < 0 || f.fail.CompareAndSwap(n, n-1) {
			return driver.AcquireResult{}, f.err
		}
	}
}

// TestLockRetriesTransientStoreErrors checks that every waiting call goes
// on through store errors that may heal, and gets the lock once the store
// answers, without a hold left behind by the attempts that failed.
func TestLockRetriesTransientStoreErrors(t *testing.T) {
	kinds := []struct {
		name string
		lock func(c *dlock.Client) (func(context.Context) error, error)
	}{
		{"Mutex", func(c *dlock.Client) (func(context.Context) error, error) {
			l, err := c.Mutex("k").Lock(t.Context())
			return unlockOf(l), err
		}},
		{"FairMutex", func(c *dlock.Client) (func(context.Context) error, error) {
			l, err := c.Mutex("k", dlock.Fair()).Lock(t.Context())
			return unlockOf(l), err
		}},
		{"ReentrantMutex", func(c *dlock.Client) (func(context.Context) error, error) {
			l, err := c.Mutex("k", dlock.Reentrant()).Lock(t.Context())
			return unlockOf(l), err
		}},
		{"RLock", func(c *dlock.Client) (func(context.Context) error, error) {
			l, err := c.RWMutex("k").RLock(t.Context())
			return unlockOf(l), err
		}},
		{"Acquire", func(c *dlock.Client) (func(context.Context) error, error) {
			l, err := c.Semaphore("k", 2).Acquire(t.Context())
			return unlockOf(l), err
		}},
		{"Campaign", func(c *dlock.Client) (func(context.Context) error, error) {
			ld, err := c.Election("k").Campaign(t.Context(), "v")
			if err != nil {
				return nil, err
			}
			return ld.Resign, nil
		}},
		{"Multi", func(c *dlock.Client) (func(context.Context) error, error) {
			ml, err := c.Multi([]string{"k", "k2"}).Lock(t.Context())
			if err != nil {
				return nil, err
			}
			return ml.Unlock, nil
		}},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			f := newFlaky(3)
			c := dlock.New(f)
			defer c.Close()
			unlock, err := k.lock(c)
			if err != nil {
				t.Fatalf("Lock through 3 transient errors: %v", err)
			}
			if n := f.acquires.Load(); n < 4 {
				t.Errorf("%d acquires reached the store, want at least 4 (3 failed, 1 granted)", n)
			}
			if err := unlock(t.Context()); err != nil {
				t.Fatal(err)
			}
			if err := c.Close(); err != nil { // the failed attempts' clean-ups are done
				t.Fatal(err)
			}
			for _, key := range []string{"k", "k2"} {
				if info := held(t, f.Backend, key); info.Holds != 0 || len(info.Shared) != 0 {
					t.Errorf("%s after Unlock and Close: %+v, want free", key, info)
				}
			}
		})
	}
}

func unlockOf(l *dlock.Lease) func(context.Context) error {
	if l == nil {
		return nil
	}
	return l.Unlock
}

// TestLockTransientErrorsUntilWaitEnds checks that a wait on a store that
// keeps failing with errors that may heal ends when its wait does, with a
// not-obtained error that carries the cause and the last store error.
func TestLockTransientErrorsUntilWaitEnds(t *testing.T) {
	t.Parallel()
	f := newFlaky(-1)
	c := dlock.New(f)
	defer c.Close()
	start := time.Now()
	_, err := c.Mutex("k", dlock.WithWait(500*time.Millisecond)).Lock(t.Context())
	took := time.Since(start)
	if !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) ||
		!errors.Is(err, errDropped) || !errors.Is(err, driver.ErrTransient) {
		t.Fatalf("Lock = %v; want ErrNotObtained, DeadlineExceeded and the store's error", err)
	}
	if !strings.Contains(err.Error(), errDropped.Error()) {
		t.Errorf("the message %q does not say the store's error", err)
	}
	if took < 400*time.Millisecond {
		t.Errorf("Lock returned after %v, before its wait (500ms) ended", took)
	}
	if n := f.acquires.Load(); n < 3 {
		t.Errorf("%d acquires in 500ms; want several tries", n)
	}
	// TryLock makes one attempt and returns the store's error.
	f.acquires.Store(0)
	if _, err := c.Mutex("k").TryLock(t.Context()); !errors.Is(err, errDropped) || errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("TryLock = %v; want the store's error", err)
	}
	if n := f.acquires.Load(); n != 1 {
		t.Errorf("TryLock made %d acquires, want 1", n)
	}
}

// TestLockReturnsPermanentStoreErrorAtOnce checks that a store error that
// will not heal (not marked transient) still ends a wait at once.
func TestLockReturnsPermanentStoreErrorAtOnce(t *testing.T) {
	f := newFlaky(-1)
	f.err = errDropped
	c := dlock.New(f)
	defer c.Close()
	start := time.Now()
	_, err := c.Mutex("k", dlock.WithWait(5*time.Second)).Lock(t.Context())
	if !errors.Is(err, errDropped) || errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("Lock = %v; want the store's error", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Lock returned after %v; want at once", took)
	}
	if n := f.acquires.Load(); n != 1 {
		t.Errorf("%d acquires, want 1", n)
	}
}

// TestLockRetriesTransientErrorsWhileWaiting checks that a wait that is
// under way (the lock is held) goes on through transient errors and gets
// the lock at its release.
func TestLockRetriesTransientErrorsWhileWaiting(t *testing.T) {
	t.Parallel()
	for _, fair := range []bool{false, true} {
		f := newFlaky(0)
		holder, c := dlock.New(f.Backend), dlock.New(f)
		var opts []dlock.Option
		if fair {
			opts = append(opts, dlock.Fair())
		}
		h, err := holder.Mutex("k").Lock(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			l, err := c.Mutex("k", opts...).Lock(t.Context())
			if err == nil {
				err = l.Unlock(context.Background())
			}
			got <- err
		}()
		time.Sleep(100 * time.Millisecond)
		f.fail.Store(-1)
		time.Sleep(2 * time.Second) // attempts fail (a queued waiter keeps its entry every 5s/3)
		f.fail.Store(0)
		if err := h.Unlock(t.Context()); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Errorf("fair=%v: Lock: %v", fair, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("fair=%v: Lock still waits 10s after the release", fair)
		}
		if err := errors.Join(c.Close(), holder.Close()); err != nil {
			t.Fatal(err)
		}
		if info := held(t, f.Backend, "k"); info.Holds != 0 {
			t.Errorf("fair=%v: after Unlock and Close: %+v, want free", fair, info)
		}
	}
}

// TestLockRetriesAreObservedAsAttempts checks that observers see each try
// through transient errors: one acquire store call with its error per try,
// and the Lock's granted event counting them all.
func TestLockRetriesAreObservedAsAttempts(t *testing.T) {
	f := newFlaky(2)
	rec := &recorder{}
	c := dlock.New(f, dlock.WithObserver(rec))
	defer c.Close()
	l, err := c.Mutex("k").Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	es := rec.take()
	if g := one(t, es, dlock.EventLockGranted); g.Attempts != 3 {
		t.Errorf("granted after 2 transient errors with Attempts %d, want 3", g.Attempts)
	}
	var failed int
	for _, e := range of(es, dlock.EventStoreCall) {
		if e.Op == "acquire" && errors.Is(e.Err, errDropped) {
			failed++
		}
	}
	if failed != 2 {
		t.Errorf("%d failed acquire store calls observed, want 2", failed)
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
}
