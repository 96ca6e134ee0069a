package otel_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/memlock"
	dlockotel "github.com/dlock-go/dlock/observe/otel"
	"github.com/dlock-go/dlock/redislock"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// forceReleaser deletes a lock whoever holds it (memlock and redislock
// both can), to make a holder lose its lease.
type forceReleaser interface {
	ForceRelease(ctx context.Context, key string) (driver.LockInfo, bool, error)
}

// setup returns an Observer recording to an in-memory span exporter and a
// manual metric reader, with the lock attribute "orders:1" -> "orders".
func setup(t *testing.T) (*dlockotel.Observer, *tracetest.InMemoryExporter, *sdkmetric.ManualReader, trace.Tracer) {
	t.Helper()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	obs, err := dlockotel.New(dlockotel.WithTracerProvider(tp), dlockotel.WithMeterProvider(mp),
		dlockotel.WithLockName(func(name string) string {
			group, _, _ := strings.Cut(name, ":")
			return group
		}))
	if err != nil {
		t.Fatal(err)
	}
	return obs, spans, reader, tp.Tracer("test")
}

func TestTraces(t *testing.T) {
	ctx := t.Context()
	obs, spans, _, tracer := setup(t)
	store := memlock.New()
	c := dlock.New(store, dlock.WithObserver(obs), dlock.WithTTL(time.Second))
	defer c.Close()
	other := dlock.New(store)
	defer other.Close()

	// Lock under a request's span; work under the lease's Context; Unlock.
	rctx, request := tracer.Start(ctx, "request")
	l, err := c.Mutex("orders:1").Lock(rctx)
	if err != nil {
		t.Fatal(err)
	}
	_, work := tracer.Start(l.Context(), "work")
	time.Sleep(20 * time.Millisecond)
	work.End()
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	request.End()
	got := byName(spans.GetSpans())
	spans.Reset()
	lock, hold, unlock, w, req := got["dlock.Lock"], got["dlock.Hold"], got["dlock.Unlock"], got["work"], got["request"]
	for name, s := range map[string]tracetest.SpanStub{"dlock.Lock": lock, "dlock.Hold": hold, "dlock.Unlock": unlock, "work": w} {
		if s.Name == "" {
			t.Fatalf("no %s span; got %v", name, names(got))
		}
		if s.SpanContext.TraceID() != req.SpanContext.TraceID() {
			t.Errorf("%s is in another trace", name)
		}
	}
	if lock.Parent.SpanID() != req.SpanContext.SpanID() || hold.Parent.SpanID() != req.SpanContext.SpanID() {
		t.Errorf("Lock and Hold spans are not children of the request's")
	}
	if w.Parent.SpanID() != hold.SpanContext.SpanID() || unlock.Parent.SpanID() != hold.SpanContext.SpanID() {
		t.Errorf("work and Unlock do not nest under the Hold span")
	}
	if len(hold.Links) != 1 || hold.Links[0].SpanContext.SpanID() != lock.SpanContext.SpanID() {
		t.Errorf("Hold span links %+v, want the Lock span", hold.Links)
	}
	wantAttrs(t, lock, map[attribute.Key]any{
		dlockotel.KeyName: "orders:1", dlockotel.KeyType: "mutex", dlockotel.KeyStore: "memory", dlockotel.KeyOutcome: "granted",
		dlockotel.KeyAttempts: int64(1), dlockotel.KeyFence: int64(l.Fence()), dlockotel.KeyHandoff: false,
	})
	if wait, _ := attr(lock, dlockotel.KeyWait).(float64); wait <= 0 || wait > lock.EndTime.Sub(lock.StartTime).Seconds() {
		t.Errorf("wait attribute %v, Lock span %v", wait, lock.EndTime.Sub(lock.StartTime))
	}
	wantAttrs(t, unlock, map[attribute.Key]any{dlockotel.KeyName: "orders:1", dlockotel.KeyFence: int64(l.Fence())})
	if !unlock.StartTime.After(w.EndTime) || unlock.EndTime.After(hold.EndTime) || unlock.EndTime.Sub(unlock.StartTime) <= 0 {
		t.Errorf("Unlock span %v..%v, work ended %v, hold ended %v", unlock.StartTime, unlock.EndTime, w.EndTime, hold.EndTime)
	}
	if hold.EndTime.Sub(hold.StartTime) < 20*time.Millisecond || hold.Status.Code != codes.Unset {
		t.Errorf("hold span: %v long, status %v", hold.EndTime.Sub(hold.StartTime), hold.Status)
	}

	// Do: fn's work nests under the hold too.
	rctx, request = tracer.Start(ctx, "request")
	err = c.Do(rctx, "orders:1", func(ctx context.Context) error {
		_, work := tracer.Start(ctx, "work")
		work.End()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	request.End()
	got = byName(spans.GetSpans())
	spans.Reset()
	// The Do span is the request's child and the parent of the Lock and
	// Hold spans (and, through the Hold, of fn's work and the Unlock).
	do, lockSpan, hold, unlockSpan, w, req := got["dlock.Do"], got["dlock.Lock"], got["dlock.Hold"], got["dlock.Unlock"], got["work"], got["request"]
	if do.Name == "" || do.Parent.SpanID() != req.SpanContext.SpanID() {
		t.Fatalf("Do span %+v, want a child of the request's; spans %v", do, names(got))
	}
	if lockSpan.Parent.SpanID() != do.SpanContext.SpanID() || hold.Parent.SpanID() != do.SpanContext.SpanID() ||
		w.Parent.SpanID() != hold.SpanContext.SpanID() || unlockSpan.Parent.SpanID() != hold.SpanContext.SpanID() {
		t.Errorf("Do: Lock's parent %v, Hold's %v, work's %v, Unlock's %v; Do %v, Hold %v",
			lockSpan.Parent.SpanID(), hold.Parent.SpanID(), w.Parent.SpanID(), unlockSpan.Parent.SpanID(), do.SpanContext.SpanID(), hold.SpanContext.SpanID())
	}
	wantAttrs(t, do, map[attribute.Key]any{dlockotel.KeyName: "orders:1", dlockotel.KeyType: "mutex", dlockotel.KeyStore: "memory", dlockotel.KeyFence: attr(hold, dlockotel.KeyFence)})
	if do.Status.Code != codes.Unset || do.StartTime.After(lockSpan.StartTime) || do.EndTime.Before(hold.EndTime) {
		t.Errorf("Do span %v..%v status %v; Lock from %v, Hold to %v", do.StartTime, do.EndTime, do.Status, lockSpan.StartTime, hold.EndTime)
	}

	// A Do whose fn fails: its span says so.
	failed := errors.New("the report failed")
	if err := c.Do(ctx, "orders:1", func(context.Context) error { return failed }); !errors.Is(err, failed) {
		t.Fatalf("Do = %v", err)
	}
	got = byName(spans.GetSpans())
	spans.Reset()
	if do := got["dlock.Do"]; do.Status.Code != codes.Error || !strings.Contains(do.Status.Description, "the report failed") {
		t.Errorf("failed Do span status %+v", do.Status)
	}

	// A refused TryLock: its span says so, and there is no hold.
	held, err := other.Mutex("orders:1").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Mutex("orders:1").TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock = %v", err)
	}
	got = byName(spans.GetSpans())
	spans.Reset()
	if len(got) != 1 || got["dlock.TryLock"].Name == "" {
		t.Fatalf("spans of a refused TryLock: %v", names(got))
	}
	wantAttrs(t, got["dlock.TryLock"], map[attribute.Key]any{dlockotel.KeyOutcome: "not_obtained", dlockotel.KeyAttempts: int64(1)})
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// A loss: an event on the Hold span, which ends with an error; the
	// Unlock after it has an error span, and does not end the hold again.
	l, err = c.Mutex("orders:1").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.ForceRelease(ctx, "orders:1"); err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Refresh = %v", err)
	}
	got = byName(spans.GetSpans())
	hold = got["dlock.Hold"]
	if hold.Name == "" || len(hold.Events) != 1 || hold.Events[0].Name != "dlock.lost" || hold.Status.Code != codes.Error {
		t.Fatalf("hold span of a lost lease: %+v", hold)
	}
	if r := hold.Events[0].Attributes; len(r) != 1 || r[0].Value.AsString() != "missing" {
		t.Errorf("loss event attributes %v", r)
	}
	if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Unlock = %v", err)
	}
	all := spans.GetSpans()
	spans.Reset()
	if n := count(all, "dlock.Hold"); n != 1 {
		t.Errorf("%d Hold spans, want 1", n)
	}
	if u := byName(all)["dlock.Unlock"]; u.Status.Code != codes.Error || u.Parent.SpanID() != hold.SpanContext.SpanID() {
		t.Errorf("Unlock of a lost lease: status %v, parent %v", u.Status, u.Parent.SpanID())
	}

	// A reentrant pair: one loss ends both holds.
	m := c.Mutex("jobs:1", dlock.Reentrant())
	a, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.ForceRelease(ctx, "jobs:1"); err != nil {
		t.Fatal(err)
	}
	if err := a.Refresh(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Refresh = %v", err)
	}
	var lostHolds int
	for _, s := range spans.GetSpans() {
		if s.Name == "dlock.Hold" && len(s.Events) == 1 && s.Events[0].Name == "dlock.lost" {
			lostHolds++
		}
	}
	if lostHolds != 2 {
		t.Errorf("%d lost Hold spans of the reentrant pair, want 2", lostHolds)
	}
	_ = a.Unlock(ctx)
	_ = b.Unlock(ctx)
}

func TestMetricsMemlock(t *testing.T) {
	store := memlock.New()
	exerciseMetrics(t, store, store, "memory")
}

func TestMetricsRedis(t *testing.T) {
	store := redislock.New(testserver.StartRedis(t).Client(t))
	exerciseMetrics(t, store, store, "redis")
}

// exerciseMetrics drives an observed Client through a grant, a wait, a
// refused TryLock, renewals, Unlocks and a loss, and reads the metrics
// after each.
func exerciseMetrics(t *testing.T, backend driver.Backend, force forceReleaser, store string) {
	ctx := t.Context()
	obs, _, reader, _ := setup(t)
	c := dlock.New(backend, dlock.WithObserver(obs), dlock.WithTTL(600*time.Millisecond))
	defer c.Close()
	other := dlock.New(backend)
	defer other.Close()
	mutexOrders := attrs{"dlock.store": store, "dlock.lock.type": "mutex", "dlock.lock": "orders"}
	lockGranted := attrs{"dlock.store": store, "dlock.lock.type": "mutex", "dlock.lock": "orders", "dlock.lock.call": "lock"}

	l, err := c.Mutex("orders:1").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want(t, reader, "dlock.leases", mutexOrders, 1)
	time.Sleep(300 * time.Millisecond) // past a renewal
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	want(t, reader, "dlock.leases", mutexOrders, 0)
	want(t, reader, "dlock.lock.grants", lockGranted, 1)
	want(t, reader, "dlock.lock.hold", mutexOrders, 1)
	want(t, reader, "dlock.lock.wait", attrs{"dlock.store": store, "dlock.lock.type": "mutex", "dlock.lock": "orders", "dlock.lock.call": "lock", "dlock.outcome": "granted"}, 1)
	want(t, reader, "dlock.store.call.duration", attrs{"dlock.store": store, "dlock.store.op": "acquire", "dlock.outcome": "ok"}, 1)
	want(t, reader, "dlock.store.call.duration", attrs{"dlock.store": store, "dlock.store.op": "release", "dlock.outcome": "ok"}, 1)
	if n := value(t, reader, "dlock.lease.renewals", attrs{"dlock.store": store}); n < 1 {
		t.Errorf("renewals = %d, want at least 1", n)
	}
	if n := value(t, reader, "dlock.renewal.duration", attrs{"dlock.store": store}); n < 1 {
		t.Errorf("renewal round trips = %d, want at least 1", n)
	}

	// A refused TryLock, and a Lock counted as a waiter while it waits.
	held, err := other.Mutex("orders:2").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Mutex("orders:2").TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock = %v", err)
	}
	want(t, reader, "dlock.lock.not_obtained", attrs{"dlock.store": store, "dlock.lock.type": "mutex", "dlock.lock": "orders", "dlock.lock.call": "trylock"}, 1)
	done := make(chan error, 1)
	var waited *dlock.Lease
	go func() {
		var err error
		waited, err = c.Mutex("orders:2").Lock(ctx)
		done <- err
	}()
	for deadline := time.Now().Add(5 * time.Second); value(t, reader, "dlock.waiters", mutexOrders) != 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the waiting Lock is not counted as a waiter")
		}
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	want(t, reader, "dlock.waiters", mutexOrders, 0)
	want(t, reader, "dlock.leases", mutexOrders, 1)

	// Its loss, and the Unlock after it.
	if _, _, err := force.ForceRelease(ctx, "orders:2"); err != nil {
		t.Fatal(err)
	}
	if err := waited.Refresh(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Refresh = %v", err)
	}
	want(t, reader, "dlock.lease.losses", attrs{"dlock.store": store, "dlock.lock.type": "mutex", "dlock.lock": "orders", "dlock.lost.reason": "missing"}, 1)
	want(t, reader, "dlock.lease.renewal_failures", attrs{"dlock.store": store}, 1)
	want(t, reader, "dlock.leases", mutexOrders, 0)
	_ = waited.Unlock(ctx)
	want(t, reader, "dlock.leases", mutexOrders, 0)
	want(t, reader, "dlock.lock.hold", mutexOrders, 1)

	// A call refused by a closed Client.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Mutex("orders:3").Lock(ctx); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("Lock on a closed Client = %v", err)
	}
	want(t, reader, "dlock.lock.failures", lockGranted, 1)
}

// attrs are a data point's attributes, all of them.
type attrs map[string]string

func (a attrs) match(set attribute.Set) bool {
	if set.Len() != len(a) {
		return false
	}
	for k, v := range a {
		if got, ok := set.Value(attribute.Key(k)); !ok || got.AsString() != v {
			return false
		}
	}
	return true
}

// value returns a counter's or up-down counter's sum, or a histogram's
// count, for the data point with exactly attributes a; 0 when there is
// none.
func value(t *testing.T, reader *sdkmetric.ManualReader, name string, a attrs) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					if a.match(p.Attributes) {
						return p.Value
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					if a.match(p.Attributes) {
						return int64(p.Count)
					}
				}
			default:
				t.Fatalf("%s is a %T", name, m.Data)
			}
		}
	}
	return 0
}

func want(t *testing.T, reader *sdkmetric.ManualReader, name string, a attrs, v int64) {
	t.Helper()
	if got := value(t, reader, name, a); got != v {
		t.Errorf("%s %v = %d, want %d", name, a, got, v)
	}
}

// byName returns the last span of each name.
func byName(spans tracetest.SpanStubs) map[string]tracetest.SpanStub {
	out := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		out[s.Name] = s
	}
	return out
}

func names(m map[string]tracetest.SpanStub) []string {
	var out []string
	for n := range m {
		out = append(out, n)
	}
	return out
}

func count(spans tracetest.SpanStubs, name string) int {
	n := 0
	for _, s := range spans {
		if s.Name == name {
			n++
		}
	}
	return n
}

func attr(s tracetest.SpanStub, k attribute.Key) any {
	for _, kv := range s.Attributes {
		if kv.Key == k {
			return kv.Value.AsInterface()
		}
	}
	return nil
}

func wantAttrs(t *testing.T, s tracetest.SpanStub, want map[attribute.Key]any) {
	t.Helper()
	for k, v := range want {
		if got := attr(s, k); got != v {
			t.Errorf("%s span: %s = %v (%T), want %v (%T)", s.Name, k, got, got, v, v)
		}
	}
}

// TestConcurrent has many goroutines take one lock in turn, with Lock and
// TryLock: afterwards every call is counted once, every hold span ended,
// and the up-down counters are back to zero.
func TestConcurrent(t *testing.T) {
	ctx := t.Context()
	obs, spans, reader, _ := setup(t)
	c := dlock.New(memlock.New(), dlock.WithObserver(obs))
	defer c.Close()
	const workers, rounds = 8, 25
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			m := c.Mutex("hot:1")
			for i := range rounds {
				var l *dlock.Lease
				var err error
				if (w+i)%2 == 0 {
					l, err = m.TryLock(ctx)
					if errors.Is(err, dlock.ErrNotObtained) {
						continue
					}
				} else {
					l, err = m.Lock(ctx)
				}
				if err == nil {
					err = l.Unlock(ctx)
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	hot := attrs{"dlock.store": "memory", "dlock.lock.type": "mutex", "dlock.lock": "hot"}
	grants := value(t, reader, "dlock.lock.grants", attrs{"dlock.store": "memory", "dlock.lock.type": "mutex", "dlock.lock": "hot", "dlock.lock.call": "lock"}) +
		value(t, reader, "dlock.lock.grants", attrs{"dlock.store": "memory", "dlock.lock.type": "mutex", "dlock.lock": "hot", "dlock.lock.call": "trylock"})
	refused := value(t, reader, "dlock.lock.not_obtained", attrs{"dlock.store": "memory", "dlock.lock.type": "mutex", "dlock.lock": "hot", "dlock.lock.call": "trylock"})
	if grants+refused != workers*rounds {
		t.Errorf("%d grants + %d refused TryLocks, want %d calls", grants, refused, workers*rounds)
	}
	want(t, reader, "dlock.leases", hot, 0)
	want(t, reader, "dlock.waiters", hot, 0)
	want(t, reader, "dlock.lock.hold", hot, grants)
	all := spans.GetSpans()
	if n := count(all, "dlock.Hold"); int64(n) != grants {
		t.Errorf("%d ended Hold spans for %d grants", n, grants)
	}
	if n := count(all, "dlock.Unlock"); int64(n) != grants {
		t.Errorf("%d Unlock spans for %d grants", n, grants)
	}
}
