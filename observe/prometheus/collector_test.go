package prometheus_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/memlock"
	dlockprom "github.com/dlock-go/dlock/observe/prometheus"
	"github.com/dlock-go/dlock/redislock"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
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

func TestCollectorMemlock(t *testing.T) {
	store := memlock.New()
	exercise(t, store, store, "memory")
}

func TestCollectorRedis(t *testing.T) {
	rdb := testserver.StartRedis(t).Client(t)
	store := redislock.New(rdb)
	exercise(t, store, store, "redis")
}

// exercise drives a Client observed by a Collector through grants, a
// refused TryLock, a wait, renewals, an Unlock, losses (one of a
// reentrant pair) and a refused call, checking the metrics after each,
// read from the registry and from an HTTP scrape.
func exercise(t *testing.T, backend driver.Backend, force forceReleaser, store string) {
	ctx := t.Context()
	metrics := dlockprom.New(dlockprom.WithLockLabel(func(name string) string {
		group, _, _ := strings.Cut(name, ":")
		return group
	}))
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics)
	c := dlock.New(backend, dlock.WithObserver(metrics), dlock.WithTTL(600*time.Millisecond))
	defer c.Close()
	other := dlock.New(backend) // not observed
	defer other.Close()

	// An uncontended Lock, held past a renewal (TTL/3), then Unlock.
	l, err := c.Mutex("orders:1").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mutexOrders := labels{"store": store, "type": "mutex", "lock": "orders"}
	want(t, reg, "dlock_leases", mutexOrders, 1)
	want(t, reg, "dlock_waiters", mutexOrders, 0)
	time.Sleep(300 * time.Millisecond)
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	want(t, reg, "dlock_leases", mutexOrders, 0)
	want(t, reg, "dlock_lock_grants_total", labels{"store": store, "type": "mutex", "call": "lock", "lock": "orders"}, 1)
	want(t, reg, "dlock_lock_wait_seconds", labels{"store": store, "type": "mutex", "call": "lock", "outcome": "granted", "lock": "orders"}, 1)
	if n, sum := histogram(t, reg, "dlock_lock_hold_seconds", mutexOrders); n != 1 || sum < 0.3 || sum > 5 {
		t.Errorf("hold histogram: count %d, sum %gs; want 1 hold of about 0.3s", n, sum)
	}
	if n := value(t, reg, "dlock_lease_renewals_total", labels{"store": store}); n < 1 {
		t.Errorf("renewals = %g, want at least 1", n)
	}
	if n, _ := histogram(t, reg, "dlock_renewal_round_trip_seconds", labels{"store": store}); n < 1 {
		t.Errorf("renewal round trips = %d, want at least 1", n)
	}
	want(t, reg, "dlock_lease_renewal_failures_total", labels{"store": store}, 0)
	want(t, reg, "dlock_store_call_seconds", labels{"store": store, "op": "acquire", "outcome": "ok"}, 1)
	want(t, reg, "dlock_store_call_seconds", labels{"store": store, "op": "release", "outcome": "ok"}, 1)

	// A TryLock of a held lock; a Lock that waits for it, counted as a
	// waiter meanwhile.
	held, err := other.Mutex("orders:2").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Mutex("orders:2").TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock of a held lock = %v", err)
	}
	want(t, reg, "dlock_lock_not_obtained_total", labels{"store": store, "type": "mutex", "call": "trylock", "lock": "orders"}, 1)
	got := make(chan error, 1)
	var waited *dlock.Lease
	go func() {
		var err error
		waited, err = c.Mutex("orders:2").Lock(ctx)
		got <- err
	}()
	eventually(t, func() bool { return value(t, reg, "dlock_waiters", mutexOrders) == 1 })
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	want(t, reg, "dlock_waiters", mutexOrders, 0)
	want(t, reg, "dlock_leases", mutexOrders, 1)
	want(t, reg, "dlock_lock_grants_total", labels{"store": store, "type": "mutex", "call": "lock", "lock": "orders"}, 2)

	// Its loss: counted once, by reason, and the Unlock after it ends
	// nothing more.
	if _, _, err := force.ForceRelease(ctx, "orders:2"); err != nil {
		t.Fatal(err)
	}
	if err := waited.Refresh(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Refresh of a lost lease = %v", err)
	}
	want(t, reg, "dlock_lease_losses_total", labels{"store": store, "type": "mutex", "reason": "missing", "lock": "orders"}, 1)
	want(t, reg, "dlock_lease_renewal_failures_total", labels{"store": store}, 1)
	want(t, reg, "dlock_leases", mutexOrders, 0)
	if err := waited.Unlock(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Unlock of a lost lease = %v", err)
	}
	want(t, reg, "dlock_leases", mutexOrders, 0)
	if n, _ := histogram(t, reg, "dlock_lock_hold_seconds", mutexOrders); n != 1 {
		t.Errorf("holds = %d after the Unlock of a lost lease, want still 1", n)
	}

	// A reentrant pair on one grant: one loss ends both leases.
	m := c.Mutex("jobs:nightly", dlock.Reentrant())
	a, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mutexJobs := labels{"store": store, "type": "mutex", "lock": "jobs"}
	want(t, reg, "dlock_leases", mutexJobs, 2)
	if _, _, err := force.ForceRelease(ctx, "jobs:nightly"); err != nil {
		t.Fatal(err)
	}
	if err := a.Refresh(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Refresh of a lost lease = %v", err)
	}
	want(t, reg, "dlock_leases", mutexJobs, 0)
	_ = a.Unlock(ctx)
	_ = b.Unlock(ctx)
	_ = b.Unlock(ctx) // a second Unlock of one lease
	want(t, reg, "dlock_leases", mutexJobs, 0)

	// Readers and a semaphore's permits are types of their own; a lease
	// still held at Close is lost as "closed".
	r, err := c.RWMutex("table:users").RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Semaphore("pool:db", 2).Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	want(t, reg, "dlock_leases", labels{"store": store, "type": "reader", "lock": "table"}, 1)
	want(t, reg, "dlock_leases", labels{"store": store, "type": "semaphore", "lock": "pool"}, 1)
	if err := r.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	want(t, reg, "dlock_leases", labels{"store": store, "type": "reader", "lock": "table"}, 0)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	want(t, reg, "dlock_lease_losses_total", labels{"store": store, "type": "semaphore", "reason": "closed", "lock": "pool"}, 1)
	want(t, reg, "dlock_leases", labels{"store": store, "type": "semaphore", "lock": "pool"}, 0)

	// A call refused by the closed Client.
	if _, err := c.Mutex("orders:3").Lock(ctx); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("Lock on a closed Client = %v", err)
	}
	want(t, reg, "dlock_lock_failures_total", labels{"store": store, "type": "mutex", "call": "lock", "lock": "orders"}, 1)
	want(t, reg, "dlock_waiters", mutexOrders, 0)

	// The same, as a Prometheus server scrapes it.
	body := scrape(t, reg)
	for _, line := range []string{
		`dlock_lock_grants_total{call="lock",lock="orders",store="` + store + `",type="mutex"} 2`,
		`dlock_lease_losses_total{lock="orders",reason="missing",store="` + store + `",type="mutex"} 1`,
		`dlock_leases{lock="jobs",store="` + store + `",type="mutex"} 0`,
		`dlock_lock_wait_seconds_count{call="trylock",lock="orders",outcome="not_obtained",store="` + store + `",type="mutex"} 1`,
		`# TYPE dlock_lock_hold_seconds histogram`,
	} {
		if !strings.Contains(body, "\n"+line+"\n") {
			t.Errorf("the scrape has no line %s; it is:\n%s", line, body)
		}
	}
}

// TestCollectorWithoutLockLabel checks that, unasked, no metric has the
// lock label, and that names do not leak into any label.
func TestCollectorWithoutLockLabel(t *testing.T) {
	ctx := t.Context()
	metrics := dlockprom.New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics)
	c := dlock.New(memlock.New(), dlock.WithObserver(metrics))
	defer c.Close()
	l, err := c.Mutex("secret-name-1234").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	want(t, reg, "dlock_lock_grants_total", labels{"store": "memory", "type": "mutex", "call": "lock"}, 1)
	if body := scrape(t, reg); strings.Contains(body, "secret-name") || strings.Contains(body, `lock="`) {
		t.Errorf("a lock name or label in the scrape:\n%s", body)
	}
}

// labels are a series' labels, all of them.
type labels map[string]string

// find returns the series of the metric family name whose labels are
// exactly want, or nil.
func find(t *testing.T, reg prometheus.Gatherer, name string, want labels) *dto.Metric {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(want) {
				continue
			}
			for _, lp := range m.GetLabel() {
				if v, ok := want[lp.GetName()]; !ok || v != lp.GetValue() {
					continue series
				}
			}
			return m
		}
	}
	return nil
}

// value returns a counter's or gauge's value, or a histogram's count; 0
// for a series not there yet.
func value(t *testing.T, reg prometheus.Gatherer, name string, l labels) float64 {
	t.Helper()
	m := find(t, reg, name, l)
	switch {
	case m == nil:
		return 0
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	t.Fatalf("%s %v is of no type this test reads", name, l)
	return 0
}

// histogram returns a histogram's count and sum.
func histogram(t *testing.T, reg prometheus.Gatherer, name string, l labels) (uint64, float64) {
	t.Helper()
	m := find(t, reg, name, l)
	if m == nil || m.Histogram == nil {
		return 0, 0
	}
	return m.Histogram.GetSampleCount(), m.Histogram.GetSampleSum()
}

func want(t *testing.T, reg prometheus.Gatherer, name string, l labels, v float64) {
	t.Helper()
	if got := value(t, reg, name, l); got != v {
		t.Errorf("%s %v = %g, want %g", name, l, got, v)
	}
}

// eventually waits up to 5s for cond.
func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// scrape returns what GET /metrics of a promhttp handler of reg answers.
func scrape(t *testing.T, reg prometheus.Gatherer) string {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %s, %v", resp.Status, err)
	}
	http.DefaultClient.CloseIdleConnections()
	return string(b)
}

// TestCollectorConcurrent has many goroutines take one lock in turn, with
// Lock and TryLock: afterwards every call is counted once and the gauges
// are back to zero.
func TestCollectorConcurrent(t *testing.T) {
	ctx := t.Context()
	metrics := dlockprom.New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics)
	c := dlock.New(memlock.New(), dlock.WithObserver(metrics))
	defer c.Close()
	const workers, rounds = 8, 25
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			m := c.Mutex("hot")
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
	grants := value(t, reg, "dlock_lock_grants_total", labels{"store": "memory", "type": "mutex", "call": "lock"}) +
		value(t, reg, "dlock_lock_grants_total", labels{"store": "memory", "type": "mutex", "call": "trylock"})
	refused := value(t, reg, "dlock_lock_not_obtained_total", labels{"store": "memory", "type": "mutex", "call": "trylock"})
	if grants+refused != workers*rounds {
		t.Errorf("%g grants + %g refused TryLocks, want %d calls", grants, refused, workers*rounds)
	}
	if n, _ := histogram(t, reg, "dlock_lock_hold_seconds", labels{"store": "memory", "type": "mutex"}); float64(n) != grants {
		t.Errorf("%d holds for %g grants", n, grants)
	}
	want(t, reg, "dlock_leases", labels{"store": "memory", "type": "mutex"}, 0)
	want(t, reg, "dlock_waiters", labels{"store": "memory", "type": "mutex"}, 0)
}

// TestCollectorUnnamedStore checks the store label of a backend that does
// not name its store (no driver.StoreNamer): "unknown".
func TestCollectorUnnamedStore(t *testing.T) {
	ctx := t.Context()
	metrics := dlockprom.New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics)
	c := dlock.New(struct{ driver.Backend }{memlock.New()}, dlock.WithObserver(metrics))
	defer c.Close()
	if _, err := c.Mutex("x").TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	want(t, reg, "dlock_lock_grants_total", labels{"store": "unknown", "type": "mutex", "call": "trylock"}, 1)
	want(t, reg, "dlock_store_call_seconds", labels{"store": "unknown", "op": "acquire", "outcome": "ok"}, 1)
}
