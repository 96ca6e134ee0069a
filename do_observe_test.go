package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

// TestDoPanicEndsAndUnlocks: fn panics and the caller recovers (as net/http
// does for a handler). The observer was told EventDoStarted, so it must be
// told EventDoEnded too (the OTel adapter's dlock.Do span is ended only
// there), and the lock must not stay held (and renewed) for the life of
// the process.
func TestDoPanicEndsAndUnlocks(t *testing.T) {
	store := memlock.New()
	rec := &recorder{}
	c := dlock.New(store, dlock.WithObserver(rec))
	defer c.Close()
	ctx := t.Context()
	func() {
		defer func() { _ = recover() }()
		_ = c.Do(ctx, "job", func(context.Context) error { panic("boom") })
	}()
	es := rec.take()
	if len(of(es, dlock.EventDoStarted)) != 1 || len(of(es, dlock.EventDoEnded)) != 1 {
		t.Errorf("events %v: a Do that started and panicked was never reported ended", kinds(es))
	}
	other := dlock.New(store)
	defer other.Close()
	if l, err := other.Mutex("job").TryLock(ctx); err != nil {
		t.Errorf("after a recovered panic in Do's fn the lock is still held: %v", err)
	} else {
		_ = l.Unlock(ctx)
	}
}

// bgObserver is a ContextObserver written to the contract before
// EventDoStarted ("what it returns for the other events is not used"): it
// returns a fresh context for the events it does not trace.
type bgObserver struct{}

func (bgObserver) Observe(dlock.Event) {}
func (bgObserver) ObserveContext(ctx context.Context, e dlock.Event) context.Context {
	switch e.Kind {
	case dlock.EventLockStarted, dlock.EventLockGranted:
		return ctx
	}
	return context.Background()
}

// TestDoCancelWithObserverContext: Do's ctx must still cancel Do's Lock
// whatever a ContextObserver returns for EventDoStarted: the core takes
// only values from what the observer returns for a grant, never its
// cancellation; Do now runs its Lock and fn under the observer's context.
func TestDoCancelWithObserverContext(t *testing.T) {
	store := memlock.New()
	holder := dlock.New(store)
	defer holder.Close()
	ctx := t.Context()
	l, err := holder.Mutex("job").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(ctx)

	c := dlock.New(store, dlock.WithObserver(bgObserver{}))
	defer c.Close()
	dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Do(dctx, "job", func(context.Context) error { return nil }) }()
	select {
	case err := <-done:
		if !errors.Is(err, dlock.ErrNotObtained) {
			t.Errorf("Do = %v, want not obtained", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Do's ctx ran out 100ms in, and its Lock still waits 2s later: it waits under the observer's context")
	}
}

// slowAcquireObserver is slow on the acquire's store call only.
type slowAcquireObserver struct{ d time.Duration }

func (o slowAcquireObserver) Observe(e dlock.Event) {
	if e.Kind == dlock.EventStoreCall && e.Op == "acquire" {
		time.Sleep(o.d)
	}
}

// TestSlowObserverLeaseValidity: the late-grant check no longer
// counts the observer's time; a lease handed back after an observer that
// took longer than the TTL must not look valid.
func TestSlowObserverLeaseValidity(t *testing.T) {
	t.Parallel()
	store := memlock.New()
	c := dlock.New(store, dlock.WithObserver(slowAcquireObserver{1200 * time.Millisecond}))
	defer c.Close()
	ctx := t.Context()
	l, err := c.Mutex("job", dlock.WithTTL(time.Second), dlock.WithAutoRenew(false)).Lock(ctx)
	if err != nil {
		t.Logf("Lock = %v (given back: fine)", err)
		return
	}
	if l.Context().Err() == nil && l.Err() == nil {
		t.Errorf("a lease whose TTL ran out during the observer is returned live (ctx %v, err %v)", l.Context().Err(), l.Err())
	}
}
