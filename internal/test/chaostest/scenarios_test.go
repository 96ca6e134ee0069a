package chaostest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/test/testserver"
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

// TestCancel cancels contexts at random, on every backend, on eight names:
// a fifth of the acquires, unlocks and manual refreshes have their context
// cancelled within cancelWithin. Cancelled calls may leave a grant or a
// hold behind on the store, but no two holders, and every such hold
// expires. The runs must show that cancellations landed: an acquire, a
// refresh and an unlock, at least, that failed for one, over the two runs
// of a store (a refresh is cancelled in one critical section in
// twenty-five: the set run alone has too few). Where the two runs had
// none of a kind, by chance (a slow machine returns many calls before
// their cancellation fires), further set runs follow, up to three.
func TestCancel(t *testing.T) {
	for _, kind := range allKinds {
		t.Run(kind, func(t *testing.T) {
			s := startStore(t, kind, storeOptions{})
			var tally cancelTally
			base := scenario{
				store: s, names: cancelNames(), cancelRate: 0.2, cancelWithin: cancelWithin(kind),
				duration: 1500 * time.Millisecond, faults: tally.watch, extra: tally.count,
			}
			if kind == kindRedlock {
				// A cancelled call closes its connection, so Redlock's calls
				// dial again and again through the in-process proxies, which
				// under -race on a busy machine took longer than a 500ms
				// TTL's node timeout (50ms): no grant in a whole run, at the
				// base commit too. Cancellation is what is tested here.
				s.spec.NodeTimeout = 250 * time.Millisecond
				base.ttl = 2500 * time.Millisecond
				// And the nodes' answers stalled for 2s at a time there:
				// a run of 1.5s then granted nothing, and proved nothing.
				base.duration = 3 * time.Second
			}
			runBoth(t, base, longThink)
			// More runs until a call of each kind was cut short: a renewal
			// on SQLite takes about as long as the cancellation's delay,
			// and 5 runs once cut none of 27.
			for more := 1; !tally.landedEach() && more <= 6; more++ {
				set := base
				set.workload, set.names, set.think = chaos.Set, prefixed(fmt.Sprintf("set%d-", more), base.names), longThink
				runScenario(t, set)
			}
			tally.check(t)
		})
	}
}

// TestSharedClients runs three workers on each of two clients, as
// goroutines of one service, on every backend: a waiter's attempt parks
// while its own client holds the name, and the client's release carries it
// (the recorder carries it as a release and then an acquire where the
// store cannot), with a tenth of the calls cancelled, parked attempts and
// releases that carry one included; then writers and readers of one name,
// and a fair run. Nothing may be broken, and no fair wait may end before
// its time.
func TestSharedClients(t *testing.T) {
	for _, kind := range allKinds {
		t.Run(kind, func(t *testing.T) {
			s := startStore(t, kind, storeOptions{})
			base := scenario{store: s, clients: 2, perClient: 3, duration: 1500 * time.Millisecond}
			if kind == kindRedlock {
				s.spec.NodeTimeout = 250 * time.Millisecond // as in TestCancel
				base.ttl = 2500 * time.Millisecond
			}
			cancels := base
			cancels.label, cancels.cancelRate, cancels.cancelWithin = "shared-clients-cancel", 0.1, cancelWithin(kind)
			cancels.workload, cancels.fenced, cancels.names = chaos.Stock, true, prefixed("stock-", nil)
			runScenario(t, cancels)
			// Writers and readers of one name: readers ride their own
			// client's writer's release too.
			rw := base
			rw.label, rw.workload = "shared-clients-rw", chaos.Stock
			rw.targets = []chaos.Target{{Name: "rw", Mode: chaos.Exclusive, RW: true}, {Name: "rw", Mode: chaos.Shared}}
			runScenario(t, rw)
			if kind == kindRedlock {
				return // no fair locks (see TestFair)
			}
			fair := base
			fair.label, fair.lockOpts, fair.waitsHold = "shared-clients-fair", []dlock.Option{dlock.Fair()}, true
			fair.workload, fair.names, fair.think = chaos.Set, prefixed("set-", nil), longThink
			runScenario(t, fair)
		})
	}
}

// cancelNames are TestCancel's names: eight, as in a soak, so that the
// runs have enough manual refreshes to cancel.
func cancelNames() []string {
	return []string{"a", "b", "c", "d", "e", "f", "g", "h"}
}

// cancelWithin is the longest delay of TestCancel's cancellations on a
// store of kind (Worker.CancelWithin), about a refresh's time on the store
// under -race: the worker's 2ms default is ten times that or more, and
// nearly every cancellation came after the call had returned. Where a call
// notices its context only before it goes out (memlock checks it on entry;
// go-redis on taking a connection, not while it waits for the answer), a
// cancellation lands only if it fires before then, so those get the
// shortest delay the worker takes (1ns: at its timer's first chance).
func cancelWithin(kind string) time.Duration {
	switch kind {
	case kindMemlock, kindRedis:
		return time.Nanosecond
	case kindPostgres:
		return 300 * time.Microsecond
	}
	return 100 * time.Microsecond // redlock (before its fan-out), SQLite, MariaDB
}

// cancelledText are the marks of a call cut short by its context: the
// injected cause (Lock reports context.Cause) or the context's error
// (Refresh and Unlock report ctx.Err(), wrapped; drivers the same).
var cancelledText = []string{"chaos: injected cancellation", context.Canceled.Error()}

// cancelTally counts, over the runs of one store, the acquires, manual
// refreshes and unlocks, and those that failed for a cancelled context.
type cancelTally struct {
	ended  atomic.Int64 // when the current run's context ended
	calls  map[chaos.Kind]int
	landed map[chaos.Kind]int
}

// watch notes when the run's context ends (scenario.faults): calls that
// ended later may have been cut short by the run's end, not by an injected
// cancellation.
func (c *cancelTally) watch(ctx context.Context, _ *runState) {
	c.ended.Store(math.MaxInt64)
	<-ctx.Done()
	c.ended.Store(chaos.Now())
}

// count adds a run's calls (scenario.extra) and logs them.
func (c *cancelTally) count(t *testing.T, r *runState) {
	t.Helper()
	if c.calls == nil {
		c.calls, c.landed = map[chaos.Kind]int{}, map[chaos.Kind]int{}
	}
	ended := c.ended.Load()
	calls, landed := map[chaos.Kind]int{}, map[chaos.Kind]int{}
	for _, e := range r.rec.Events() {
		switch e.Kind {
		case chaos.KindAcquire, chaos.KindRenew, chaos.KindRelease:
		default:
			continue
		}
		calls[e.Kind]++
		if e.End >= ended || e.Err == "" {
			continue
		}
		for _, text := range cancelledText {
			if strings.Contains(e.Err, text) {
				landed[e.Kind]++
				break
			}
		}
	}
	for k, n := range calls {
		c.calls[k] += n
		c.landed[k] += landed[k]
	}
	t.Logf("calls that failed for an injected cancellation: %s", cancelCounts(calls, landed))
}

// landedEach reports whether an acquire, a refresh and an unlock have
// failed for a cancelled context in the runs counted so far.
func (c *cancelTally) landedEach() bool {
	for _, k := range cancelKinds {
		if c.landed[k] == 0 {
			return false
		}
	}
	return true
}

// cancelKinds are the calls TestCancel must see cut short.
var cancelKinds = []chaos.Kind{chaos.KindAcquire, chaos.KindRenew, chaos.KindRelease}

// check fails the test unless an acquire, a refresh and an unlock failed
// for a cancelled context in the runs counted.
func (c *cancelTally) check(t *testing.T) {
	t.Helper()
	t.Logf("calls that failed for an injected cancellation, all runs: %s", cancelCounts(c.calls, c.landed))
	for _, k := range cancelKinds {
		if c.landed[k] == 0 {
			t.Errorf("no %s call (of %d) failed for a cancelled context: cancellation was not put to the test there", k, c.calls[k])
		}
	}
}

func cancelCounts(calls, landed map[chaos.Kind]int) string {
	return fmt.Sprintf("%d of %d acquires, %d of %d refreshes, %d of %d unlocks",
		landed[chaos.KindAcquire], calls[chaos.KindAcquire], landed[chaos.KindRenew], calls[chaos.KindRenew],
		landed[chaos.KindRelease], calls[chaos.KindRelease])
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
// its lease (Worker.IgnoreLoss): once it has been told of the loss, and
// another client has then taken the lock and had a write accepted on the
// same name, it makes its own write. On an unfenced resource that late
// write must be accepted and lose the other's update; on a fenced one it
// must be refused. Every loss must be reported to its holder before the
// lease's local deadline. A short run makes partitionRounds rounds and
// ends; a soak makes rounds until its critical sections are done.
func TestPartition(t *testing.T) {
	for _, kind := range []string{kindRedis, kindMariaDB, kindPostgres} {
		t.Run(kind, func(t *testing.T) {
			s := startStore(t, kind, storeOptions{})
			for _, fenced := range []bool{false, true} {
				p := &partition{ttl: defaultTTL, inCS: make(chan holding), resume: make(chan struct{}, 1)}
				var specs []storeSpec
				for range defaultClients {
					spec, px := s.ownProxy(t)
					specs = append(specs, endsIdleTransactions(t, spec))
					p.proxies = append(p.proxies, px)
				}
				sc := scenario{
					store: s, specs: specs, workload: chaos.Stock, fenced: fenced, ignoreLoss: true,
					duration: partitionLimit, setup: p.setup, faults: p.faults, extra: p.check,
					expect: expect{why: "a partitioned holder that ignores its lost lease writes late", may: late},
				}
				if !fenced {
					sc.expect.must = late
				}
				runScenario(t, sc)
			}
		})
	}
}

const (
	// partitionRounds is the number of rounds of a short TestPartition
	// run, which ends after them.
	partitionRounds = 4
	// partitionLimit bounds a short TestPartition run (a round takes
	// about a second: half a TTL to settle, the loss, the takeover).
	partitionLimit = 20 * time.Second
)

// partition is the fault injector of TestPartition.
type partition struct {
	proxies []*testserver.Proxy // client i's own path to the store
	ttl     time.Duration
	armed   atomic.Bool
	inCS    chan holding  // from the hook: "I hold this lease and am about to write"
	resume  chan struct{} // to the hook: "write now"

	mu   sync.Mutex
	cur  *round   // the round under way, nil between rounds
	done []*round // the rounds whose late write was made
	// soldOut: a round's name sold out (a soak sizes the stock to sell
	// out near its end), so no takeover write can come; the rounds stop
	// and the run goes on to its count.
	soldOut bool
}

// holding is a worker stopped before its write.
type holding struct {
	worker int // index in runState.workers
	lease  *dlock.Lease
}

// round is one partition of a holder, as the resource saw it.
type round struct {
	n            int
	client, name string
	fence        uint64 // the partitioned holder's
	// Set under partition.mu: when the holder was told of its loss (0
	// before), and the first write of another client on name accepted
	// after that (takeover is closed then).
	toldAt   int64
	by       string
	byFence  uint64
	takeover chan struct{}
	late     chan error // the answer to the holder's late write
	lateErr  error
}

// setup makes every worker stop before its write when a round is armed,
// the first one only, and watches the writes every worker makes.
func (p *partition) setup(r *runState) {
	for i, w := range r.workers {
		w.Resource = watched{Accessor: w.Resource, p: p}
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

// watched is a worker's way to the resource, which tells the partition of
// every write and its answer.
type watched struct {
	chaos.Accessor
	p *partition
}

// Write writes through to the resource.
func (w watched) Write(ctx context.Context, a chaos.Access, v chaos.Value) error {
	start := chaos.Now()
	err := w.Accessor.Write(ctx, a, v)
	w.p.wrote(a, start, err)
	return err
}

// wrote notes a write that began at start and was answered err: the
// partitioned holder's late write, or another client's taking over.
func (p *partition) wrote(a chaos.Access, start int64, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	rd := p.cur
	switch {
	case rd == nil || a.Name != rd.name:
	case a.Client == rd.client:
		if a.Fence == rd.fence {
			select {
			case rd.late <- err:
			default:
			}
		}
	case err == nil && rd.toldAt != 0 && start >= rd.toldAt && rd.by == "":
		rd.by, rd.byFence = a.Client, a.Fence
		close(rd.takeover)
	}
}

// faults runs rounds of: wait for a client to be about to write, cut its
// path to the store, wait until it is told of its loss, then until another
// client has had a write accepted on the same name, let the cut-off client
// write, wait for the answer, heal. It ends the run when it returns: after
// partitionRounds rounds in a short run, when a round went wrong, or when
// the run ended.
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
		p.mu.Lock()
		p.cur = nil
		p.mu.Unlock()
		if !p.soldOut {
			r.end()
		}
	}()
	// wait waits for ch until d has passed or ctx ended, and reports
	// whether ch came and, if not, whether d passed.
	wait := func(ch <-chan struct{}, d time.Duration) (came, timedOut bool) {
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-ch:
			return true, false
		case <-timer.C:
			return false, true
		case <-ctx.Done():
			return false, false
		}
	}
	for n := 1; ; n++ {
		// Let the clients settle after the last heal.
		if !r.sleep(ctx, p.ttl/2) {
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
		rd := &round{n: n, client: c, name: h.lease.Name(), fence: h.lease.Fence(),
			takeover: make(chan struct{}), late: make(chan error, 1)}
		p.mu.Lock()
		p.cur = rd
		p.mu.Unlock()
		p.proxies[h.worker].Partition(t)
		r.rec.Note("round %d: partitioned %s from the store; it holds %q with fence %d and is about to write", n, c, rd.name, rd.fence)

		if came, timedOut := wait(h.lease.Done(), 3*p.ttl); !came {
			if timedOut {
				t.Errorf("round %d: %s not told of the loss of its lease %v after the partition began", n, c, 3*p.ttl)
			}
			return
		}
		p.mu.Lock()
		rd.toldAt = chaos.Now()
		p.mu.Unlock()
		r.rec.Note("round %d: %s told of its loss: %v", n, c, h.lease.Err())

		if came, timedOut := wait(rd.takeover, 5*p.ttl); !came {
			if timedOut && r.res.Snapshot(rd.name).Stock <= 0 {
				r.rec.Note("round %d: %q is sold out, so no other client writes it; no more rounds", n, rd.name)
				t.Logf("round %d: %q sold out; the rounds end, the run goes on", n, rd.name)
				p.soldOut = true
				return
			}
			if timedOut {
				t.Errorf("round %d: no other client had a write on %q accepted within %v after %s was told of its loss; "+
					"the late write would prove nothing", n, rd.name, 5*p.ttl, c)
			}
			return
		}
		p.mu.Lock()
		by, byFence := rd.by, rd.byFence
		p.mu.Unlock()
		r.rec.Note("round %d: %s took %q over and wrote with fence %d; %s writes now, ignoring its loss", n, by, rd.name, byFence, c)
		p.resume <- struct{}{}
		// The write is made even when the run ends meanwhile.
		timer := time.NewTimer(30 * time.Second)
		select {
		case rd.lateErr = <-rd.late:
			timer.Stop()
		case <-timer.C:
			t.Errorf("round %d: %s's late write not made 30s after it was let go", n, c)
			return
		}
		if rd.lateErr == nil {
			r.rec.Note("round %d: %s's late write with fence %d accepted", n, c, rd.fence)
		} else {
			r.rec.Note("round %d: %s's late write with fence %d refused: %v", n, c, rd.fence, rd.lateErr)
		}
		p.mu.Lock()
		p.cur = nil
		p.done = append(p.done, rd)
		p.mu.Unlock()
		p.proxies[h.worker].Heal(t)
		r.rec.Note("round %d: healed %s's path to the store", n, c)
		if !r.soak && n >= partitionRounds {
			return
		}
	}
}

// check asserts what the rounds must have caused (scenario.extra): on a
// fenced resource every late write refused, none stale accepted; on an
// unfenced one every late write accepted, late, and losing an update.
func (p *partition) check(t *testing.T, r *runState) {
	t.Helper()
	rp := r.report
	p.mu.Lock()
	rounds := p.done
	p.mu.Unlock()
	if len(rounds) == 0 {
		t.Errorf("no partition round was completed: the run proves nothing about late writes")
		return
	}
	for _, rd := range rounds {
		switch {
		case r.sc.fenced && !errors.Is(rd.lateErr, chaos.ErrStale):
			t.Errorf("round %d: the fenced resource answered %s's late write (fence %d, after %s's write with fence %d) with %v; want it refused as stale",
				rd.n, rd.client, rd.fence, rd.by, rd.byFence, rd.lateErr)
		case !r.sc.fenced && rd.lateErr != nil:
			t.Errorf("round %d: the unfenced resource refused %s's late write: %v", rd.n, rd.client, rd.lateErr)
		}
	}
	n := len(rounds)
	if r.sc.fenced {
		t.Logf("expected: after each of %d rounds the fenced resource refuses the partitioned holder's late write, as another client wrote with a higher fence first; "+
			"found %d stale accesses refused, %d accepted", n, rp.StaleRejected, rp.StaleAccepted)
		if rp.StaleRejected < n || rp.StaleAccepted != 0 {
			t.Errorf("fenced: %d stale accesses refused and %d accepted after %d partition rounds; want at least %d refused and none accepted",
				rp.StaleRejected, rp.StaleAccepted, n, n)
		}
		return
	}
	t.Logf("expected: after each of %d rounds the unfenced resource accepts the partitioned holder's late write, which overwrites another client's update; "+
		"found %d late writes, %d lost updates", n, rp.LateWrites, rp.LostUpdates)
	if rp.LostUpdates < n || rp.LateWrites < n {
		t.Errorf("unfenced: %d late writes and %d lost updates after %d partition rounds; want at least %d of each",
			rp.LateWrites, rp.LostUpdates, n, n)
	}
}

// TestFair runs the fenced stock workload with Fair Mutexes on every
// backend that has fair locks (all but Redlock), with and without
// cancellations. On Redis the release hands the lock to the queue's head
// itself (the direct handoff), and heads that give up as they are handed
// the lock must give it back: no two holders, no stale write accepted, no
// lost update, nothing left on the store.
func TestFair(t *testing.T) {
	for _, kind := range allKinds {
		if kind == kindRedlock {
			continue // no fair locks: Fair is refused (locktest KindsInvalid)
		}
		t.Run(kind, func(t *testing.T) {
			s := startStore(t, kind, storeOptions{})
			fair := []dlock.Option{dlock.Fair()}
			runScenario(t, scenario{store: s, workload: chaos.Stock, fenced: true,
				names: prefixed("fair-", nil), duration: 1500 * time.Millisecond, lockOpts: fair})
			runScenario(t, scenario{store: s, workload: chaos.Stock, fenced: true,
				names: prefixed("fair-cancel-", cancelNames()), cancelRate: 0.2, cancelWithin: cancelWithin(kind),
				duration: 1500 * time.Millisecond, lockOpts: fair})
		})
	}
}
