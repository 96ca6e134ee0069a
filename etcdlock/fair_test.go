package etcdlock_test

import (
	"context"
	"flag"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/testserver"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

var (
	crowdWaiters = flag.Int("etcd.waiters", 0, "TestFairCrowdAgainstConcurrencyMutex: waiters on one name (the issue's figure: 1000); 0 skips it")
	crowdClients = flag.Int("etcd.conns", 8, "TestFairCrowdAgainstConcurrencyMutex: etcd clients the waiters share")
)

// crowdRun is the outcome of one crowd of waiters on one name.
type crowdRun struct {
	grants, failed int
	elapsed        time.Duration // from the first release to the last grant
	maxHolds       int           // most grants of one waiter (1 when each got it once)
}

func (r crowdRun) perSecond() float64 { return float64(r.grants) / r.elapsed.Seconds() }

// lockCrowd makes n waiters, each with a dlock Client of its own (a
// process each), wait for one held name at once, then releases it and
// lets each take it once; the clients share conns etcd clients.
func lockCrowd(t *testing.T, conns []*clientv3.Client, n int, fair bool, wait time.Duration) crowdRun {
	t.Helper()
	clients := make([]*dlock.Client, n)
	for i := range clients {
		clients[i] = dlock.New(etcdlock.New(conns[i%len(conns)]), dlock.WithTTL(10*time.Second))
	}
	defer func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}()
	mutex := func(c *dlock.Client) *dlock.Mutex {
		if fair {
			return c.Mutex("crowd", dlock.Fair())
		}
		return c.Mutex("crowd")
	}
	first, err := mutex(clients[0]).Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg       sync.WaitGroup
		started  sync.WaitGroup
		failed   atomic.Int64
		granted  atomic.Int64
		holding  atomic.Int64
		overlaps atomic.Int64
		mu       sync.Mutex
		last     time.Time
		holds    = make([]int, n)
	)
	started.Add(n - 1)
	for i := 1; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(t.Context(), wait)
			defer cancel()
			started.Done()
			l, err := mutex(clients[i]).Lock(ctx)
			if err != nil {
				failed.Add(1)
				t.Logf("waiter %d: %v", i, err)
				return
			}
			if holding.Add(1) != 1 {
				overlaps.Add(1)
			}
			holds[i]++
			granted.Add(1)
			mu.Lock()
			last = time.Now()
			mu.Unlock()
			holding.Add(-1)
			if err := l.Unlock(context.WithoutCancel(ctx)); err != nil {
				t.Errorf("waiter %d: unlock: %v", i, err)
			}
		}()
	}
	started.Wait()
	time.Sleep(2 * time.Second) // every waiter has sent its first request
	start := time.Now()
	if err := first.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if overlaps.Load() > 0 {
		t.Errorf("%d grants overlapped another", overlaps.Load())
	}
	r := crowdRun{grants: int(granted.Load()), failed: int(failed.Load()), elapsed: last.Sub(start)}
	for _, h := range holds {
		r.maxHolds = max(r.maxHolds, h)
	}
	return r
}

// mutexCrowd is lockCrowd with etcd's concurrency.Mutex: a session (a
// lease kept alive) per waiter, as a process each would have.
func mutexCrowd(t *testing.T, conns []*clientv3.Client, n int, wait time.Duration) crowdRun {
	t.Helper()
	sessions := make([]*concurrency.Session, n)
	for i := range sessions {
		s, err := concurrency.NewSession(conns[i%len(conns)], concurrency.WithTTL(10))
		if err != nil {
			t.Fatal(err)
		}
		sessions[i] = s
	}
	defer func() {
		for _, s := range sessions {
			_ = s.Close()
		}
	}()
	first := concurrency.NewMutex(sessions[0], "cmutex/crowd")
	if err := first.Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	var (
		wg      sync.WaitGroup
		started sync.WaitGroup
		failed  atomic.Int64
		granted atomic.Int64
		mu      sync.Mutex
		last    time.Time
	)
	started.Add(n - 1)
	for i := 1; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(t.Context(), wait)
			defer cancel()
			m := concurrency.NewMutex(sessions[i], "cmutex/crowd")
			started.Done()
			if err := m.Lock(ctx); err != nil {
				failed.Add(1)
				t.Logf("concurrency.Mutex waiter %d: %v", i, err)
				return
			}
			granted.Add(1)
			mu.Lock()
			last = time.Now()
			mu.Unlock()
			if err := m.Unlock(context.WithoutCancel(ctx)); err != nil {
				t.Errorf("concurrency.Mutex waiter %d: unlock: %v", i, err)
			}
		}()
	}
	started.Wait()
	time.Sleep(2 * time.Second)
	start := time.Now()
	if err := first.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	return crowdRun{grants: int(granted.Load()), failed: int(failed.Load()), elapsed: last.Sub(start), maxHolds: 1}
}

// Fair() waiters on one name, each on a Client of its own, all get the
// lock, each once, and at what rate against etcd's own concurrency.Mutex
// on the same member in the same run (a session per waiter); then up to
// 200 plain waiters. Run with -etcd.waiters 1000 (the figure); the
// figures are in docs/PERFORMANCE.md.
func TestFairCrowdAgainstConcurrencyMutex(t *testing.T) {
	n := *crowdWaiters
	if n == 0 {
		t.Skip("run with -etcd.waiters N")
	}
	srv := testserver.StartEtcd(t)
	conns := make([]*clientv3.Client, *crowdClients)
	for i := range conns {
		conns[i] = srv.Client(t)
	}
	const wait = 2 * time.Minute
	cm := mutexCrowd(t, conns, n, wait)
	t.Logf("concurrency.Mutex: %d waiters, %d granted, %d failed, %v, %.0f grants/s", n-1, cm.grants, cm.failed, cm.elapsed.Round(time.Millisecond), cm.perSecond())
	fair := lockCrowd(t, conns, n, true, wait)
	t.Logf("dlock Fair():      %d waiters, %d granted, %d failed, %v, %.0f grants/s, most grants of one waiter %d", n-1, fair.grants, fair.failed, fair.elapsed.Round(time.Millisecond), fair.perSecond(), fair.maxHolds)
	plainN := min(n, 200)
	plain := lockCrowd(t, conns, plainN, false, wait)
	t.Logf("dlock plain:       %d waiters, %d granted, %d failed, %v, %.0f grants/s", plainN-1, plain.grants, plain.failed, plain.elapsed.Round(time.Millisecond), plain.perSecond())
	t.Logf("Fair() ÷ concurrency.Mutex grants/s: %.2f", fair.perSecond()/cm.perSecond())
	if fair.failed > 0 || plain.failed > 0 || fair.maxHolds != 1 {
		t.Errorf("failed waits: fair %d, plain %d; most grants of one fair waiter %d", fair.failed, plain.failed, fair.maxHolds)
	}
}

// Fair() waiters on one name, each on a Client of its own, all get the
// lock, each exactly once, with none of their waits failing: the queue's
// cost per waiter does not grow with the number of waiters.
func TestFairCrowdEachGetsTheLockOnce(t *testing.T) {
	srv := testserver.StartEtcd(t)
	conns := []*clientv3.Client{srv.Client(t), srv.Client(t)}
	const n = 300
	r := lockCrowd(t, conns, n, true, 2*time.Minute)
	t.Logf("%d waiters: %d granted in %v", n-1, r.grants, r.elapsed.Round(time.Millisecond))
	if r.failed > 0 || r.grants != n-1 || r.maxHolds != 1 {
		t.Fatalf("%d of %d waits failed, %d granted, most grants of one waiter %d; want every waiter granted once", r.failed, n-1, r.grants, r.maxHolds)
	}
}
