package redlockfaults_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redlock"
)

const (
	// ttl is the lease TTL of the contention runs: short, so that renewals,
	// losses and expiries happen many times in a run, but long enough that
	// the per-node timeout of acquire and renew, min(node timeout, TTL/10),
	// is the default 50ms, which a loaded machine running -race meets.
	ttl = 500 * time.Millisecond
	// runFor is how long each contention run lasts.
	runFor = 2 * time.Second
	// minGrants is how many grants each name must see in a run for the run
	// to prove something. A run makes 10 to 40 in runFor; under load, with
	// nodes down, many attempts fail (see work), and it goes on past runFor
	// until each name has had minGrants (contention.until).
	minGrants = 3
)

// run is the contention of most scenarios: four clients, each with a
// backend and go-redis clients of its own, on two names.
func run() contention {
	return contention{clients: 4, names: []string{"a", "b"}, ttl: ttl, run: runFor, until: minGrants}
}

// pause waits d in the test's goroutine, between faults; it reports false
// when ctx ended first.
func pause(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// A node that is down from the start only takes its vote away: two of three
// still make a quorum.
func TestNodeDownFromStart(t *testing.T) {
	ns := startNodes(t, 3)
	ns.proxies[0].Down(t)
	cfg := run()
	contend(t, cfg, ns.backends(), nil).check(t, cfg.names, minGrants)
}

// A node that goes down while leases are held and comes back later: holders
// renew on the other two, and the node rejoins with the keys it had.
func TestNodeDownMidRun(t *testing.T) {
	ns := startNodes(t, 3)
	cfg := run()
	lg := contend(t, cfg, ns.backends(), func(ctx context.Context) {
		if pause(ctx, cfg.run/3) {
			ns.proxies[1].Down(t)
		}
		if pause(ctx, cfg.run/3) {
			ns.proxies[1].Up(t)
		}
	})
	lg.check(t, cfg.names, minGrants)
}

// Five nodes lose two: one from the start, one in the middle of the run.
func TestTwoOfFiveDown(t *testing.T) {
	ns := startNodes(t, 5)
	ns.proxies[0].Down(t)
	cfg := run()
	lg := contend(t, cfg, ns.backends(), func(ctx context.Context) {
		if pause(ctx, cfg.run/3) {
			ns.proxies[3].Down(t)
		}
	})
	lg.check(t, cfg.names, minGrants)
}

// cycleTimes times n uncontended TryLocks of fresh names by one client, one
// after another, and the Unlocks of the first few of them, one after
// another; the other leases are unlocked all at once, untimed, so that
// releases that wait for a silent node cost the test little. A TryLock that
// fails (a healthy node can miss its 50ms on a loaded machine running -race)
// is logged and left out; most must succeed.
func cycleTimes(t *testing.T, b *redlock.Backend, prefix string, n int) (acquire, release []time.Duration) {
	t.Helper()
	const timedReleases = 3
	c := dlock.New(b, dlock.WithTTL(10*time.Second))
	defer c.Close()
	ctx := t.Context()
	var leases []*dlock.Lease
	failed := 0
	for i := range n {
		start := time.Now()
		l, err := c.Mutex(fmt.Sprintf("%s/%d", prefix, i)).TryLock(ctx)
		if err != nil {
			failed++
			t.Logf("TryLock %d: %v", i, err)
			continue
		}
		acquire = append(acquire, time.Since(start))
		leases = append(leases, l)
	}
	if failed > n/4 {
		t.Fatalf("%d of %d TryLocks failed", failed, n)
	}
	for i, l := range leases {
		if i == timedReleases {
			break
		}
		start := time.Now()
		if err := l.Unlock(ctx); err != nil {
			t.Logf("Unlock %d: %v", i, err)
			continue
		}
		release = append(release, time.Since(start))
	}
	var wg sync.WaitGroup
	for _, l := range leases[min(timedReleases, len(leases)):] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = l.Unlock(ctx)
		}()
	}
	wg.Wait()
	return acquire, release
}

// lockSoon locks m, trying again a few times when the store fails (a
// healthy node can miss its 50ms on a loaded machine).
func lockSoon(t *testing.T, m *dlock.Mutex) *dlock.Lease {
	t.Helper()
	var err error
	for range 5 {
		var l *dlock.Lease
		if l, err = m.Lock(t.Context()); err == nil {
			return l
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("Lock %s: %v", m.Name(), err)
	return nil
}

// logTimes logs the p50 and p99 of acquire and release times.
func logTimes(t *testing.T, what string, acquire, release []time.Duration) {
	t.Helper()
	a50, a99 := percentiles(acquire)
	r50, r99 := percentiles(release)
	t.Logf("%-28s acquire p50 %-10v p99 %-10v release p50 %-10v p99 %v", what+":",
		a50.Round(time.Microsecond), a99.Round(time.Microsecond), r50.Round(time.Microsecond), r99.Round(time.Microsecond))
}

// A partitioned node answers nothing, not even an error. The decision is
// made at quorum, so an acquire must not wait for it.
func TestPartitionedNodeDoesNotSlowAcquire(t *testing.T) {
	for _, tc := range []struct {
		nodes int
		cut   []int
	}{{3, []int{2}}, {5, []int{1, 3}}} {
		t.Run(fmt.Sprintf("%d-of-%d", len(tc.cut), tc.nodes), func(t *testing.T) {
			ns := startNodes(t, tc.nodes)
			// With a long node timeout, an acquire that waited for the
			// silent node would take at least that long; a healthy one
			// takes a few milliseconds even on a loaded machine.
			const nodeTimeout = 500 * time.Millisecond
			opt := redlock.WithNodeTimeout(nodeTimeout)
			const n = 40
			acq, rel := cycleTimes(t, ns.redlock(t, opt), "base", n)
			logTimes(t, "no fault", acq, rel)
			for _, i := range tc.cut {
				ns.proxies[i].Partition(t)
			}
			acq, rel = cycleTimes(t, ns.redlock(t, opt), "cut", n)
			logTimes(t, fmt.Sprintf("%d partitioned (timeout %v)", len(tc.cut), nodeTimeout), acq, rel)
			if p50, _ := percentiles(acq); p50 >= nodeTimeout {
				t.Errorf("acquire p50 %v with %d of %d nodes partitioned: it waited for the silent nodes (node timeout %v)",
					p50, len(tc.cut), tc.nodes, nodeTimeout)
			}

			// Contention through the partition, with the default node timeout.
			cfg := run()
			contend(t, cfg, ns.backends(), nil).check(t, cfg.names, minGrants)
		})
	}
}

// A minority of slow nodes: grants are decided by the fast majority.
func TestLatencyOnMinority(t *testing.T) {
	const latency = 30 * time.Millisecond
	for _, tc := range []struct {
		nodes int
		slow  []int
	}{{3, []int{0}}, {5, []int{0, 4}}} {
		t.Run(fmt.Sprintf("%d-of-%d", len(tc.slow), tc.nodes), func(t *testing.T) {
			ns := startNodes(t, tc.nodes)
			acq, rel := cycleTimes(t, ns.redlock(t), "base", 40)
			logTimes(t, "no fault", acq, rel)
			for _, i := range tc.slow {
				ns.proxies[i].Latency(t, latency)
			}
			acq, rel = cycleTimes(t, ns.redlock(t), "slow", 40)
			logTimes(t, fmt.Sprintf("%d slowed by %v", len(tc.slow), latency), acq, rel)

			// The slow nodes answer within the 50ms node timeout.
			cfg := run()
			contend(t, cfg, ns.backends(), nil).check(t, cfg.names, minGrants)
		})
	}
}

// When a majority is lost, holders are told within the TTL that their
// leases are gone; a TryLock fails with a *redlock.QuorumError that names
// the nodes that failed, and a Lock, for which a quorum miss may heal, tries
// again until its wait ends, then returns ErrNotObtained wrapping that
// error.
func TestMajorityLost(t *testing.T) {
	for _, fault := range []string{"down", "partitioned"} {
		t.Run(fault, func(t *testing.T) {
			ns := startNodes(t, 3)
			lost := []int{1, 2}
			ctx := t.Context()

			holder := dlock.New(ns.redlock(t), dlock.WithTTL(ttl))
			defer holder.Close()
			var leases []*dlock.Lease
			for _, name := range []string{"held-1", "held-2"} {
				leases = append(leases, lockSoon(t, holder.Mutex(name)))
			}
			// Let a renewal or two go through first.
			time.Sleep(ttl / 2)

			for _, i := range lost {
				if fault == "down" {
					ns.proxies[i].Down(t)
				} else {
					ns.proxies[i].Partition(t)
				}
			}
			faultAt := time.Now() // no renewal sent after this can succeed

			timeout := time.NewTimer(10 * ttl)
			defer timeout.Stop()
			for _, l := range leases {
				select {
				case <-l.Done():
				case <-timeout.C:
					t.Fatalf("%s: not told of the loss %v after the majority was lost (TTL %v)", l.Name(), 10*ttl, ttl)
				}
				seen := time.Since(faultAt)
				var le *dlock.LostError
				if err := l.Err(); !errors.As(err, &le) || le.Reason != dlock.LostUnreachable {
					t.Errorf("%s: Err = %v, want a *LostError with reason %q", l.Name(), err, dlock.LostUnreachable)
				}
				// The lease's validity ran from its last successful
				// renewal, sent before the fault: it cannot reach past
				// the fault by more than the TTL.
				if valid := l.Deadline().Sub(faultAt); valid > ttl {
					t.Errorf("%s: deadline %v after the majority was lost, more than the TTL (%v)", l.Name(), valid, ttl)
				}
				t.Logf("%s: loss seen %v after the fault (TTL %v; deadline at fault+%v): %v",
					l.Name(), seen.Round(time.Millisecond), ttl, l.Deadline().Sub(faultAt).Round(time.Millisecond), l.Err())
			}

			c := dlock.New(ns.redlock(t), dlock.WithTTL(ttl))
			defer c.Close()
			tryErr := func(name string, lock bool) error {
				var err error
				if lock {
					const wait = 2 * time.Second
					lctx, cancel := context.WithTimeout(ctx, wait)
					defer cancel()
					_, err = c.Mutex(name).Lock(lctx)
					if lctx.Err() == nil {
						t.Errorf("Lock %s returned before its %v wait ended: %v", name, wait, err)
					}
				} else {
					_, err = c.Mutex(name).TryLock(ctx)
				}
				return err
			}
			for _, call := range []struct {
				name string
				lock bool
			}{{"fresh-try", false}, {"fresh-lock", true}} {
				err := tryErr(call.name, call.lock)
				checkQuorumError(t, ns, err, call.name, lost, call.lock)
			}

			// Back to a majority: locks work again.
			for _, i := range lost {
				ns.proxies[i].Up(t)
				ns.proxies[i].Heal(t)
			}
			l := lockSoon(t, c.Mutex("after"))
			if err := l.Unlock(ctx); err != nil {
				t.Errorf("Unlock after the nodes came back: %v", err)
			}
		})
	}
}

// checkQuorumError checks that err unwraps to a *redlock.QuorumError for
// name whose node errors include one for each node in lost (a healthy node
// may have missed its deadline too on a loaded machine; that is logged),
// and matches ErrNotObtained when notObtained (a Lock whose wait ended)
// and not otherwise (a TryLock's store failure).
func checkQuorumError(t *testing.T, ns *nodes, err error, name string, lost []int, notObtained bool) {
	t.Helper()
	var qe *redlock.QuorumError
	if !errors.As(err, &qe) {
		t.Errorf("%s: error %v (%T), want a *redlock.QuorumError", name, err, err)
		return
	}
	if errors.Is(err, dlock.ErrNotObtained) != notObtained {
		t.Errorf("%s: store failure %v: matches ErrNotObtained %v, want %v", name, err, !notObtained, notObtained)
	}
	n := len(ns.proxies)
	if qe.Nodes != n || qe.Quorum != n/2+1 || qe.OK > n-len(lost) {
		t.Errorf("%s: QuorumError Nodes %d Quorum %d OK %d; want %d, %d, at most %d",
			name, qe.Nodes, qe.Quorum, qe.OK, n, n/2+1, n-len(lost))
	}
	if qe.Op == "" || !strings.Contains(qe.Key, name) {
		t.Errorf("%s: QuorumError Op %q Key %q; want an operation and the lock's key", name, qe.Op, qe.Key)
	}
	var failed []int
	for _, e := range qe.Unwrap() {
		var ne *redlock.NodeError
		if !errors.As(e, &ne) {
			t.Errorf("%s: QuorumError lists %v (%T), not a *redlock.NodeError", name, e, e)
			continue
		}
		failed = append(failed, ne.Node)
		if ne.Node < 0 || ne.Node >= n {
			t.Errorf("%s: NodeError for node %d of %d", name, ne.Node, n)
			continue
		}
		if ne.Addr != ns.proxies[ne.Node].Addr() {
			t.Errorf("%s: NodeError for node %d has address %q, want %q", name, ne.Node, ne.Addr, ns.proxies[ne.Node].Addr())
		}
		if ne.Err == nil {
			t.Errorf("%s: NodeError for node %d without a cause", name, ne.Node)
		}
	}
	slices.Sort(failed)
	for _, i := range lost {
		if !slices.Contains(failed, i) {
			t.Errorf("%s: QuorumError lists nodes %v, want all of %v", name, failed, lost)
			break
		}
	}
	if len(failed) > len(lost) {
		t.Logf("%s: QuorumError lists nodes %v: a healthy node failed too", name, failed)
	}
	t.Logf("%s: %v", name, err)
}

// A client that waited for locks while a node was silent must still close
// promptly: Close ends the waits and the notification streams, and a node
// that answers nothing must not hold it up. The clients here use go-redis's
// default timeouts (3s for a call without a deadline), as an application
// would.
func TestCloseWithSilentNode(t *testing.T) {
	ns := startNodes(t, 3)
	backend := func() *redlock.Backend {
		clients := make([]redis.UniversalClient, len(ns.proxies))
		for i, px := range ns.proxies {
			rdb := redis.NewClient(&redis.Options{Addr: px.Addr(), ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = rdb.Close() })
			clients[i] = rdb
		}
		b, err := redlock.New(clients)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	holder := dlock.New(backend(), dlock.WithTTL(10*time.Second))
	defer holder.Close()
	names := []string{"x", "y", "z"}
	for _, name := range names {
		lockSoon(t, holder.Mutex(name))
	}
	ns.proxies[2].Partition(t)

	waiter := dlock.New(backend())
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := waiter.Mutex(name).Lock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
				t.Errorf("Lock %s held by another = %v, want ErrNotObtained", name, err)
			}
		}()
	}
	wg.Wait()
	start := time.Now()
	if err := waiter.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	took := time.Since(start)
	t.Logf("Close took %v after waits on %d names with node 2 partitioned", took.Round(time.Millisecond), len(names))
	if took > dlock.CloseTimeout {
		t.Errorf("Close took %v with a silent node, more than CloseTimeout (%v); it holds no lease", took, dlock.CloseTimeout)
	}
}
