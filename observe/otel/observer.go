package otel

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/dlock-go/dlock/observe/otel"

// Attribute keys, on metrics and spans.
const (
	// KeyStore is the kind of store behind the Client (dlock.Event.Store):
	// memory, sqlite, mysql, postgres, redis, redlock or etcd; unknown for
	// a backend that does not say. On every metric, and on spans.
	KeyStore = attribute.Key("dlock.store")
	// KeyType is the lock type: mutex, reader, writer or semaphore.
	KeyType = attribute.Key("dlock.lock.type")
	// KeyCall is lock or trylock.
	KeyCall = attribute.Key("dlock.lock.call")
	// KeyOutcome is granted, not_obtained or failed (a Lock or TryLock),
	// ok or error (a store call).
	KeyOutcome = attribute.Key("dlock.outcome")
	// KeyLock is what WithLockName's function made of the lock's name
	// (metrics only).
	KeyLock = attribute.Key("dlock.lock")
	// KeyName is the lock's full name (spans only).
	KeyName = attribute.Key("dlock.lock.name")
	// KeyReason is why a lease was lost: expired, missing, unreachable or
	// closed.
	KeyReason = attribute.Key("dlock.lost.reason")
	// KeyOp is a store call: acquire, release or withdraw.
	KeyOp = attribute.Key("dlock.store.op")
	// KeyFence is the grant's fencing token (spans).
	KeyFence = attribute.Key("dlock.fence")
	// KeyWait is how long Lock or TryLock took, in seconds (spans).
	KeyWait = attribute.Key("dlock.wait")
	// KeyAttempts is how many acquire requests the call sent (spans).
	KeyAttempts = attribute.Key("dlock.attempts")
	// KeyHandoff says a release handed the lock over directly (spans).
	KeyHandoff = attribute.Key("dlock.handoff")
)

// Observer reports a Client's events through OpenTelemetry. It is a
// dlock.ContextObserver: give it to dlock.WithObserver (one Observer may
// serve several Clients). Make it with New.
type Observer struct {
	tracer   trace.Tracer
	lockName func(string) string // nil: no KeyLock on metrics

	wait, hold, renewLatency, storeCalls metric.Float64Histogram
	grants, notObtained, failures        metric.Int64Counter
	losses, renewals, renewFailures      metric.Int64Counter
	leases, waiters                      metric.Int64UpDownCounter

	mu    sync.Mutex
	holds map[grantKey][]*hold // live leases per grant: their hold spans
}

var _ dlock.ContextObserver = (*Observer)(nil)

// grantKey names one grant: the leases of a reentrant handle held at once
// share it, and one EventLost ends them all.
type grantKey struct {
	client, name, typ string
	fence             uint64
}

// hold is one live lease: its span, and the attributes of its metrics.
type hold struct {
	span  trace.Span
	attrs attribute.Set
}

// An Option configures New.
type Option interface{ apply(*config) }

type config struct {
	mp       metric.MeterProvider
	tp       trace.TracerProvider
	lockName func(string) string
	buckets  []float64
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithMeterProvider sets where the metrics go. The default is
// otel.GetMeterProvider() at New.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) { c.mp = mp })
}

// WithTracerProvider sets where the spans go. The default is
// otel.GetTracerProvider() at New.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) { c.tp = tp })
}

// WithLockName adds the attribute dlock.lock to every metric of a lock,
// with the value f returns for the lock's name. Names are unbounded: f must
// map them to a few values (say, "orders:42" to "orders"), since each value
// is a series of its own. f must be quick. The default is no such
// attribute. Spans carry the full name (dlock.lock.name) either way.
func WithLockName(f func(name string) string) Option {
	return optionFunc(func(c *config) { c.lockName = f })
}

// WithBuckets sets the bucket boundaries, in seconds, of every duration
// histogram. The default is 0.5ms to about 16s, doubling.
func WithBuckets(b []float64) Option {
	return optionFunc(func(c *config) { c.buckets = b })
}

// New returns an Observer that records to the providers of its options.
// It returns an error when an instrument cannot be made.
func New(opts ...Option) (*Observer, error) {
	cfg := config{}
	for _, o := range opts {
		o.apply(&cfg)
	}
	if cfg.mp == nil {
		cfg.mp = otel.GetMeterProvider()
	}
	if cfg.tp == nil {
		cfg.tp = otel.GetTracerProvider()
	}
	if cfg.buckets == nil {
		for b := 0.0005; len(cfg.buckets) < 16; b *= 2 {
			cfg.buckets = append(cfg.buckets, b)
		}
	}
	o := &Observer{tracer: cfg.tp.Tracer(ScopeName), lockName: cfg.lockName, holds: map[grantKey][]*hold{}}
	m := cfg.mp.Meter(ScopeName)
	var errs []error
	hist := func(name, desc string) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(cfg.buckets...))
		errs = append(errs, err)
		return h
	}
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	updown := func(name, unit, desc string) metric.Int64UpDownCounter {
		c, err := m.Int64UpDownCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	o.wait = hist("dlock.lock.wait", "How long Lock and TryLock calls took, by outcome (granted, not_obtained, failed).")
	o.hold = hist("dlock.lock.hold", "How long leases were held, from the store's answer that granted them to Unlock, for leases ended by Unlock.")
	o.renewLatency = hist("dlock.renewal.duration", "Round trips of renewals to the store (a batch of automatic renewals, or one Refresh).")
	o.storeCalls = hist("dlock.store.call.duration", "Acquire, release and withdraw calls to the store, by op and outcome (ok, error).")
	o.grants = counter("dlock.lock.grants", "{call}", "Lock and TryLock calls that obtained the lock.")
	o.notObtained = counter("dlock.lock.not_obtained", "{call}", "Lock and TryLock calls that ended without the lock.")
	o.failures = counter("dlock.lock.failures", "{call}", "Lock and TryLock calls that failed: a store error, or a call refused.")
	o.losses = counter("dlock.lease.losses", "{lease}", "Leases lost before Unlock, by reason (expired, missing, unreachable, closed).")
	o.renewals = counter("dlock.lease.renewals", "{renewal}", "Lease renewals sent (automatic or Refresh), one per lease.")
	o.renewFailures = counter("dlock.lease.renewal_failures", "{renewal}", "Lease renewals that failed or found the lease gone.")
	o.leases = updown("dlock.leases", "{lease}", "Leases held now: granted, and neither unlocked nor lost.")
	o.waiters = updown("dlock.waiters", "{call}", "Lock and TryLock calls in progress.")
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return o, nil
}

// callerKey is the context key under which ObserveContext keeps the
// Lock's own ctx, the parent of the hold span.
type callerKey struct{}

// ObserveContext records the events of a Lock or TryLock call and its
// lease (see dlock.ContextObserver); dlock calls it.
func (o *Observer) ObserveContext(ctx context.Context, e dlock.Event) context.Context {
	switch e.Kind {
	case dlock.EventLockStarted:
		o.waiters.Add(ctx, 1, metric.WithAttributeSet(o.set(e, KeyType.String(e.Type))))
		spanName := "dlock.Lock"
		if e.TryLock {
			spanName = "dlock.TryLock"
		}
		sctx, _ := o.tracer.Start(ctx, spanName, trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithAttributes(KeyName.String(e.Name), KeyType.String(e.Type), KeyStore.String(store(e))))
		return context.WithValue(sctx, callerKey{}, ctx)
	case dlock.EventLockGranted, dlock.EventLockNotObtained, dlock.EventLockFailed:
		return o.lockEnded(ctx, e)
	case dlock.EventUnlocked:
		o.unlocked(ctx, e)
		return ctx
	case dlock.EventDoStarted:
		// The span of the whole Do: its Lock, Hold and Unlock nest in it.
		sctx, _ := o.tracer.Start(ctx, "dlock.Do", trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithAttributes(KeyName.String(e.Name), KeyType.String(e.Type), KeyStore.String(store(e))))
		return sctx
	case dlock.EventDoEnded:
		span := trace.SpanFromContext(ctx)
		if e.Fence != 0 {
			span.SetAttributes(KeyFence.Int64(int64(e.Fence)))
		}
		setError(span, e.Err)
		span.End()
		return ctx
	}
	o.Observe(e)
	return ctx
}

// lockEnded records the end of a Lock or TryLock call, whose span is in
// ctx, and for a grant returns the context of the hold span.
func (o *Observer) lockEnded(ctx context.Context, e dlock.Event) context.Context {
	typ := o.set(e, KeyType.String(e.Type))
	o.waiters.Add(ctx, -1, metric.WithAttributeSet(typ))
	call, outcome, count := "lock", "granted", o.grants
	if e.TryLock {
		call = "trylock"
	}
	switch e.Kind {
	case dlock.EventLockNotObtained:
		outcome, count = "not_obtained", o.notObtained
	case dlock.EventLockFailed:
		outcome, count = "failed", o.failures
	}
	o.wait.Record(ctx, e.Wait.Seconds(), metric.WithAttributeSet(o.set(e, KeyType.String(e.Type), KeyCall.String(call), KeyOutcome.String(outcome))))
	count.Add(ctx, 1, metric.WithAttributeSet(o.set(e, KeyType.String(e.Type), KeyCall.String(call))))

	span := trace.SpanFromContext(ctx)
	span.SetAttributes(KeyOutcome.String(outcome), KeyWait.Float64(e.Wait.Seconds()), KeyAttempts.Int(e.Attempts))
	switch e.Kind {
	case dlock.EventLockGranted:
		span.SetAttributes(KeyFence.Int64(int64(e.Fence)), KeyHandoff.Bool(e.Handoff))
	case dlock.EventLockFailed:
		setError(span, e.Err)
	}
	span.End()
	if e.Kind != dlock.EventLockGranted {
		return ctx
	}

	// The hold: a span from the grant to the lease's end, a sibling of the
	// Lock span (both children of the caller's span), carried by the
	// lease's Context.
	caller, _ := ctx.Value(callerKey{}).(context.Context)
	if caller == nil {
		caller = context.Background()
	}
	hctx, hspan := o.tracer.Start(caller, "dlock.Hold", trace.WithAttributes(
		KeyName.String(e.Name), KeyType.String(e.Type), KeyStore.String(store(e)), KeyFence.Int64(int64(e.Fence))),
		trace.WithLinks(trace.LinkFromContext(ctx)))
	o.leases.Add(ctx, 1, metric.WithAttributeSet(typ))
	k := grantKey{e.Client, e.Name, e.Type, e.Fence}
	o.mu.Lock()
	o.holds[k] = append(o.holds[k], &hold{span: hspan, attrs: typ})
	o.mu.Unlock()
	return hctx
}

// unlocked records an Unlock of the lease whose Context is ctx.
func (o *Observer) unlocked(ctx context.Context, e dlock.Event) {
	end := time.Now()
	hspan := trace.SpanFromContext(ctx)
	_, span := o.tracer.Start(ctx, "dlock.Unlock", trace.WithTimestamp(end.Add(-e.Latency)),
		trace.WithAttributes(KeyName.String(e.Name), KeyType.String(e.Type), KeyFence.Int64(int64(e.Fence))))
	setError(span, e.Err)
	span.End(trace.WithTimestamp(end))

	// An Unlock of a lease that had ended (a second Unlock, or one after
	// the loss) ends nothing more.
	if !o.drop(grantKey{e.Client, e.Name, e.Type, e.Fence}, hspan) {
		return
	}
	o.leases.Add(ctx, -1, metric.WithAttributeSet(o.set(e, KeyType.String(e.Type))))
	o.hold.Record(ctx, e.Held.Seconds(), metric.WithAttributeSet(o.set(e, KeyType.String(e.Type))))
	hspan.End(trace.WithTimestamp(end))
}

// drop takes the hold whose span is span off grant k, and reports whether
// it was there.
func (o *Observer) drop(k grantKey, span trace.Span) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	hs := o.holds[k]
	for i, h := range hs {
		if h.span == span {
			hs = append(hs[:i], hs[i+1:]...)
			if len(hs) == 0 {
				delete(o.holds, k)
			} else {
				o.holds[k] = hs
			}
			return true
		}
	}
	return false
}

// Observe records the events that come without a context: losses,
// renewals and store calls. dlock calls it.
func (o *Observer) Observe(e dlock.Event) {
	ctx := context.Background()
	switch e.Kind {
	case dlock.EventLost:
		r := reason(e.Reason)
		o.losses.Add(ctx, 1, metric.WithAttributeSet(o.set(e, KeyType.String(e.Type), KeyReason.String(r))))
		k := grantKey{e.Client, e.Name, e.Type, e.Fence}
		o.mu.Lock()
		hs := o.holds[k]
		delete(o.holds, k)
		o.mu.Unlock()
		for _, h := range hs {
			o.leases.Add(ctx, -1, metric.WithAttributeSet(h.attrs))
			h.span.AddEvent("dlock.lost", trace.WithAttributes(KeyReason.String(r)))
			h.span.SetStatus(codes.Error, "lease lost: "+r)
			h.span.End()
		}
	case dlock.EventRenewed:
		st := metric.WithAttributeSet(o.set(e))
		o.renewals.Add(ctx, int64(e.Count), st)
		o.renewFailures.Add(ctx, int64(e.Failed), st)
		o.renewLatency.Record(ctx, e.Latency.Seconds(), st)
	case dlock.EventStoreCall:
		outcome := "ok"
		if e.Err != nil {
			outcome = "error"
		}
		o.storeCalls.Record(ctx, e.Latency.Seconds(), metric.WithAttributes(KeyStore.String(store(e)), KeyOp.String(e.Op), KeyOutcome.String(outcome)))
	}
}

// set is the attribute set of kvs and KeyStore, with KeyLock when
// WithLockName asked for it. Not for renewals and store calls, which
// have no lock (the store calls of Unlock have one, but the same metric's
// batch renewals would not).
func (o *Observer) set(e dlock.Event, kvs ...attribute.KeyValue) attribute.Set {
	kvs = append(kvs, KeyStore.String(store(e)))
	if o.lockName != nil && e.Kind != dlock.EventRenewed {
		kvs = append(kvs, KeyLock.String(o.lockName(e.Name)))
	}
	return attribute.NewSet(kvs...)
}

// store is KeyStore's value: the backend's kind of store
// (dlock.Event.Store), or "unknown" for a backend that does not say.
func store(e dlock.Event) string {
	if e.Store == "" {
		return "unknown"
	}
	return e.Store
}

// setError records err on span and marks it failed; nothing for nil.
func setError(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
}

// reason is the attribute value of a loss's reason.
func reason(r dlock.LostReason) string {
	switch r {
	case dlock.LostExpired:
		return "expired"
	case dlock.LostMissing:
		return "missing"
	case dlock.LostUnreachable:
		return "unreachable"
	case dlock.LostClosed:
		return "closed"
	}
	return "unknown"
}
