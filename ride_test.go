package dlock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memlock"
)

// carrier is a memlock store that counts the acquires sent alone and those
// carried by a release (driver.ReleaseAcquirer), and can hold a carried
// pair until its context ends.
type carrier struct {
	*memlock.Backend
	acquires, carried atomic.Int64
	releases          atomic.Int64 // untied releases (Release), a clean-up's
	hang              atomic.Bool
	// gate, when set, holds a carried pair until it is closed; entered
	// is told when one waits there.
	gate, entered chan struct{}
}

func newCarrier() *carrier { return &carrier{Backend: memlock.New()} }

func (c *carrier) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	c.acquires.Add(1)
	return c.Backend.Acquire(ctx, req)
}

func (c *carrier) Release(ctx context.Context, key, token string) (driver.ReleaseResult, error) {
	c.releases.Add(1)
	return c.Backend.Release(ctx, key, token)
}

func (c *carrier) ReleaseAcquire(ctx context.Context, key, token string, fence uint64, next driver.AcquireRequest) (driver.ReleaseAcquireResult, error) {
	c.carried.Add(1)
	if c.gate != nil {
		c.entered <- struct{}{}
		<-c.gate
	}
	if c.hang.Load() {
		<-ctx.Done()
		return driver.ReleaseAcquireResult{AcquireErr: ctx.Err()}, ctx.Err()
	}
	return c.Backend.ReleaseAcquire(ctx, key, token, fence, next)
}

// busyOnce returns a WithOnBusy option and a channel that receives each
// refusal it reports.
func busyOnce() (dlock.Option, <-chan *dlock.NotObtainedError) {
	ch := make(chan *dlock.NotObtainedError, 64)
	return dlock.WithOnBusy(func(e *dlock.NotObtainedError) {
		select {
		case ch <- e:
		default:
		}
	}), ch
}

func TestWaiterRidesItsClientsRelease(t *testing.T) {
	b := newCarrier()
	c := dlock.New(b)
	defer c.Close()
	ctx := t.Context()
	holder, err := c.Mutex("ride").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The waiter hears that the lock is held (by its own Client)
	// without asking the store.
	out, e := waiting(t, ctx, func(o dlock.Option) lockFunc { return c.Mutex("ride", o).Lock })
	if e.Holder == "" || e.HolderTTL <= 0 {
		t.Errorf("busy report %+v, want the holder's owner and TTL", e)
	}
	waitParked(t, c, "ride")
	if n := b.acquires.Load(); n != 1 {
		t.Fatalf("%d acquires sent alone before the release, want the holder's 1", n)
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	o := <-out
	if o.err != nil {
		t.Fatal(o.err)
	}
	defer o.l.Unlock(ctx)
	if o.l.Fence() <= holder.Fence() {
		t.Errorf("the waiter's fence %d is not above the holder's %d", o.l.Fence(), holder.Fence())
	}
	if n, m := b.acquires.Load(), b.carried.Load(); n != 1 || m != 1 {
		t.Errorf("%d acquires alone and %d carried, want 1 and 1: the release carries the waiter's attempt", n, m)
	}
}

// TestParkedFairWaiterKeepsItsArrivalOrder checks that a fair waiter whose
// own Client holds the lock takes its place in the queue as it arrives: a
// waiter of another Client that comes later is granted after it.
func TestParkedFairWaiterKeepsItsArrivalOrder(t *testing.T) {
	b := newCarrier()
	a, other := dlock.New(b), dlock.New(b)
	defer a.Close()
	defer other.Close()
	ctx := t.Context()
	holder, err := a.Mutex("fair", dlock.Fair()).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lock := func(c *dlock.Client) <-chan outcome {
		out, _ := waiting(t, ctx, func(o dlock.Option) lockFunc { return c.Mutex("fair", dlock.Fair(), o).Lock })
		return out
	}
	first := lock(a)
	// The first waiter's request is on the store (or parked) once its
	// busy report came; a parked one would stay parked until the release.
	time.Sleep(50 * time.Millisecond)
	second := lock(other)
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	var o outcome
	rest := second
	select {
	case o = <-first:
	case o = <-second:
		rest = first
		t.Error("the later waiter, of another Client, was granted first")
	}
	for _, ch := range []<-chan outcome{nil, rest} {
		if ch != nil {
			o = <-ch
		}
		if o.err != nil {
			t.Fatal(o.err)
		}
		if err := o.l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// waitParked waits until an attempt of c is parked on key: a waiter's
// busy report comes before its attempt parks.
func waitParked(t *testing.T, c *dlock.Client, key string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !dlock.ParkedOn(c, key); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the waiter's attempt never parked")
		}
	}
}

// lockFunc is a Lock, RLock or Acquire method value.
type lockFunc func(context.Context) (*dlock.Lease, error)

// waiting starts, in a goroutine, the lock that lock makes with a
// WithOnBusy option, and returns once it has reported the lock held, with
// that report; its outcome arrives on the channel.
func waiting(t *testing.T, ctx context.Context, lock func(dlock.Option) lockFunc) (<-chan outcome, *dlock.NotObtainedError) {
	t.Helper()
	onBusy, busy := busyOnce()
	out := make(chan outcome, 1)
	go func() {
		l, err := lock(onBusy)(ctx)
		out <- outcome{l, err}
	}()
	select {
	case e := <-busy:
		return out, e
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter reported nothing")
		return nil, nil
	}
}

// waitingLock is waiting for a Lock of c's Mutex name.
func waitingLock(t *testing.T, ctx context.Context, c *dlock.Client, name string) <-chan outcome {
	t.Helper()
	out, _ := waiting(t, ctx, func(o dlock.Option) lockFunc { return c.Mutex(name, o).Lock })
	return out
}

// outcome is what a Lock in a goroutine returned.
type outcome struct {
	l   *dlock.Lease
	err error
}

func TestParkedAttemptGoesOutWhenTheHolderIsLost(t *testing.T) {
	b := newFaulty()
	c := dlock.New(b, dlock.WithTTL(400*time.Millisecond))
	defer c.Close()
	ctx := t.Context()
	holder, err := c.Mutex("lost").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The holder's renewals hang: its lease is lost at its deadline, with
	// no release, and the store lets the hold lapse at its TTL.
	b.renewGate = make(chan struct{})
	defer close(b.renewGate)
	out := waitingLock(t, ctx, c, "lost")
	select {
	case o := <-out:
		if o.err != nil {
			t.Fatalf("the waiter failed: %v", o.err)
		}
		if !errors.As(holder.Err(), new(*dlock.LostError)) {
			t.Errorf("the waiter got the lock while the holder's lease was %v", holder.Err())
		}
		if o.l.Fence() <= holder.Fence() {
			t.Errorf("fence %d after the lost holder's %d", o.l.Fence(), holder.Fence())
		}
		_ = o.l.Unlock(ctx)
	case <-time.After(10 * time.Second):
		t.Fatal("the parked waiter never went on after the holder's loss")
	}
}

func TestParkedAttemptEndsWithItsContext(t *testing.T) {
	b := newCarrier()
	c := dlock.New(b)
	defer c.Close()
	ctx := t.Context()
	holder, err := c.Mutex("ctx").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := c.Mutex("ctx").Lock(wctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock = %v, want its context's end", err)
	}
	// The parked attempt never went out: there is nothing to clean up.
	if n := b.releases.Load(); n != 0 {
		t.Errorf("%d clean-up releases sent for an attempt that never went out", n)
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.carried.Load(); n != 0 {
		t.Errorf("the release carried %d attempts of a wait that had ended", n)
	}
	if info := held(t, b.Backend, "ctx"); info.Holds != 0 || info.Queued != 0 || info.WriterWaiting {
		t.Errorf("the lock after both left: %+v, want free", info)
	}
}

func TestCloseEndsAParkedAttempt(t *testing.T) {
	b := newCarrier()
	c := dlock.New(b)
	ctx := t.Context()
	if _, err := c.Mutex("close").Lock(ctx); err != nil {
		t.Fatal(err)
	}
	out := waitingLock(t, ctx, c, "close")
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited for the parked attempt")
	}
	if o := <-out; !errors.Is(o.err, dlock.ErrClosed) {
		t.Errorf("the parked Lock = %v, want ErrClosed", o.err)
	}
}

func TestCarrierCutShortLeavesTheWaitGoing(t *testing.T) {
	b := newCarrier()
	c := dlock.New(b)
	defer c.Close()
	ctx := t.Context()
	holder, err := c.Mutex("cut").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := waitingLock(t, ctx, c, "cut")
	// The release and the attempt it carries never come back: Unlock's
	// context ends them. The waiter's own context has not ended, so its
	// wait goes on, and it gets the lock once the release, sent again in
	// the background, frees it.
	b.hang.Store(true)
	uctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := holder.Unlock(uctx); err == nil {
		t.Fatal("Unlock of a release that hung reported success")
	}
	b.hang.Store(false)
	select {
	case o := <-out:
		if o.err != nil {
			t.Fatalf("the waiter's Lock failed with the release's context: %v", o.err)
		}
		_ = o.l.Unlock(ctx)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter never got the lock")
	}
}

func TestWaitEndedWhileCarriedLeavesNothing(t *testing.T) {
	b := newCarrier()
	b.gate, b.entered = make(chan struct{}), make(chan struct{}, 1)
	c := dlock.New(b, dlock.WithTTL(time.Minute)) // a leftover outlives the test
	defer c.Close()
	ctx := t.Context()
	holder, err := c.Mutex("gone").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	out := waitingLock(t, wctx, c, "gone")
	unlocked := make(chan error, 1)
	go func() { unlocked <- holder.Unlock(ctx) }()
	<-b.entered // the release carries the waiter's attempt, and is held up
	cancel()
	if o := <-out; !errors.Is(o.err, context.Canceled) {
		t.Fatalf("the waiter's Lock = %v, want its context's end", o.err)
	}
	// The pair lands after the waiter left: its acquire is granted, and
	// must be given back.
	close(b.gate)
	if err := <-unlocked; err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		info := held(t, b.Backend, "gone")
		if info.Holds == 0 && info.Queued == 0 && !info.WriterWaiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left on the store after the waiter gave up: %+v", info)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestOnBusyMayReleaseTheClientsHold(t *testing.T) {
	b := newCarrier()
	c := dlock.New(b) // closed only when nothing hangs: Close would wait for the hung Lock
	ctx := t.Context()
	holder, err := c.Mutex("busy").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The waiter's report of the hold lets the holder go: a report made
	// with the attempt parked would have the release wait for the
	// attempt's waiter, which waits for the report.
	released := make(chan error, 1)
	onBusy := dlock.WithOnBusy(func(*dlock.NotObtainedError) {
		select {
		case released <- holder.Unlock(ctx):
		default:
		}
	})
	out := make(chan outcome, 1)
	go func() {
		l, err := c.Mutex("busy", onBusy).Lock(ctx)
		out <- outcome{l, err}
	}()
	select {
	case o := <-out:
		if o.err != nil {
			t.Fatal(o.err)
		}
		_ = o.l.Unlock(ctx)
	case <-time.After(10 * time.Second):
		t.Fatal("Lock never returned: the release in WithOnBusy waits for the parked attempt it carries")
	}
	if err := <-released; err != nil {
		t.Errorf("the holder's Unlock in WithOnBusy: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Error(err)
	}
}

func TestReaderRidesItsClientsWriterRelease(t *testing.T) {
	b := newCarrier()
	c := dlock.New(b)
	defer c.Close()
	ctx := t.Context()
	writer, err := c.RWMutex("rw").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := waiting(t, ctx, func(o dlock.Option) lockFunc { return c.RWMutex("rw", o).RLock })
	waitParked(t, c, "rw")
	if err := writer.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	o := <-out
	if o.err != nil {
		t.Fatal(o.err)
	}
	defer o.l.Unlock(ctx)
	if n, m := b.acquires.Load(), b.carried.Load(); n != 1 || m != 1 {
		t.Errorf("%d acquires alone and %d carried, want the writer's 1 and the reader's 1 carried", n, m)
	}
	if o.l.Fence() <= writer.Fence() {
		t.Errorf("the reader's fence %d is not above the writer's %d", o.l.Fence(), writer.Fence())
	}
}
