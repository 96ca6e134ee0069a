// Events for observers (WithObserver): what a Client reports of its locks,
// for metrics, traces and logs, with no dependency.

package dlock

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"
)

// An Observer receives the events of a Client (WithObserver): waits,
// grants, holds, renewals, losses and store calls. Observe is called on the
// goroutine that made the event, often one that holds a lock or renews
// many: it must be quick and must not block, nor call the Client. It is
// called concurrently from many goroutines.
// An ObserverFunc is enough to count or log.
type Observer interface {
	Observe(e Event)
}

// A ContextObserver is an Observer that follows each Lock or TryLock call,
// and the lease it returns, through a context: for tracing, where the work
// done under a lock should nest under the lock's span. A Client whose
// observer (WithObserver) is one calls ObserveContext, in place of
// Observe, for these events:
//
//   - EventLockStarted, with the ctx given to Lock or TryLock;
//   - the call's end (EventLockGranted, EventLockNotObtained or
//     EventLockFailed), with the context ObserveContext returned for its
//     start;
//   - EventUnlocked, with the lease's Context;
//   - EventDoStarted, with the ctx given to Client.Do, and EventDoEnded,
//     with the context ObserveContext returned for it, which is also the
//     ctx of Do's Lock.
//
// For EventLockGranted, the context ObserveContext returns gives its values
// (not its cancellation or deadline) to the lease's Context: a span put in
// it is the parent of what runs under lease.Context(). Client.Do gives its
// values to fn's context too, and those of the context returned for
// EventDoStarted to the context of Do's Lock, fn and Unlock; their
// cancellation and deadline stay the caller's. What it returns for the
// other events is not used.
// Every other event (EventLost, renewals,
// store calls) goes to Observe. The rules of Observe hold for
// ObserveContext too: quick, non-blocking, no calls into the Client.
type ContextObserver interface {
	Observer
	ObserveContext(ctx context.Context, e Event) context.Context
}

// ObserverFunc makes a function an Observer.
type ObserverFunc func(e Event)

// Observe calls f(e).
func (f ObserverFunc) Observe(e Event) { f(e) }

// WithObserver sends the Client's events to o (see Event). It is a Client
// option (give it to New). An observer that only counts costs the
// uncontended Lock and Unlock of a store on the network well under 1%,
// and about 0.15µs (10-14%) of memlock's 1.4µs (BenchmarkObserverCost,
// BenchmarkObserverCostPaired; docs/OBSERVABILITY.md).
func WithObserver(o Observer) Option {
	return optionFunc(func(opts *options) { opts.observer, opts.observerSet = o, true })
}

// EventKind says what an Event reports.
type EventKind uint8

const (
	// EventLockStarted: Lock or TryLock was called (TryLock set for
	// TryLock).
	EventLockStarted EventKind = iota + 1
	// EventLockGranted: the call obtained the lock. Wait is how long the
	// call took, Attempts how many requests it sent, Fence the grant's,
	// Handoff whether a release handed the lock over directly.
	EventLockGranted
	// EventLockNotObtained: TryLock found the lock held, or Lock's wait
	// ended (its context, WithWait, Close) without it. Err says which.
	EventLockNotObtained
	// EventLockFailed: the store failed or the call was refused (ErrInvalid,
	// a closed Client); Err says why.
	EventLockFailed
	// EventUnlocked: Unlock ended a lease. Held is how long it was held,
	// Latency how long Unlock took; Err is Unlock's error (ErrNotHeld when
	// the lease had been lost, ErrReleased for a second Unlock: both are
	// reported, though they end nothing).
	EventUnlocked
	// EventLost: a lease was lost, for Reason (its Err is the *LostError).
	EventLost
	// EventRenewed: one renewal round trip, of Count leases (automatic
	// renewal, in a batch, or Lease.Refresh), of which Failed failed or
	// found their lease gone; Latency is its round trip.
	EventRenewed
	// EventStoreCall: one call to the store, Op "acquire", "release" or
	// "withdraw", with its Latency and error (renewals are EventRenewed).
	EventStoreCall
	// EventDoStarted: Client.Do was called (Name, Type TypeMutex). A
	// ContextObserver gets it with Do's ctx, and the values of what it
	// returns are in the ctx of Do's Lock (and its other events): a span
	// there is their parent.
	EventDoStarted
	// EventDoEnded: Client.Do returned, Err (fn's error, or Lock's, or the
	// loss or Unlock error joined to it), after Latency; Fence is the
	// grant's (0 when Lock failed). A ContextObserver gets it with the
	// context it returned for EventDoStarted.
	EventDoEnded
)

// String returns the kind's name, as in "lock granted".
func (k EventKind) String() string {
	switch k {
	case EventLockStarted:
		return "lock started"
	case EventLockGranted:
		return "lock granted"
	case EventLockNotObtained:
		return "lock not obtained"
	case EventLockFailed:
		return "lock failed"
	case EventUnlocked:
		return "unlocked"
	case EventLost:
		return "lost"
	case EventRenewed:
		return "renewed"
	case EventStoreCall:
		return "store call"
	case EventDoStarted:
		return "do started"
	case EventDoEnded:
		return "do ended"
	}
	return "EventKind(" + strconv.Itoa(int(k)) + ")"
}

// Lock types, as Event.Type names them.
const (
	TypeMutex     = "mutex"
	TypeReader    = "reader"    // RWMutex.RLock
	TypeWriter    = "writer"    // RWMutex.Lock
	TypeSemaphore = "semaphore" // a Semaphore's permit
)

// Event is one thing a Client did or saw, for an Observer. Which fields
// are set depends on Kind (see the EventKind constants); the others are
// zero. Name is unbounded (as many values as your lock names): keep it out
// of metric labels unless you map it to a few values.
type Event struct {
	Kind EventKind
	// Client is the identity of the Client that made the event ("host|pid
	// N", then " client M" for a process's later Clients): with Name, Type
	// and Fence it names one grant among the Clients that share an
	// observer. Not a metric label: it varies per process.
	Client string
	// Store names the kind of store the Client's backend uses, as the
	// backend says (driver.StoreNamer): "memory", "sqlite", "mysql",
	// "postgres", "redis", "redlock" or "etcd" for the backends of this
	// module; "" when the backend does not say. A metric label: one value
	// per Client.
	Store string
	// Name is the lock's name, without the key prefix; "" for a renewal
	// batch of several locks, and for store calls of such a batch.
	Name string
	// Type is TypeMutex, TypeReader, TypeWriter or TypeSemaphore; "" for
	// a renewal batch.
	Type string
	// TryLock: the call was TryLock (EventLockStarted, EventLockGranted,
	// EventLockNotObtained, EventLockFailed).
	TryLock bool
	// Fence is the grant's (EventLockGranted, EventUnlocked, EventLost,
	// EventDoEnded).
	Fence uint64
	// Wait is how long Lock or TryLock took: from when it sent its first
	// request (from the call, for a handle that may wait before sending:
	// reentrant, without an owner ID) to the answer that granted the lock,
	// or to the call's end. These are clock reads the call makes anyway.
	Wait time.Duration
	// Attempts is how many acquire requests the call sent.
	Attempts int
	// Handoff: a release granted the lock to this waiter directly.
	Handoff bool
	// Held is how long the lease was held (EventUnlocked): from the
	// grant's answer to Unlock's end.
	Held time.Duration
	// Reason is why a lease was lost (EventLost).
	Reason LostReason
	// Count and Failed are the leases of a renewal round trip, and those
	// whose renewal failed or found them gone (EventRenewed).
	Count, Failed int
	// Latency is a store call's round trip (EventRenewed, EventStoreCall),
	// or how long Unlock took (EventUnlocked), or Do (EventDoEnded).
	Latency time.Duration
	// Op is the store call (EventStoreCall).
	Op string
	// Err is the call's error, or the loss.
	Err error
}

// observer is the Client's observer, or nil; a method on a nil observer
// does nothing, so that callers need not check.
//
// Its clock is the monotonic one, read as the time since base
// (time.Since reads only that clock; time.Now reads the wall clock too,
// twice the cost), and it reuses the reads the core makes anyway (an
// acquire's send and answer times): an observer that counts should cost
// the uncontended Lock and Unlock as little as possible
// (BenchmarkObserverCost).
type observer struct {
	o      Observer
	co     ContextObserver // o, when it is one; else nil
	prefix string          // the Client's key prefix, which names leave out
	client string          // the Client's identity (Event.Client)
	store  string          // the backend's store (Event.Store)
	base   time.Time       // the origin of now and at
}

func newObserver(o Observer, prefix, client, store string) *observer {
	if o == nil {
		return nil
	}
	co, _ := o.(ContextObserver)
	return &observer{o: o, co: co, prefix: prefix, client: client, store: store, base: time.Now()}
}

// now is the observer's clock: the time since its base, one read of the
// monotonic clock; 0 (no clock read) on a Client without an observer.
func (ob *observer) now() time.Duration {
	if ob == nil {
		return 0
	}
	return time.Since(ob.base)
}

// at converts a time read by the core (with its monotonic reading) to the
// observer's clock, with no clock read.
func (ob *observer) at(t time.Time) time.Duration {
	return t.Sub(ob.base)
}

// storeCall reports a store call of op on key that began at start (now).
func (ob *observer) storeCall(op, key string, start time.Duration, err error) {
	if ob != nil {
		ob.o.Observe(Event{Kind: EventStoreCall, Client: ob.client, Store: ob.store, Name: strings.TrimPrefix(key, ob.prefix), Op: op, Latency: ob.now() - start, Err: err})
	}
}

// acquired reports an acquire of the lock name that took took.
func (ob *observer) acquired(name string, took time.Duration, err error) {
	ob.o.Observe(Event{Kind: EventStoreCall, Client: ob.client, Store: ob.store, Name: name, Op: "acquire", Latency: took, Err: err})
}

// typeOf names the lock type of a handle made by kind with mode.
func typeOf(kind string, shared bool) string {
	switch {
	case kind == "Semaphore":
		return TypeSemaphore
	case kind == "RWMutex" && shared:
		return TypeReader
	case kind == "RWMutex":
		return TypeWriter
	}
	return TypeMutex
}

// started reports a Lock (or TryLock, try) of h called with ctx, and
// returns when it started and, for a ContextObserver, the context it
// returned (for lockEnded). It reads no clock (start is 0) where the
// call's first request is sent without a wait before it: startOf takes
// the send time, which the core reads anyway, for the call's start. A
// handle with a gate (reentrant, no owner ID) may wait at it first.
func (ob *observer) started(ctx context.Context, h *handle, try bool) (start time.Duration, _ context.Context) {
	e := Event{Kind: EventLockStarted, Client: ob.client, Store: ob.store, Name: h.name, Type: h.typ, TryLock: try}
	if ob.co != nil {
		ctx = ob.co.ObserveContext(ctx, e)
	} else {
		ob.o.Observe(e)
		ctx = nil
	}
	if h.drains {
		start = ob.now()
	}
	return start, ctx
}

// startOf returns the start of a Lock or TryLock call: start, when started
// read the clock, else the send time of its first request (sent), else,
// when it sent none, now.
func (ob *observer) startOf(start time.Duration, sent time.Time) time.Duration {
	switch {
	case start != 0:
		return start
	case !sent.IsZero():
		return ob.at(sent)
	}
	return ob.now()
}

// lockEnded reports how a Lock or TryLock of h that started at start
// ended: with lease l, or err, after attempts requests. octx is what
// started returned.
func (ob *observer) lockEnded(octx context.Context, h *handle, try bool, start time.Duration, l *Lease, attempts int, handoff bool, err error) {
	var end time.Duration
	if l != nil && l.at != 0 {
		end = l.at // the grant's answer, which try timed
	} else {
		end = ob.now()
	}
	e := Event{Client: ob.client, Store: ob.store, Name: h.name, Type: h.typ, TryLock: try, Wait: end - start, Attempts: attempts, Handoff: handoff, Err: err}
	switch {
	case l != nil:
		l.at = end
		e.Kind, e.Fence = EventLockGranted, l.Fence()
	case errors.Is(err, ErrNotObtained):
		e.Kind = EventLockNotObtained
	default:
		e.Kind = EventLockFailed
	}
	if ob.co == nil {
		ob.o.Observe(e)
		return
	}
	if octx == nil {
		octx = context.Background()
	}
	if lctx := ob.co.ObserveContext(octx, e); l != nil && lctx != nil {
		l.observedContext(lctx)
		if g, _ := lctx.Value(doGrantKey{}).(*doGrant); g != nil {
			g.ctx = lctx
		}
	}
}

// doStarted reports a Client.Do of name called with ctx, and returns the
// context for the rest of the call (a ContextObserver's) and its start.
func (ob *observer) doStarted(ctx context.Context, name string) (context.Context, time.Duration) {
	e := Event{Kind: EventDoStarted, Client: ob.client, Store: ob.store, Name: name, Type: TypeMutex}
	if ob.co != nil {
		ctx = valuesOf(ctx, ob.co.ObserveContext(ctx, e))
	} else {
		ob.o.Observe(e)
	}
	return ctx, ob.now()
}

// valuesOf returns ctx with the values of octx, which a ContextObserver
// returned for ctx, before ctx's own: its span, say. Cancellation and
// deadline stay ctx's: an observer's context never decides how long a
// call may take (one that returns context.Background() for events it does
// not know must not cut a caller's deadline off).
func valuesOf(ctx, octx context.Context) context.Context {
	if octx == nil || octx == ctx {
		return ctx
	}
	return valuesCtx{Context: ctx, vals: octx}
}

// valuesCtx is valuesOf's context. (The context package tells a parent's
// cancellation from its Done channel, not from Value, so a context made
// from this one is cancelled with ctx, not with vals.)
type valuesCtx struct {
	context.Context
	vals context.Context
}

// Value looks the key up in vals, then in the embedded context; but the
// context package's own key (with which context.Cause and a child's
// cancellation find the canceller) goes to the embedded context alone, so
// that the caller's cancellation cause is the one seen.
func (c valuesCtx) Value(key any) any {
	if key == cancelKey {
		return c.Context.Value(key)
	}
	if v := c.vals.Value(key); v != nil {
		return v
	}
	return c.Context.Value(key)
}

// cancelKey is the key under which the context package finds a context's
// canceller, learnt by asking context.Cause of a probe (nil, matching no
// key, should a later Go find it another way).
var cancelKey = func() any {
	ended, cancel := context.WithCancel(context.Background())
	cancel() // Cause asks for the key only of a context that has ended
	p := &keyProbe{Context: ended}
	_ = context.Cause(p)
	return p.key
}()

// keyProbe records the first key its Value is asked for.
type keyProbe struct {
	context.Context
	key any
}

func (p *keyProbe) Value(key any) any {
	if p.key == nil {
		p.key = key
	}
	return nil
}

// doEnded reports the end of a Client.Do of name that began at start,
// with the grant's fence and Do's error; ctx is what doStarted returned.
func (ob *observer) doEnded(ctx context.Context, name string, start time.Duration, fence uint64, err error) {
	e := Event{Kind: EventDoEnded, Client: ob.client, Store: ob.store, Name: name, Type: TypeMutex, Fence: fence, Latency: ob.now() - start, Err: err}
	if ob.co != nil {
		ob.co.ObserveContext(ctx, e)
		return
	}
	ob.o.Observe(e)
}

// doGrantKey is the context key under which Client.Do asks lockEnded for
// the context that a ContextObserver returned for its grant.
type doGrantKey struct{}

// doGrant receives that context.
type doGrant struct{ ctx context.Context }

// forDo returns the context for Do's Lock, and where the observer's
// context for the grant will be; nil without a ContextObserver.
func (ob *observer) forDo(ctx context.Context) (context.Context, *doGrant) {
	if ob == nil || ob.co == nil {
		return ctx, nil
	}
	g := &doGrant{}
	return context.WithValue(ctx, doGrantKey{}, g), g
}

// from returns the base of Do's fn context: ctx with the values of the
// observer's context for the grant (see valuesOf), with no doGrant in it
// for later Locks to write to.
func (g *doGrant) from(ctx context.Context) context.Context {
	if g == nil || g.ctx == nil {
		return ctx
	}
	return context.WithValue(valuesOf(ctx, g.ctx), doGrantKey{}, (*doGrant)(nil))
}

// unlocked reports the Unlock of l that began at start and returned err.
func (ob *observer) unlocked(l *Lease, start time.Duration, err error) {
	now := ob.now()
	e := Event{Kind: EventUnlocked, Client: ob.client, Store: ob.store, Name: l.g.name, Type: l.g.typ, Fence: l.g.fence, Latency: now - start, Err: err}
	if l.at != 0 {
		e.Held = now - l.at
	}
	if ob.co != nil {
		ob.co.ObserveContext(l.Context(), e)
		return
	}
	ob.o.Observe(e)
}

// lost reports the loss of g's leases.
func (ob *observer) lost(g *grant, lost *LostError) {
	if ob != nil && lost != nil {
		ob.o.Observe(Event{Kind: EventLost, Client: ob.client, Store: ob.store, Name: g.name, Type: g.typ, Fence: g.fence, Reason: lost.Reason, Err: lost})
	}
}

// renewed reports one renewal round trip of n leases, sent at sent, of
// which failed failed or were gone.
func (ob *observer) renewed(n, failed int, sent time.Time) {
	if ob != nil {
		ob.o.Observe(Event{Kind: EventRenewed, Client: ob.client, Store: ob.store, Count: n, Failed: failed, Latency: time.Since(sent)})
	}
}

// boolInt is 1 for true.
func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
