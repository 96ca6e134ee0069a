package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock"
)

// Workload names what a critical section does with the resource.
type Workload uint8

// The workloads.
const (
	// Stock is the stock decrement of the seeds: read the stock, think,
	// and if it was above zero write it back one lower (a purchase).
	Stock Workload = iota
	// Set reads the set of members, thinks, and writes it back with one
	// new member.
	Set
)

// Target is a lock the workload takes: a name and the kind of hold. Mode
// Exclusive is a Mutex; Shared is the read side of an RWMutex (and
// Exclusive with RW set its write side); Permit one of Limit permits of a
// Semaphore. An exclusive holder reads the resource and writes it; a shared
// holder only reads it; a permit holder does not touch it (Check counts
// the permits in use). Reentrant locks are not modelled: a re-entry shares
// its fence and window with the first hold, which Check would report as a
// duplicate fence and an overlap.
type Target struct {
	Name  string
	Mode  Mode
	RW    bool // Exclusive: lock the write side of an RWMutex instead of a Mutex
	Limit int  // Permit: the semaphore's permits
}

// Worker runs critical sections for one client and records each as events.
// Set the fields before the first Step and leave them alone afterwards.
type Worker struct {
	ID       int           // small number, unique in a run: names set members
	Client   string        // the client's name in the events; "" means "c<ID>"
	Locks    *dlock.Client // the dlock client
	Resource Accessor      // what the lock protects
	Sink     Sink          // where the events go
	Workload Workload
	// Think is the longest sleep inside a critical section, between the
	// read and the write; each is random in [0, Think].
	Think time.Duration
	// IgnoreLoss makes the worker write even when its lease has ended
	// during the sleep, as code that checked its lock once and then wrote
	// would. By default it does not write when lease.Err() is set or the
	// lease's Deadline has passed, checked just before the write (a pause
	// between that check and the write still lets a late write through:
	// that is what fencing is for).
	IgnoreLoss bool
	// CancelRate is the chance, for each acquire, unlock and (once per
	// critical section) manual Refresh, that its context is cancelled: half
	// of those before the call starts, half after a random delay of up to
	// CancelWithin, which lands during the call on a store slow enough.
	CancelRate   float64
	CancelWithin time.Duration // 0: 2ms
	// BeforeWrite, when set, is called between the read and the write (a
	// fault injector's hook: pause here).
	BeforeWrite func(ctx context.Context, lease *dlock.Lease)
	// Options are given to every Mutex, RWMutex and Semaphore.
	Options []dlock.Option

	seq atomic.Uint64
}

// Result is what one Step did.
type Result struct {
	Lease    string // the lease's identity in the events, "" when not acquired
	Acquired bool
	Fence    uint64
	Wrote    bool // a write was accepted
	Stale    bool // the resource refused the lease's fence
	Lost     bool // the lease was lost before Unlock
}

func (w *Worker) client() string {
	if w.Client != "" {
		return w.Client
	}
	return fmt.Sprintf("c%d", w.ID)
}

// cancellable returns ctx, or, with chance CancelRate, a context cancelled
// after a random delay.
func (w *Worker) cancellable(ctx context.Context) (context.Context, context.CancelFunc) {
	if w.CancelRate <= 0 || rand.Float64() >= w.CancelRate {
		return ctx, func() {}
	}
	within := w.CancelWithin
	if within <= 0 {
		within = 2 * time.Millisecond
	}
	cctx, cancel := context.WithCancelCause(ctx)
	if rand.N(2) == 0 {
		cancel(errInjectedCancel)
		return cctx, func() {}
	}
	t := time.AfterFunc(rand.N(within)+1, func() { cancel(errInjectedCancel) })
	return cctx, func() {
		t.Stop()
		cancel(context.Canceled)
	}
}

var errInjectedCancel = errors.New("chaos: injected cancellation")

func lockOutcome(err error) Outcome {
	switch {
	case err == nil:
		return OK
	case errors.Is(err, dlock.ErrNotObtained), errors.Is(err, dlock.ErrNotHeld), errors.Is(err, dlock.ErrLost), errors.Is(err, dlock.ErrInvalid),
		errors.Is(err, dlock.ErrConflict):
		return Failed
	}
	return Unknown
}

// Step takes the target once (waiting for it, as Lock does, until ctx ends
// or the Options' WithWait elapses), runs the critical section and unlocks.
// An error is the acquire's: the lock was not taken.
func (w *Worker) Step(ctx context.Context, tg Target) (Result, error) {
	n := w.seq.Add(1)
	lease := fmt.Sprintf("%s/%d.%d", w.client(), w.ID, n) // workers may share a client
	acquire := w.lockFunc(tg)
	actx, acancel := w.cancellable(ctx)
	start := Now()
	l, err := acquire(actx)
	end := Now()
	acancel()
	e := Event{Kind: KindAcquire, Client: w.client(), Name: tg.Name, Lease: lease, Mode: tg.Mode, Limit: tg.Limit, Start: start, End: end, Outcome: lockOutcome(err), Err: errText(err)}
	if err != nil {
		w.Sink.Add(e)
		return Result{}, err
	}
	e.Fence, e.Deadline = l.Fence(), At(l.Deadline())
	w.Sink.Add(e)
	res := Result{Lease: lease, Acquired: true, Fence: l.Fence()}

	// Note when the lease's context ends: at a loss, the moment its
	// holder is told.
	var endedAt atomic.Int64
	stopWatch := context.AfterFunc(l.Context(), func() { endedAt.Store(Now()) })
	defer stopWatch()

	w.critical(ctx, tg, l, lease, n, &res)

	// The holder reads its lease: past the local deadline it must be told
	// that the lease is lost, whenever the goroutine that ends the lease's
	// context gets to run (on a loaded machine, later).
	checked := Now()
	saysHeld := l.Err() == nil
	dl := At(l.Deadline())
	readTold := !saysHeld && checked > dl
	uctx, ucancel := w.cancellable(context.WithoutCancel(ctx))
	ustart := Now()
	uerr := l.Unlock(uctx)
	uend := Now()
	ucancel()
	// A lease lost before Unlock: reported when its context ended, or, if
	// the holder had not been told, by Unlock itself (at ustart; late if
	// the deadline had passed by then).
	if lost := errors.Is(l.Err(), dlock.ErrLost) || errors.Is(uerr, dlock.ErrNotHeld); lost {
		at, how := endedAt.Load(), "told"
		if at == 0 || at > ustart {
			at, how = ustart, "found by Unlock"
		}
		res.Lost = true
		cause := l.Err()
		if !errors.Is(cause, dlock.ErrLost) {
			cause = uerr
		}
		w.Sink.Add(Event{Kind: KindLoss, Client: w.client(), Name: tg.Name, Lease: lease, Mode: tg.Mode, Fence: res.Fence, Start: at, End: at, Deadline: dl, Outcome: OK, Err: errText(cause), Text: how, ReadTold: readTold})
	}
	w.Sink.Add(Event{Kind: KindRelease, Client: w.client(), Name: tg.Name, Lease: lease, Mode: tg.Mode, Fence: res.Fence, Start: ustart, End: uend, Deadline: dl, Outcome: lockOutcome(uerr), Err: errText(uerr)})
	return res, nil
}

func (w *Worker) lockFunc(tg Target) func(context.Context) (*dlock.Lease, error) {
	switch {
	case tg.Mode == Shared:
		return w.Locks.RWMutex(tg.Name, w.Options...).RLock
	case tg.Mode == Permit:
		return w.Locks.Semaphore(tg.Name, tg.Limit, w.Options...).Acquire
	case tg.RW:
		return w.Locks.RWMutex(tg.Name, w.Options...).Lock
	}
	return w.Locks.Mutex(tg.Name, w.Options...).Lock
}

// resourceTimeout bounds one access to the resource.
const resourceTimeout = 10 * time.Second

// critical is the critical section of one lease.
func (w *Worker) critical(ctx context.Context, tg Target, l *dlock.Lease, lease string, n uint64, res *Result) {
	a := Access{Client: w.client(), Name: tg.Name, Lease: lease, Fence: l.Fence(), Mode: tg.Mode}
	var (
		v   Value
		err error
	)
	if tg.Mode != Permit {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resourceTimeout)
		v, err = w.Resource.Read(rctx, a)
		cancel()
		if err != nil {
			res.Stale = errors.Is(err, ErrStale)
			return
		}
	}
	w.refresh(ctx, tg, l, lease)
	if w.Think > 0 {
		t := time.NewTimer(rand.N(w.Think + 1))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	if tg.Mode != Exclusive {
		return
	}
	if w.BeforeWrite != nil {
		w.BeforeWrite(ctx, l)
	}
	if !w.IgnoreLoss && (l.Err() != nil || !time.Now().Before(l.Deadline())) {
		return
	}
	next, ok := w.next(v, n)
	if !ok {
		return
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resourceTimeout)
	err = w.Resource.Write(wctx, a, next)
	cancel()
	res.Wrote = err == nil
	res.Stale = errors.Is(err, ErrStale)
}

// refresh renews the lease by hand, at the CancelRate, under a context that
// may be cancelled, and records it.
func (w *Worker) refresh(ctx context.Context, tg Target, l *dlock.Lease, lease string) {
	if w.CancelRate <= 0 || rand.Float64() >= w.CancelRate {
		return
	}
	rctx, cancel := w.cancellable(ctx)
	start := Now()
	err := l.Refresh(rctx)
	end := Now()
	cancel()
	w.Sink.Add(Event{Kind: KindRenew, Client: w.client(), Name: tg.Name, Lease: lease, Mode: tg.Mode, Fence: l.Fence(), Start: start, End: end, Deadline: At(l.Deadline()), Outcome: lockOutcome(err), Err: errText(err)})
}

// next is the value the critical section writes after reading v, and
// whether it writes at all (a sold-out stock is left alone).
func (w *Worker) next(v Value, n uint64) (Value, bool) {
	switch w.Workload {
	case Set:
		item := int64(w.ID)<<32 | int64(n&0xffffffff)
		m := slices.Clone(v.Members)
		if i, found := slices.BinarySearch(m, item); !found {
			m = slices.Insert(m, i, item)
		}
		return Value{Stock: v.Stock, Members: m}, true
	default:
		if v.Stock <= 0 {
			return v, false
		}
		return Value{Stock: v.Stock - 1, Members: v.Members}, true
	}
}

// Run runs workers against targets until ctx ends or ops critical sections
// (acquires that got the lock) have run in all, whichever comes first (ops
// 0: until ctx ends); critical sections under way when the count is reached
// finish, so a few more may run. Every worker runs one goroutine per
// target. A failed acquire is followed by a random pause of up to backoff
// (0: 50ms) before the next. Run returns, once every goroutine has stopped,
// the number of critical sections run.
func Run(ctx context.Context, workers []*Worker, targets []Target, ops int, backoff time.Duration) int {
	if backoff <= 0 {
		backoff = 50 * time.Millisecond
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		done atomic.Int64
		wg   sync.WaitGroup
	)
	for _, w := range workers {
		for _, tg := range targets {
			wg.Add(1)
			go func() {
				defer wg.Done()
				pause := time.NewTimer(time.Hour)
				defer pause.Stop()
				for ctx.Err() == nil {
					res, err := w.Step(ctx, tg)
					if res.Acquired && done.Add(1) >= int64(ops) && ops > 0 {
						cancel()
						return
					}
					if err != nil {
						pause.Reset(rand.N(backoff) + 1)
						select {
						case <-pause.C:
						case <-ctx.Done():
						}
					}
				}
			}()
		}
	}
	wg.Wait()
	return int(done.Load())
}
