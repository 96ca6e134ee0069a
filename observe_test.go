package dlock_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/memlock"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/redlock"
	"github.com/dlock-go/dlock/sqllock"
)

// recorder keeps every event it is given.
type recorder struct {
	mu     sync.Mutex
	events []dlock.Event
}

func (r *recorder) Observe(e dlock.Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// take returns the events so far and forgets them.
func (r *recorder) take() []dlock.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.events
	r.events = nil
	return out
}

// of returns the events of kind k among es.
func of(es []dlock.Event, k dlock.EventKind) []dlock.Event {
	var out []dlock.Event
	for _, e := range es {
		if e.Kind == k {
			out = append(out, e)
		}
	}
	return out
}

func one(t *testing.T, es []dlock.Event, k dlock.EventKind) dlock.Event {
	t.Helper()
	got := of(es, k)
	if len(got) != 1 {
		t.Fatalf("%d %q events, want 1; all: %+v", len(got), k, es)
	}
	return got[0]
}

func TestObserverEvents(t *testing.T) {
	t.Parallel()
	store := memlock.New()
	rec := &recorder{}
	c := dlock.New(store, dlock.WithObserver(rec), dlock.WithKeyPrefix("app/"), dlock.WithTTL(300*time.Millisecond))
	defer c.Close()
	other := dlock.New(store, dlock.WithKeyPrefix("app/"))
	defer other.Close()
	ctx := t.Context()

	// An uncontended Lock, held for a while, then Unlock.
	l, err := c.Mutex("jobs").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	es := rec.take()
	if s := one(t, es, dlock.EventLockStarted); s.Name != "jobs" || s.Type != dlock.TypeMutex || s.TryLock {
		t.Errorf("started = %+v", s)
	}
	g := one(t, es, dlock.EventLockGranted)
	if g.Fence != l.Fence() || g.Attempts != 1 || g.Wait <= 0 || g.Handoff {
		t.Errorf("granted = %+v, fence %d", g, l.Fence())
	}
	// Client names the Client, so that two Clients sharing an observer
	// can be told apart (the same name and fence on two stores).
	second := dlock.New(memlock.New(), dlock.WithObserver(rec))
	defer second.Close()
	if l2, err := second.Mutex("jobs").Lock(ctx); err != nil {
		t.Fatal(err)
	} else {
		_ = l2.Unlock(ctx)
	}
	g2 := one(t, rec.take(), dlock.EventLockGranted)
	for _, e := range es {
		if e.Client == "" || e.Client != g.Client {
			t.Errorf("event %+v: Client %q, want %q", e, e.Client, g.Client)
		}
		// Store names the backend's kind of store (driver.StoreNamer).
		if e.Store != "memory" {
			t.Errorf("event %+v: Store %q, want memory", e, e.Store)
		}
	}
	if g2.Client == g.Client || g2.Fence != g.Fence {
		t.Errorf("two Clients' grants of one name and fence: Client %q and %q", g.Client, g2.Client)
	}
	if sc := one(t, es, dlock.EventStoreCall); sc.Op != "acquire" || sc.Name != "jobs" || sc.Latency <= 0 {
		t.Errorf("store call = %+v", sc)
	}
	time.Sleep(250 * time.Millisecond) // past a renewal (TTL/3)
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	es = rec.take()
	if r := of(es, dlock.EventRenewed); len(r) == 0 || r[0].Count != 1 || r[0].Failed != 0 || r[0].Latency <= 0 {
		t.Errorf("renewals = %+v", r)
	}
	u := one(t, es, dlock.EventUnlocked)
	if u.Held < 250*time.Millisecond || u.Err != nil || u.Fence != l.Fence() {
		t.Errorf("unlocked = %+v", u)
	}
	// The release is timed inside Unlock, which may share its first clock
	// read: never longer than Unlock.
	if rel := of(es, dlock.EventStoreCall); len(rel) != 1 || rel[0].Op != "release" || rel[0].Latency <= 0 || rel[0].Latency > u.Latency {
		t.Errorf("release store calls = %+v, Unlock took %v", rel, u.Latency)
	}
	if g.Wait > u.Held || g.Wait > time.Second {
		t.Errorf("wait %v (hold %v)", g.Wait, u.Held)
	}

	// TryLock of a held lock; a Lock that waits for it.
	held, err := other.Mutex("jobs").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Mutex("jobs").TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock = %v", err)
	}
	if n := one(t, rec.take(), dlock.EventLockNotObtained); !n.TryLock || n.Attempts != 1 || !errors.Is(n.Err, dlock.ErrNotObtained) {
		t.Errorf("not obtained = %+v", n)
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = held.Unlock(context.Background())
	}()
	w, err := c.Mutex("jobs").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if g := one(t, rec.take(), dlock.EventLockGranted); g.Attempts < 2 || g.Wait < 90*time.Millisecond {
		t.Errorf("granted after a wait = %+v", g)
	}

	// A loss.
	if _, _, err := store.ForceRelease(ctx, "app/jobs"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.Done():
	case <-time.After(time.Second):
		t.Fatal("the lease was not lost")
	}
	// The event follows Done: the renewer reports it once the grant's
	// lock is let go.
	var es2 []dlock.Event
	for deadline := time.Now().Add(time.Second); len(of(es2, dlock.EventLost)) == 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
		es2 = append(es2, rec.take()...)
	}
	if lost := one(t, es2, dlock.EventLost); lost.Reason != dlock.LostMissing || lost.Fence != w.Fence() || lost.Name != "jobs" {
		t.Errorf("lost = %+v", lost)
	}

	// A reader's type; a wait ended by its context.
	rl, err := c.RWMutex("table").RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if g := one(t, rec.take(), dlock.EventLockGranted); g.Type != dlock.TypeReader {
		t.Errorf("reader granted = %+v", g)
	}
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := other.RWMutex("table").Lock(wctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("writer = %v", err)
	}
	_ = rl.Unlock(ctx)

	// The option belongs to the Client.
	if _, err := c.Mutex("x", dlock.WithObserver(rec)).TryLock(ctx); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("WithObserver on a lock = %v, want ErrInvalid", err)
	}
}

// TestObserverReentrant: a reentrant handle (which may wait at its reentry lock
// before it sends, so its calls read their own start, as its Unlocks do
// for their releases) reports a Wait and a Held for each of its leases.
func TestObserverReentrant(t *testing.T) {
	rec := &recorder{}
	c := dlock.New(memlock.New(), dlock.WithObserver(rec))
	defer c.Close()
	ctx := t.Context()
	m := c.Mutex("r", dlock.Reentrant())
	a, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	es := rec.take()
	granted, unlocked := of(es, dlock.EventLockGranted), of(es, dlock.EventUnlocked)
	if len(granted) != 2 || len(unlocked) != 2 {
		t.Fatalf("events %+v: want two grants and two unlocks", es)
	}
	for _, g := range granted {
		if g.Wait <= 0 || g.Fence != a.Fence() {
			t.Errorf("granted %+v", g)
		}
	}
	for _, u := range unlocked {
		if u.Held < 10*time.Millisecond || u.Latency <= 0 || u.Err != nil {
			t.Errorf("unlocked %+v", u)
		}
	}
	// Each Unlock releases its hold on the store (which counts them): a
	// release, timed within its Unlock.
	var rels []dlock.Event
	for _, e := range of(es, dlock.EventStoreCall) {
		if e.Op == "release" {
			rels = append(rels, e)
		}
	}
	if len(rels) != 2 {
		t.Fatalf("releases %+v, want one per Unlock", rels)
	}
	for i, r := range rels {
		if r.Latency <= 0 || r.Latency > unlocked[i].Latency {
			t.Errorf("release %+v, its Unlock took %v", r, unlocked[i].Latency)
		}
	}
}

// TestObserverDo: Client.Do is reported around the events of its Lock and
// Unlock, with its fence, duration and error.
func TestObserverDo(t *testing.T) {
	rec := &recorder{}
	c := dlock.New(memlock.New(), dlock.WithObserver(rec))
	defer c.Close()
	ctx := t.Context()
	var fence uint64
	if err := c.Do(ctx, "report", func(ctx context.Context) error {
		l, _ := dlock.LeaseFromContext(ctx)
		fence = l.Fence()
		time.Sleep(5 * time.Millisecond)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	es := rec.take()
	if len(es) < 2 || es[0].Kind != dlock.EventDoStarted || es[len(es)-1].Kind != dlock.EventDoEnded {
		t.Fatalf("events %v: want Do's first and last", kinds(es))
	}
	if s := es[0]; s.Name != "report" || s.Type != dlock.TypeMutex || s.Store != "memory" {
		t.Errorf("do started = %+v", s)
	}
	if e := es[len(es)-1]; e.Name != "report" || e.Fence != fence || e.Latency < 5*time.Millisecond || e.Err != nil {
		t.Errorf("do ended = %+v, fence %d", e, fence)
	}
	one(t, es, dlock.EventLockGranted)
	one(t, es, dlock.EventUnlocked)

	failed := errors.New("the report failed")
	if err := c.Do(ctx, "report", func(context.Context) error { return failed }); !errors.Is(err, failed) {
		t.Fatalf("Do = %v", err)
	}
	if e := one(t, rec.take(), dlock.EventDoEnded); !errors.Is(e.Err, failed) || e.Fence == 0 {
		t.Errorf("do ended = %+v", e)
	}
}

// kinds lists the events' kinds.
func kinds(es []dlock.Event) []string {
	var ks []string
	for _, e := range es {
		ks = append(ks, e.Kind.String())
	}
	return ks
}

// TestStoreNames checks the store each backend names for Event.Store
// (driver.StoreNamer): the values the adapters' metrics use as a label.
func TestStoreNames(t *testing.T) {
	for _, tc := range []struct {
		b    driver.StoreNamer
		want string
	}{
		{memlock.New(), "memory"},
		{(*redislock.Backend)(nil), "redis"},
		{(*redlock.Backend)(nil), "redlock"},
		{(*etcdlock.Backend)(nil), "etcd"},
		{sqllock.New(nil, sqllock.MySQL), "mysql"},
		{sqllock.NewPostgres(nil), "postgres"},
		{sqllock.NewSQLite(nil), "sqlite"},
	} {
		if got := tc.b.StoreName(); got != tc.want {
			t.Errorf("%T: StoreName %q, want %q", tc.b, got, tc.want)
		}
	}
}

// counter is the cheapest useful observer: it counts events.
type counter struct{ n atomic.Int64 }

func (c *counter) Observe(dlock.Event) { c.n.Add(1) }

// BenchmarkObserverCost is one uncontended Lock+Unlock without and with
// an observer that counts (the target: within 3%), on memlock, where no
// network hides the cost, and on a redis-server on loopback:
//
//	go test -run XXX -bench ObserverCost -count 6 . | benchstat -col /observer -
//
// Besides the time per cycle it reports cpu-ns/op, the CPU time the
// process used per cycle (every thread: the garbage collector's too; not
// the redis-server's): on a machine shared with other work, wall time
// counts the time the benchmark waited for a CPU, and CPU time does not.
func BenchmarkObserverCost(b *testing.B) {
	for _, store := range []string{"memlock", "redis"} {
		b.Run("store="+store, func(b *testing.B) {
			var backend driver.Backend = memlock.New()
			if store == "redis" {
				backend = redislock.New(testserver.StartRedis(b).Client(b))
			}
			for _, on := range []bool{false, true} {
				name := "observer=none"
				var opts []dlock.Option
				if on {
					name = "observer=counter"
					opts = append(opts, dlock.WithObserver(&counter{}))
				}
				b.Run(name, func(b *testing.B) {
					c := dlock.New(backend, opts...)
					defer c.Close()
					ctx := context.Background()
					m := c.Mutex("bench/observed")
					b.ReportAllocs()
					cpu0, cpuOK := cpuTime()
					for b.Loop() {
						l, err := m.Lock(ctx)
						if err != nil {
							b.Fatal(err)
						}
						if err := l.Unlock(ctx); err != nil {
							b.Fatal(err)
						}
					}
					if cpu1, ok := cpuTime(); ok && cpuOK {
						b.ReportMetric(float64(cpu1-cpu0)/float64(b.N), "cpu-ns/op")
					}
				})
			}
		})
	}
}

// BenchmarkObserverCostPaired measures what BenchmarkObserverCost does,
// in a way that a machine shared with other work disturbs less: the two
// Clients (no observer, a counting one) take turns, a block of cycles
// each, and each reports the median of its blocks' times per cycle. Load
// that comes and goes hits both alike, and a block in which the benchmark
// waited for a CPU is an outlier that the median leaves out. It reports
// none-ns/op, counter-ns/op and their ratio, overhead-% (ns/op is of both
// Clients' cycles together):
//
//	go test -run XXX -bench ObserverCostPaired -count 6 . | benchstat -col .unit -
func BenchmarkObserverCostPaired(b *testing.B) {
	for _, store := range []string{"memlock", "redis"} {
		b.Run("store="+store, func(b *testing.B) {
			var backend driver.Backend = memlock.New()
			block := 256 // cycles: about 0.3ms on memlock
			if store == "redis" {
				backend = redislock.New(testserver.StartRedis(b).Client(b))
				block = 16 // about 1ms on loopback
			}
			ctx := context.Background()
			var ms [2]*dlock.Mutex
			for i, opts := range [][]dlock.Option{nil, {dlock.WithObserver(&counter{})}} {
				c := dlock.New(backend, opts...)
				defer c.Close()
				ms[i] = c.Mutex("bench/paired")
			}
			cycle := func(m *dlock.Mutex) {
				l, err := m.Lock(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
			var per [2][]float64 // ns per cycle of each block
			for n := 0; n < b.N; n += 2 * block {
				for i, m := range ms {
					start := time.Now()
					for range block {
						cycle(m)
					}
					per[i] = append(per[i], float64(time.Since(start).Nanoseconds())/float64(block))
				}
			}
			none, counted := median(per[0]), median(per[1])
			b.ReportMetric(none, "none-ns/op")
			b.ReportMetric(counted, "counter-ns/op")
			b.ReportMetric(100*(counted-none)/none, "overhead-%")
		})
	}
}

// median returns the median of xs, which it sorts.
func median(xs []float64) float64 {
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// ctxRecorder is a ContextObserver: it puts the event's kind in the
// context it returns, and keeps every event with the value of the context
// it was given.
type ctxRecorder struct {
	recorder
	mu  sync.Mutex
	got []ctxEvent
}

type ctxEvent struct {
	kind dlock.EventKind
	from any // the ctxKey value of the context given with it
	e    dlock.Event
}

type ctxKey struct{}

func (r *ctxRecorder) ObserveContext(ctx context.Context, e dlock.Event) context.Context {
	r.mu.Lock()
	r.got = append(r.got, ctxEvent{kind: e.Kind, from: ctx.Value(ctxKey{}), e: e})
	r.mu.Unlock()
	return context.WithValue(ctx, ctxKey{}, e.Kind.String())
}

func (r *ctxRecorder) takeCtx() []ctxEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.got
	r.got = nil
	return out
}

func TestContextObserver(t *testing.T) {
	store := memlock.New()
	rec := &ctxRecorder{}
	c := dlock.New(store, dlock.WithObserver(rec))
	defer c.Close()
	other := dlock.New(store)
	defer other.Close()

	// The call's ctx goes to the start, the start's context to the end,
	// the grant's context (values only) to the lease's Context and with it
	// to the Unlock.
	callCtx, cancelCall := context.WithCancel(context.WithValue(t.Context(), ctxKey{}, "caller"))
	l, err := c.Mutex("jobs").Lock(callCtx)
	if err != nil {
		t.Fatal(err)
	}
	cancelCall() // the Lock's context ends; the lease's Context must not
	if v := l.Context().Value(ctxKey{}); v != "lock granted" {
		t.Errorf("lease context value = %v, want the one returned for the grant", v)
	}
	if got, ok := dlock.LeaseFromContext(l.Context()); !ok || got != l {
		t.Error("the lease's Context does not carry the lease")
	}
	if err := l.Context().Err(); err != nil {
		t.Errorf("the lease's Context ended with the Lock's: %v", err)
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if l.Context().Err() == nil {
		t.Error("the lease's Context was not cancelled by Unlock")
	}
	got := rec.takeCtx()
	want := []struct {
		kind dlock.EventKind
		from any
	}{
		{dlock.EventLockStarted, "caller"},
		{dlock.EventLockGranted, "lock started"},
		{dlock.EventUnlocked, "lock granted"},
	}
	if len(got) != len(want) {
		t.Fatalf("ObserveContext got %+v, want %d events", got, len(want))
	}
	for i, w := range want {
		if got[i].kind != w.kind || got[i].from != w.from {
			t.Errorf("event %d: %v with context value %v, want %v with %v", i, got[i].kind, got[i].from, w.kind, w.from)
		}
	}
	if u := got[2].e; u.Latency <= 0 || u.Held <= 0 || u.Fence != l.Fence() {
		t.Errorf("unlocked = %+v", u)
	}
	// Observe has the rest: the store calls, and nothing of the above.
	for _, e := range rec.take() {
		if e.Kind != dlock.EventStoreCall {
			t.Errorf("Observe got %v, which ObserveContext should have had", e.Kind)
		}
	}

	// A TryLock that is refused: start and end through ObserveContext.
	held, err := other.Mutex("jobs").Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(context.Background())
	tctx := context.WithValue(t.Context(), ctxKey{}, "try")
	if _, err := c.Mutex("jobs").TryLock(tctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock = %v", err)
	}
	got = rec.takeCtx()
	if len(got) != 2 || got[0].from != "try" || !got[0].e.TryLock || got[1].kind != dlock.EventLockNotObtained || got[1].from != "lock started" {
		t.Errorf("refused TryLock: %+v", got)
	}

	// A lease lost before Unlock: its Context carries the values and is
	// cancelled with the loss.
	held.Unlock(t.Context())
	l, err = c.Mutex("jobs").Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.ForceRelease(t.Context(), "jobs"); err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(t.Context()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Refresh = %v", err)
	}
	if ctx := l.Context(); ctx.Value(ctxKey{}) != "lock granted" || !errors.Is(context.Cause(ctx), dlock.ErrLost) {
		t.Errorf("lost lease's Context: value %v, cause %v", ctx.Value(ctxKey{}), context.Cause(ctx))
	}
	if lost := of(rec.take(), dlock.EventLost); len(lost) != 1 {
		t.Errorf("Observe got %d EventLost, want 1", len(lost))
	}
	_ = l.Unlock(t.Context())
	rec.takeCtx()

	// Do: fn's context is made from the grant's, keeps the caller's
	// values and cancellation, and carries the lease.
	type otherKey struct{}
	dctx, cancelDo := context.WithCancel(context.WithValue(context.WithValue(t.Context(), ctxKey{}, "caller"), otherKey{}, "kept"))
	defer cancelDo()
	err = c.Do(dctx, "report", func(ctx context.Context) error {
		if v := ctx.Value(ctxKey{}); v != "lock granted" {
			t.Errorf("fn's context value = %v, want the grant's", v)
		}
		if ctx.Value(otherKey{}) != "kept" {
			t.Error("fn's context lost the caller's values")
		}
		if l, ok := dlock.LeaseFromContext(ctx); !ok || l.Name() != "report" {
			t.Error("fn's context does not carry the lease")
		}
		// A Lock inside fn is observed as any other.
		inner, err := c.Mutex("inner").Lock(ctx)
		if err != nil {
			return err
		}
		if err := inner.Unlock(ctx); err != nil {
			return err
		}
		cancelDo()
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
			t.Error("fn's context outlived the caller's")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Do's own events come first and last: its Lock runs in the context
	// returned for EventDoStarted, and EventDoEnded gets that context.
	if got := rec.takeCtx(); len(got) < 4 || got[0].kind != dlock.EventDoStarted || got[0].from != "caller" ||
		got[1].kind != dlock.EventLockStarted || got[1].from != "do started" ||
		got[len(got)-1].kind != dlock.EventDoEnded || got[len(got)-1].from != "do started" {
		t.Errorf("Do's events: %+v", got)
	}

	// A plain Observer: Do's fn gets the caller's context as before.
	plain := dlock.New(store, dlock.WithObserver(&recorder{}))
	defer plain.Close()
	err = plain.Do(context.WithValue(t.Context(), ctxKey{}, "caller"), "report", func(ctx context.Context) error {
		if v := ctx.Value(ctxKey{}); v != "caller" {
			t.Errorf("fn's context value = %v with a plain Observer", v)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
