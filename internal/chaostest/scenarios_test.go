package chaostest

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/locktest/chaos"
)

// The in-process scenarios: every client is a goroutine of the test
// process with connections of its own.

// runBoth runs base twice on its store: the stock workload on a fenced
// resource, then the set workload, with longer critical sections that
// need renewals, on an unfenced one (where any overlap shows as a lost
// update or a vanished member).
func runBoth(t *testing.T, base scenario, setThink time.Duration) {
	t.Helper()
	stock := base
	stock.workload, stock.fenced, stock.names = chaos.Stock, true, prefixed("stock-", base.names)
	runScenario(t, stock)
	set := base
	set.workload, set.fenced, set.names = chaos.Set, false, prefixed("set-", base.names)
	if setThink > 0 {
		set.think = setThink
	}
	runScenario(t, set)
}

// prefixed returns names with prefix, or two prefixed names (eight in a
// soak) when names is empty.
func prefixed(prefix string, names []string) []string {
	if len(names) == 0 {
		names = []string{"a", "b"}
		if *soak {
			names = []string{"a", "b", "c", "d", "e", "f", "g", "h"}
		}
	}
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = prefix + n
	}
	return out
}

// longThink is the think time of the set workload: up to half the TTL, so
// that about one critical section in three outlives the first renewal
// (due at TTL/3).
const longThink = defaultTTL / 2

// TestBaseline runs the workloads with no fault at all, on every backend:
// nothing may be broken. A third run mixes the two sides of a read-write
// lock and a semaphore of two permits, for the shared-mode invariants.
func TestBaseline(t *testing.T) {
	for _, kind := range allKinds {
		t.Run(kind, func(t *testing.T) {
			s := startStore(t, kind, storeOptions{})
			runBoth(t, scenario{store: s, duration: 1500 * time.Millisecond}, longThink)

			targets := []chaos.Target{
				{Name: "rw", Mode: chaos.Exclusive, RW: true},
				{Name: "rw", Mode: chaos.Shared},
			}
			if kind != kindRedlock { // redlock has no semaphores
				targets = append(targets, chaos.Target{Name: "sem", Mode: chaos.Permit, Limit: 2})
			}
			runScenario(t, scenario{store: s, workload: chaos.Stock, targets: targets, duration: 1500 * time.Millisecond})
		})
	}
}

// TestCancel cancels contexts at random, on every backend: a fifth of the
// acquires, unlocks and manual refreshes have their context cancelled
// within 2ms, mid-call on the networked stores. Cancelled calls may leave
// a grant or a hold behind on the store, but no two holders, and every
// such hold expires.
func TestCancel(t *testing.T) {
	for _, kind := range allKinds {
		t.Run(kind, func(t *testing.T) {
			s := startStore(t, kind, storeOptions{})
			runBoth(t, scenario{store: s, cancelRate: 0.2, duration: 1500 * time.Millisecond}, longThink)
		})
	}
}

// latencySteps are the round-trip delays TestLatency cycles through, each
// for latencyStep: from barely noticeable, past redlock's node timeout
// (min(50ms, TTL/10)), where the slow node's votes stop counting, to half
// the TTL, where an acquire on a SQL store (several round trips) leaves
// little of the lease's validity.
var latencySteps = []time.Duration{10 * time.Millisecond, 40 * time.Millisecond, 80 * time.Millisecond, 250 * time.Millisecond, 0}

const latencyStep = 300 * time.Millisecond

// TestLatency slows the answers of the store down (toxiproxy latency
// between every client and the server; on redlock, between every client
// and one of the three nodes), changing the delay every few hundred
// milliseconds. Leases may be lost, but must be reported in time, and
// nothing may be broken.
func TestLatency(t *testing.T) {
	for _, kind := range []string{kindRedis, kindRedlock, kindMariaDB, kindPostgres} {
		t.Run(kind, func(t *testing.T) {
			s := startStore(t, kind, storeOptions{Proxy: true})
			px, where := s.proxy, "every client and the server"
			if kind == kindRedlock {
				px, where = s.proxies[0], "every client and node 0"
			}
			faults := func(ctx context.Context, r *runState) {
				defer func() {
					px.ClearLatency(t)
					r.rec.Note("latency removed")
				}()
				for i := 0; ; i++ {
					d := latencySteps[i%len(latencySteps)]
					px.Latency(t, d)
					r.rec.Note("latency %v between %s", d, where)
					if !r.sleep(ctx, latencyStep) {
						return
					}
				}
			}
			runBoth(t, scenario{store: s, faults: faults, duration: 1500 * time.Millisecond}, longThink)
		})
	}
}

// TestPartition cuts one client off from the store while it is inside a
// critical section, for longer than the TTL, then heals; the other clients
// keep their way to the store. Every client reaches the store through a
// proxy of its own, and the first to stop before a write once a round is
// armed is the one cut off (whoever holds the lock: waiting for a given
// client could take long, as locks are not fair). It ignores the loss of
// its lease (Worker.IgnoreLoss) and writes once it has been told of it and
// another client has had time to take the lock over: on an unfenced
// resource the late write must be found (and usually loses an update); on a
// fenced one it must be refused or harmless. Every loss must be reported to
// its holder before the lease's local deadline.
func TestPartition(t *testing.T) {
	for _, kind := range []string{kindRedis, kindMariaDB, kindPostgres} {
		t.Run(kind, func(t *testing.T) {
			s := startStore(t, kind, storeOptions{})
			for _, fenced := range []bool{false, true} {
				p := &partition{ttl: defaultTTL, inCS: make(chan holding), resume: make(chan struct{}, 1)}
				var specs []storeSpec
				for range defaultClients {
					spec, px := s.ownProxy(t)
					specs = append(specs, spec)
					p.proxies = append(p.proxies, px)
				}
				sc := scenario{
					store: s, specs: specs, workload: chaos.Stock, fenced: fenced, ignoreLoss: true,
					duration: 3 * time.Second, setup: p.setup, faults: p.faults,
					expect: expect{why: "a partitioned holder that ignores its lost lease writes late", may: late},
				}
				if !fenced {
					sc.expect.must = late
				}
				sc.extra = func(t *testing.T, r *runState) {
					t.Logf("%d partition rounds; %d stale accesses refused, %d accepted; %d late writes accepted",
						p.rounds, r.report.StaleRejected, r.report.StaleAccepted, r.report.LateWrites)
				}
				runScenario(t, sc)
			}
		})
	}
}

// partition is the fault injector of TestPartition.
type partition struct {
	proxies []*testserver.Proxy // client i's own path to the store
	ttl     time.Duration
	armed   atomic.Bool
	inCS    chan holding  // from the hook: "I hold this lease and am about to write"
	resume  chan struct{} // to the hook: "write now"
	rounds  int
}

// holding is a worker stopped before its write.
type holding struct {
	worker int // index in runState.workers
	lease  *dlock.Lease
}

// setup makes every worker stop before its write when a round is armed,
// the first one only.
func (p *partition) setup(r *runState) {
	for i, w := range r.workers {
		w.BeforeWrite = func(ctx context.Context, l *dlock.Lease) {
			if !p.armed.CompareAndSwap(true, false) {
				return
			}
			select {
			case p.inCS <- holding{i, l}:
			case <-ctx.Done():
				return
			}
			select {
			case <-p.resume:
			case <-ctx.Done():
			}
		}
	}
}

// faults runs rounds of: wait for a client to be about to write, cut its
// path to the store, wait until it is told of its loss, let another client
// take over, let it write, heal. A short run has time for one or two
// rounds, a soak runs them until the end.
func (p *partition) faults(ctx context.Context, r *runState) {
	t := r.t
	defer func() {
		p.armed.Store(false)
		select {
		case p.resume <- struct{}{}:
		default:
		}
		for _, px := range p.proxies {
			px.Heal(t)
		}
	}()
	for round := 1; ; round++ {
		// Let the clients settle after the last heal.
		if !r.sleep(ctx, p.ttl) {
			return
		}
		p.armed.Store(true)
		var h holding
		select {
		case h = <-p.inCS:
		case <-ctx.Done():
			return
		}
		c := r.workers[h.worker].Client
		p.proxies[h.worker].Partition(t)
		r.rec.Note("round %d: partitioned %s from the store; it holds fence %d and is about to write", round, c, h.lease.Fence())
		told := time.NewTimer(3 * p.ttl)
		select {
		case <-h.lease.Done():
			r.rec.Note("round %d: %s told of its loss: %v", round, c, h.lease.Err())
		case <-told.C:
			t.Errorf("round %d: %s not told of the loss of its lease %v after the partition began", round, c, 3*p.ttl)
		case <-ctx.Done():
		}
		told.Stop()
		// The store frees the lock a safety margin after the loss; give
		// a waiter time to take it, and maybe to write.
		r.sleep(ctx, p.ttl/4+rand.N(p.ttl/2))
		r.rec.Note("round %d: %s writes, ignoring its loss", round, c)
		p.resume <- struct{}{}
		if !r.sleep(ctx, p.ttl/2) {
			return
		}
		p.proxies[h.worker].Heal(t)
		r.rec.Note("round %d: healed %s's path to the store", round, c)
		p.rounds = round
	}
}
