package chaostest

// Store faults: the store itself fails while clients contend. A redis-server
// killed with SIGKILL and restarted, with and without persistence; Redlock
// losing a minority and then a majority of its nodes; the stores' clocks
// running faster than the clients' (Redlock's drift allowance); MariaDB and
// PostgreSQL sessions killed by an operator, and the servers restarted.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/locktest/chaos"
)

// faultLoop calls fault after first, and again every (jittered) every,
// until ctx ends; it returns how many times it called it. fault must leave
// the store healthy when it returns.
func faultLoop(ctx context.Context, r *runState, first, every time.Duration, fault func(i int)) int {
	if !r.sleep(ctx, first) {
		return 0
	}
	n := 0
	for {
		fault(n)
		n++
		if !r.sleep(ctx, every/2+rand.N(every)) {
			return n
		}
	}
}

// retryStore calls op until it returns nil or an error of the lock itself
// (not obtained, not held, lost): a connection that broke with a server a
// moment ago fails a call or two before the pool dials again.
func retryStore(t *testing.T, what string, op func() error) error {
	t.Helper()
	var err error
	for range 50 {
		err = op()
		if err == nil || errors.Is(err, dlock.ErrNotObtained) || errors.Is(err, dlock.ErrNotHeld) || errors.Is(err, dlock.ErrLost) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: the store still fails after 50 tries: %v", what, err)
	return err
}

// probeTTL is the TTL of the probe's leases: far longer than a restart.
const probeTTL = 30 * time.Second

// probe is what a lock held across a store restart came out as.
type probe struct {
	holderFence   uint64
	survived      bool   // a newcomer found the lock still held after the restart
	newcomerFence uint64 // the newcomer's fence (after the holder's Unlock when it survived)
}

// probeRestart holds a lock called "probe" (outside the run's names, on
// clients of its own, not recorded) across restart, then lets a newcomer
// try it: it tells whether the store kept the hold and its fence counter.
// Every probe lease is unlocked before it returns.
func probeRestart(t *testing.T, r *runState, restart func()) probe {
	t.Helper()
	ctx := t.Context()
	rec := chaos.NewRecorder() // the probe is not part of the history
	holder := r.store.clientOn(t, r.store.spec, rec, "probe-holder", nil, dlock.WithTTL(probeTTL))
	newcomer := r.store.clientOn(t, r.store.spec, rec, "probe-newcomer", nil, dlock.WithTTL(probeTTL))
	var hl *dlock.Lease
	_ = retryStore(t, "probe: lock", func() (err error) {
		hl, err = holder.Mutex("probe").Lock(ctx)
		return err
	})
	p := probe{holderFence: hl.Fence()}
	restart()
	var nl *dlock.Lease
	err := retryStore(t, "probe: newcomer's TryLock", func() (err error) {
		nl, err = newcomer.Mutex("probe").TryLock(ctx)
		return err
	})
	switch {
	case errors.Is(err, dlock.ErrNotObtained):
		p.survived = true
		if err := retryStore(t, "probe: holder's Refresh", func() error { return hl.Refresh(ctx) }); err != nil {
			t.Errorf("probe: the store kept the hold, but the holder's Refresh failed: %v", err)
		}
		if err := unlockProbe(t, r.store, hl); err != nil {
			t.Errorf("probe: the holder's Unlock after its Refresh: %v", err)
		}
		_ = retryStore(t, "probe: newcomer's Lock", func() (err error) {
			nl, err = newcomer.Mutex("probe").Lock(ctx)
			return err
		})
	case err != nil:
		t.Fatalf("probe: newcomer's TryLock: %v", err)
	default:
		_ = unlockProbe(t, r.store, hl) // not held any more: ErrNotHeld
	}
	p.newcomerFence = nl.Fence()
	if err := unlockProbe(t, r.store, nl); err != nil {
		t.Errorf("probe: newcomer's Unlock: %v", err)
	}
	return p
}

// unlockProbe unlocks a probe lease. When the release itself fails (on a
// connection the restart broke), it removes the hold with the store's
// ForceRelease instead, so that the store is left empty, and returns nil.
func unlockProbe(t *testing.T, s *store, l *dlock.Lease) error {
	t.Helper()
	err := l.Unlock(t.Context())
	if err == nil || errors.Is(err, dlock.ErrNotHeld) || errors.Is(err, dlock.ErrLost) {
		return err
	}
	t.Logf("probe: Unlock %q: %v; removing the hold with ForceRelease", l.Name(), err)
	b, closeFn, err := s.spec.open()
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	defer closeFn()
	in, ok := b.(driver.Inspector)
	if !ok {
		t.Fatalf("probe: the %s backend cannot force a release", s.name)
	}
	_ = retryStore(t, "probe: ForceRelease", func() error {
		_, _, err := in.ForceRelease(t.Context(), l.Name())
		return err
	})
	return nil
}

// TestRedisKill kills redis-server with SIGKILL and restarts it at once,
// again and again while clients contend. With appendonly yes and
// appendfsync always every acknowledged write is on disk: holds and fence
// counters survive and nothing may break. Without persistence the server
// restarts empty: holds and fence counters are gone, a newcomer can get a
// lock its holder still trusts and fences start again from 1. The fenced
// resource must still accept no fence below the highest it has seen: it
// refuses the new, lower fences (counted as stale rejected) until they
// climb back. When they reach a fence a holder from before the restart
// still carries, the resource, which must admit a fence equal to the
// highest (a holder's write after its own read), lets both through: a
// repeated fence can lose an update even behind a fenced resource, and the
// run reports it.
func TestRedisKill(t *testing.T) {
	for _, aof := range []bool{true, false} {
		mode := "noaof"
		if aof {
			mode = "aof"
		}
		t.Run(mode, func(t *testing.T) {
			s := startStore(t, kindRedis, storeOptions{AOF: aof})
			kills := 0
			var pr probe
			sc := scenario{
				store:    s,
				label:    "rediskill-" + mode,
				names:    runNames(0, 24),
				workload: chaos.Stock,
				fenced:   true,
				think:    200 * time.Millisecond,
				duration: 3 * time.Second,
				faults: func(ctx context.Context, r *runState) {
					kill := func() {
						r.rec.Note("kill -9 redis-server (%s)", mode)
						s.redis.Kill(t)
						s.redis.Start(t)
						r.rec.Note("redis-server restarted")
						kills++
					}
					first := true
					faultLoop(ctx, r, 400*time.Millisecond, 700*time.Millisecond, func(int) {
						if first {
							// The first kill also checks, on a
							// lock of its own, what the store kept.
							first = false
							pr = probeRestart(t, r, kill)
							return
						}
						kill()
					})
				},
				extra: func(t *testing.T, r *runState) {
					t.Logf("%d kills; probe: holder fence %d, hold survived %v, newcomer fence %d",
						kills, pr.holderFence, pr.survived, pr.newcomerFence)
					if kills == 0 {
						t.Error("the run ended before any kill")
					}
					rp := r.report
					if aof {
						if !pr.survived {
							t.Errorf("with appendfsync always, the restarted server forgot the probe's hold (newcomer got fence %d)", pr.newcomerFence)
						}
						if pr.newcomerFence <= pr.holderFence {
							t.Errorf("with appendfsync always, the fence went from %d to %d across the restart", pr.holderFence, pr.newcomerFence)
						}
						return
					}
					if pr.survived {
						t.Errorf("without persistence, the restarted server still had the probe's hold: was it restarted?")
					}
					// What the checker found, plainly. The resource
					// admits a fence equal to the highest it has seen
					// (a holder's write after its own read must pass),
					// so a fence given twice, once before a restart and
					// once after, lets two holders through: the checker
					// counts that as stale accepted or as a lost update.
					lower := lowerFencesAccepted(r.rec.Events())
					t.Logf("without persistence: %d overlaps of lease windows, %d fence regressions, %d duplicate fences; "+
						"the fenced resource refused %d stale accesses and accepted %d (%d of them with a fence below the highest it had seen, "+
						"the others with a fence given twice); %d lost updates; not linearizable: %v",
						len(rp.Overlaps), rp.FenceRegressions, rp.DuplicateFences, rp.StaleRejected, rp.StaleAccepted, lower,
						rp.LostUpdates, rp.NonLinearizable)
					if lower > 0 {
						t.Errorf("the fenced resource accepted %d accesses with a fence below the highest it had accepted", lower)
					}
					if rp.StaleRejected == 0 {
						t.Errorf("no stale access refused: the restarted counters' low fences should have been turned away")
					}
				},
			}
			if !aof {
				sc.expect = expect{
					why: "redis-server without persistence restarts empty after kill -9: it forgets every hold (a newcomer may get a lock " +
						"its holder still trusts, and a holder's write in flight when its next renewal finds the hold gone lands after " +
						"its lease ended) and every fence counter (fences start again from 1)",
					may:  overlap | late,
					must: fenceLoss,
				}
			}
			runScenario(t, sc)
		})
	}
}

// lowerFencesAccepted counts the resource accesses accepted with a fence
// below the highest accepted before for the same name: what a fenced
// resource must never do, whatever the store did to its fences.
func lowerFencesAccepted(events []chaos.Event) int {
	highest := make(map[string]uint64)
	n := 0
	for _, e := range events {
		if (e.Kind != chaos.KindRead && e.Kind != chaos.KindWrite) || e.Outcome != chaos.OK {
			continue
		}
		if e.Fence < highest[e.Name] {
			n++
		}
		highest[e.Name] = max(highest[e.Name], e.Fence)
	}
	return n
}

// outage is a time when a fault was in force, on the chaos clock.
type outage struct {
	what       string
	start, end int64
	recovered  bool // the run went on for a while after it
}

// offset is t as a time since the start of a history, as the history and
// the report show times.
func offset(events []chaos.Event, t int64) time.Duration {
	if len(events) == 0 {
		return 0
	}
	return time.Duration(t - events[0].Start).Round(time.Microsecond)
}

// outageSums adds up what the outages of each kind saw, for one line of
// log per kind.
type outageSums struct {
	order []string // kinds (outage.what) in the order first seen
	by    map[string]*outageSum
}

type outageSum struct {
	n                        int
	down                     time.Duration
	calls, granted           int // store acquires during the outages
	held, lost               int // leases held when they began, and lost
	afterCalls, afterGranted int // store acquires in the recovery after
}

// of returns the sums of o's kind with o counted.
func (s *outageSums) of(o outage) *outageSum {
	if s.by == nil {
		s.by = make(map[string]*outageSum)
	}
	sm := s.by[o.what]
	if sm == nil {
		sm = &outageSum{}
		s.by[o.what] = sm
		s.order = append(s.order, o.what)
	}
	sm.n++
	sm.down += time.Duration(o.end - o.start)
	return sm
}

// storeAcquires counts the store acquires of a history that began and
// ended within o, and those of them that were granted.
func storeAcquires(events []chaos.Event, o outage) (calls, granted int) {
	for _, e := range events {
		if e.Kind == chaos.KindStoreAcquire && e.Start >= o.start && e.End < o.end {
			calls++
			if e.Outcome == chaos.OK {
				granted++
			}
		}
	}
	return calls, granted
}

// TestRedlockNodeLoss takes nodes of a three-node Redlock away while clients
// contend. A minority (one node partitioned, killed with SIGKILL and
// restarted, taken off the network) costs nothing: two nodes still make a
// quorum, and grants go on. A majority (two nodes down, then two nodes
// partitioned) stops every grant; holders are told of their loss before
// their lease's deadline, and locking resumes when the nodes are back.
func TestRedlockNodeLoss(t *testing.T) {
	t.Run("minority", func(t *testing.T) {
		// appendfsync always: a node killed and restarted at once keeps
		// its holds and fence counters (without persistence it must stay
		// down for a TTL, and fences may still go back; see
		// internal/test/redlockfaults).
		s := startStore(t, kindRedlock, storeOptions{AOF: true})
		var outages []outage
		sc := scenario{
			store:    s,
			label:    "redlock-minority",
			workload: chaos.Set,
			duration: 4 * time.Second,
			faults: func(ctx context.Context, r *runState) {
				ttl := r.sc.ttl
				faultLoop(ctx, r, 300*time.Millisecond, 300*time.Millisecond, func(i int) {
					switch i % 3 {
					case 0:
						r.rec.Note("partition node 0")
						s.proxies[0].Partition(t)
						o := outage{what: "node 0 partitioned", start: chaos.Now()}
						r.sleep(ctx, 2*ttl)
						o.end = chaos.Now()
						s.proxies[0].Heal(t)
						r.rec.Note("heal node 0")
						outages = append(outages, o)
					case 1:
						r.rec.Note("kill -9 node 1")
						s.nodes[1].Kill(t)
						o := outage{what: "node 1 killed", start: chaos.Now()}
						r.sleep(ctx, ttl)
						o.end = chaos.Now()
						s.nodes[1].Start(t)
						r.rec.Note("node 1 restarted")
						outages = append(outages, o)
					case 2:
						r.rec.Note("node 2 off the network")
						s.proxies[2].Down(t)
						o := outage{what: "node 2 down", start: chaos.Now()}
						r.sleep(ctx, ttl)
						o.end = chaos.Now()
						s.proxies[2].Up(t)
						r.rec.Note("node 2 back")
						outages = append(outages, o)
					}
				})
			},
			extra: func(t *testing.T, r *runState) {
				if len(outages) == 0 {
					t.Error("the run ended before any fault")
				}
				events := r.rec.Events()
				var sums outageSums
				for _, o := range outages {
					calls, granted := storeAcquires(events, o)
					sm := sums.of(o)
					sm.calls += calls
					sm.granted += granted
					// A loaded machine may leave a short outage without a
					// whole acquire in it; a long one must see grants.
					if time.Duration(o.end-o.start) >= r.sc.ttl && calls > 0 && granted == 0 {
						t.Errorf("%s at %v: no acquire granted with two nodes of three up", o.what, offset(events, o.start))
					}
				}
				for _, what := range sums.order {
					sm := sums.by[what]
					t.Logf("%s: %d outages, %v in all: %d of %d store acquires granted meanwhile", what, sm.n, sm.down.Round(time.Millisecond), sm.granted, sm.calls)
				}
			},
		}
		runScenario(t, sc)
	})

	t.Run("majority", func(t *testing.T) {
		s := startStore(t, kindRedlock, storeOptions{})
		// After a node was down, its go-redis pools dial it again only
		// once a second: recovery takes up to that long.
		const recovery = 1500 * time.Millisecond
		var outages []outage
		// A stall that has just begun holds its lease past the outage's
		// start; each outage waits (a while) for one, so that a lease is
		// held through it and its loss is checked.
		stalled := make(chan struct{}, 1)
		sc := scenario{
			store:    s,
			label:    "redlock-majority",
			names:    runNames(0, 24),
			workload: chaos.Stock,
			fenced:   true,
			duration: 5 * time.Second,
			setup: func(r *runState) {
				// Some critical sections last longer than the TTL
				// (renewed), so that leases are held when the majority
				// goes and must be reported lost.
				for _, w := range r.workers {
					w.BeforeWrite = stallSometimesSaying(2*r.sc.ttl, 6, stalled)
				}
			},
			faults: func(ctx context.Context, r *runState) {
				ttl := r.sc.ttl
				if !r.sleep(ctx, 400*time.Millisecond) {
					return
				}
				// Two outages in a short run (down, then partitioned),
				// as many as fit in a soak.
				for i := 0; r.soak || i < 2; i++ {
					select {
					case <-stalled: // drop a stall that began before
					default:
					}
					select {
					case <-stalled:
					case <-time.After(time.Second):
					case <-ctx.Done():
						return
					}
					var o outage
					if i%2 == 0 {
						r.rec.Note("nodes 1 and 2 off the network")
						s.proxies[1].Down(t)
						s.proxies[2].Down(t)
						o = outage{what: "nodes 1 and 2 down", start: chaos.Now()}
					} else {
						r.rec.Note("partition nodes 1 and 2")
						s.proxies[1].Partition(t)
						s.proxies[2].Partition(t)
						o = outage{what: "nodes 1 and 2 partitioned", start: chaos.Now()}
					}
					// Longer than a TTL, so that every lease held when it
					// began runs out. Not cut short by the end of the run:
					// the outage must be whole to be checked.
					time.Sleep(ttl + 200*time.Millisecond)
					o.end = chaos.Now()
					for _, px := range s.proxies[1:] {
						px.Up(t)
						px.Heal(t)
					}
					r.rec.Note("nodes 1 and 2 back")
					o.recovered = r.sleep(ctx, recovery)
					outages = append(outages, o)
					if !o.recovered {
						return
					}
				}
			},
			extra: func(t *testing.T, r *runState) {
				if len(outages) == 0 {
					t.Fatal("the run ended before any fault")
				}
				events := r.rec.Events()
				ttl := r.sc.ttl
				var sums outageSums
				for _, o := range outages {
					calls, granted := storeAcquires(events, o)
					held, lost := checkHeldAcross(t, events, o, ttl)
					after, afterGranted := storeAcquires(events, outage{start: o.end, end: o.end + int64(recovery)})
					sm := sums.of(o)
					sm.calls += calls
					sm.granted += granted
					sm.held += held
					sm.lost += lost
					sm.afterCalls += after
					sm.afterGranted += afterGranted
					if granted > 0 {
						t.Errorf("%s at %v: %d store acquires granted with one node of three", o.what, offset(events, o.start), granted)
					}
					if calls == 0 {
						t.Errorf("%s at %v: no acquire tried while the majority was lost", o.what, offset(events, o.start))
					}
					if o.recovered && afterGranted == 0 {
						t.Errorf("%s at %v: no grant in the %v after the nodes came back", o.what, offset(events, o.start), recovery)
					}
				}
				heldAll, lostAll := 0, 0
				for _, what := range sums.order {
					sm := sums.by[what]
					heldAll += sm.held
					lostAll += sm.lost
					t.Logf("%s: %d outages, %v in all: %d store acquires, %d granted; %d leases held when it began, %d reported lost (the others unlocked); "+
						"%d of %d store acquires granted in the %v after",
						what, sm.n, sm.down.Round(time.Millisecond), sm.calls, sm.granted, sm.held, sm.lost, sm.afterGranted, sm.afterCalls, recovery)
				}
				if lostAll == 0 {
					t.Errorf("no lease was held through an outage (%d held when one began, all unlocked in time): the losses went untested", heldAll)
				}
			},
		}
		runScenario(t, sc)
	})
}

// checkHeldAcross checks the leases held when outage o began (a majority
// lost): none may have been trusted past o.start + ttl, since no renewal
// sent after o.start can succeed; each must have ended by its loss (or
// Unlock) before its deadline. It returns how many leases were held when
// it began and how many of them were lost.
func checkHeldAcross(t *testing.T, events []chaos.Event, o outage, ttl time.Duration) (held, lost int) {
	t.Helper()
	type lease struct {
		acq       chaos.Event
		end       int64 // window end: loss, unlock start, or deadline
		lost      bool
		deadline  int64
		hasFinish bool
	}
	leases := make(map[string]*lease)
	for _, e := range events {
		switch e.Kind {
		case chaos.KindAcquire:
			if e.Outcome == chaos.OK && e.End < o.start {
				leases[e.Lease] = &lease{acq: e, deadline: e.Deadline, end: e.Deadline}
			}
		case chaos.KindLoss:
			if l := leases[e.Lease]; l != nil {
				l.lost, l.deadline = true, max(l.deadline, e.Deadline)
				l.end = min(e.End, l.deadline)
				l.hasFinish = true
			}
		case chaos.KindRelease:
			if l := leases[e.Lease]; l != nil {
				l.deadline = max(l.deadline, e.Deadline)
				if !l.lost {
					l.end = min(e.Start, l.deadline)
				}
				l.hasFinish = true
			}
		}
	}
	for id, l := range leases {
		if l.end <= o.start || !l.hasFinish {
			continue // over before the outage (or never finished: the run's end)
		}
		held++
		if l.lost {
			lost++
		}
		if limit := o.start + int64(ttl); l.end > limit {
			t.Errorf("%s: lease %s (fence %d) was trusted until %v after the majority was lost, more than the TTL (%v)",
				o.what, id, l.acq.Fence, time.Duration(l.end-o.start).Round(time.Millisecond), ttl)
		}
	}
	return held, lost
}

// runNames returns the names of a run: inShort of them in a short run
// (none: the harness's default) and inSoak in a soak, where critical
// sections that stall or outages that stop every grant would otherwise take
// too long to reach its count.
func runNames(inShort, inSoak int) []string {
	n := inShort
	if *soak {
		n = inSoak
	}
	if n == 0 {
		return nil
	}
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("n%02d", i)
	}
	return names
}

// TestRedlockClockSkew makes every client's Redlock nodes expire leases
// faster than the client's clock says they should (chaos.WithStoreClockRate),
// with automatic renewal off, so that leases run to their end and the drift
// arithmetic alone decides when a holder stops trusting its lease: a grant
// of TTL t is trusted for t − (t×1% + 2ms), and the holder is told of its
// loss a safety margin (t/10) before that.
//
// Inside the allowance and the margin (the store's clock 5% fast), the store
// never frees a lock its holder still trusts. Well beyond it (50% fast), it
// frees it at 2/3 of the TTL while the holder trusts it to 9/10: the check
// must find the overlaps, and the fenced resource must still accept no stale
// access.
//
// A quarter of the critical sections stall before their write for half a
// TTL to 1.2 TTL, past the store's expiry; the others are short. The TTL is
// 1s so that the node timeout (TTL/10 of the TTL the nodes are sent) stays
// at its 50ms.
func TestRedlockClockSkew(t *testing.T) {
	const ttl = time.Second
	for _, tc := range []struct {
		name   string
		rate   float64
		fenced bool
		expect expect
	}{
		{name: "inside", rate: 1.05},
		{name: "beyond", rate: 1.5, fenced: true, expect: expect{
			why: "the nodes' clocks run 50% fast, far beyond the drift allowance (1%+2ms) and the safety margin (TTL/10): " +
				"a lease expires on the nodes at 2/3 of its TTL while its holder trusts it until 9/10",
			must: overlap,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startStore(t, kindRedlock, storeOptions{})
			sc := scenario{
				store:    s,
				label:    "redlock-skew-" + tc.name,
				names:    runNames(4, 24),
				workload: chaos.Stock,
				fenced:   tc.fenced,
				ttl:      ttl,
				think:    20 * time.Millisecond,
				// At least 4s and skewMinGrants critical sections (a
				// loaded machine refuses many Redlock acquires, whose
				// node calls then miss their 50ms), at most 20s.
				duration: 20 * time.Second,
				faults: func(ctx context.Context, r *runState) {
					endAfterGrants(ctx, r, 4*time.Second, skewMinGrants)
				},
				observe:  []chaos.ObserveOption{chaos.WithStoreClockRate(tc.rate)},
				lockOpts: []dlock.Option{dlock.WithAutoRenew(false)},
				expect:   tc.expect,
				setup: func(r *runState) {
					r.rec.Note("every client's nodes expire leases %.2f× as fast as the client's clock; no automatic renewal", tc.rate)
					for _, w := range r.workers {
						w.BeforeWrite = stallSometimes(ttl, 4)
					}
				},
				extra: func(t *testing.T, r *runState) {
					rp := r.report
					t.Logf("store clock %.2f× the client's: %d leases ran out before their write (losses), %d overlaps, %d stale refused, %d stale accepted",
						tc.rate, rp.Losses, len(rp.Overlaps), rp.StaleRejected, rp.StaleAccepted)
					if rp.Losses == 0 {
						t.Error("no lease ran out: the run did not put the drift allowance to the test")
					}
				},
			}
			runScenario(t, sc)
		})
	}
}

// skewMinGrants is how many critical sections TestRedlockClockSkew's runs
// make at least: with one in four stalled past the nodes' skewed expiry,
// enough to see leases run out.
const skewMinGrants = 40

// endAfterGrants ends r's run once it has run for least and made grants
// critical sections (acquires that succeeded), or when ctx ends.
func endAfterGrants(ctx context.Context, r *runState, least time.Duration, grants int) {
	start := time.Now()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if time.Since(start) < least {
			continue
		}
		n := 0
		for _, e := range r.rec.Events() {
			if e.Kind == chaos.KindAcquire && e.Outcome == chaos.OK {
				n++
			}
		}
		if n >= grants {
			r.end()
			return
		}
	}
}

// stallSometimesSaying is stallSometimes, telling started (without
// blocking; nil: nobody) when a stall begins.
func stallSometimesSaying(d time.Duration, oneIn int, started chan<- struct{}) func(ctx context.Context, l *dlock.Lease) {
	return func(ctx context.Context, l *dlock.Lease) {
		if rand.N(oneIn) != 0 {
			return
		}
		select {
		case started <- struct{}{}:
		default:
		}
		timer := time.NewTimer(d/2 + rand.N(d*7/10))
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-ctx.Done():
		}
	}
}

// stallSometimes returns a BeforeWrite hook that, one time in oneIn, holds
// the critical section for between half of d and 1.2 d (less when the run
// ends first).
func stallSometimes(d time.Duration, oneIn int) func(ctx context.Context, l *dlock.Lease) {
	return stallSometimesSaying(d, oneIn, nil)
}

// sqlKinds are the SQL servers whose sessions and processes the SQL
// scenarios kill.
var sqlKinds = []string{kindMariaDB, kindPostgres}

// killSessions ends every session on the store's database, as an operator
// would, and returns how many it ended.
func (s *store) killSessions(t *testing.T) int {
	t.Helper()
	switch {
	case s.maria != nil:
		return s.maria.KillSessions(t, s.database)
	case s.pg != nil:
		return s.pg.KillSessions(t, s.database)
	}
	t.Fatalf("%s store: no SQL server", s.name)
	return 0
}

// TestSQLConnKill ends every session of the clients' database again and
// again while they contend (MariaDB's KILL CONNECTION, PostgreSQL's
// pg_terminate_backend): statements fail mid-flight, transactions roll
// back, pools and PostgreSQL's notification listener reconnect. The rows
// persist, so nothing may break; leases whose renewals keep failing must be
// reported lost before their deadline.
func TestSQLConnKill(t *testing.T) {
	for _, kind := range sqlKinds {
		t.Run(kind, func(t *testing.T) {
			s := startStore(t, kind, storeOptions{})
			rounds, killed := 0, 0
			sc := scenario{
				store:    s,
				label:    "sqlconnkill",
				names:    runNames(0, 16),
				workload: chaos.Stock,
				duration: 3 * time.Second,
				setup: func(r *runState) {
					// Some sections outlast the TTL: renewals go
					// through the kills too.
					for _, w := range r.workers {
						w.BeforeWrite = stallSometimes(r.sc.ttl, 8)
					}
				},
				faults: func(ctx context.Context, r *runState) {
					rounds = faultLoop(ctx, r, 300*time.Millisecond, 250*time.Millisecond, func(int) {
						n := s.killSessions(t)
						r.rec.Note("killed %d sessions of database %s", n, s.database)
						killed += n
					})
				},
				extra: func(t *testing.T, r *runState) {
					t.Logf("%d rounds of kills ended %d sessions; %d leases lost, %d acquires and %d unlocks without an answer",
						rounds, killed, r.report.Losses, r.report.AcquireUnknown, r.report.ReleaseUnknown)
					if killed == 0 {
						t.Error("no session was killed")
					}
				},
			}
			runScenario(t, sc)
		})
	}
}

// sqlServer is the process control of a SQL store.
func (s *store) sqlServer(t *testing.T) (stop, kill, start func(testing.TB)) {
	t.Helper()
	if s.shared {
		t.Fatalf("%s store: its server is shared by the package's tests; start the store with storeOptions.OwnServer to stop or kill it", s.name)
	}
	switch {
	case s.maria != nil:
		return s.maria.Stop, s.maria.Kill, s.maria.Start
	case s.pg != nil:
		return s.pg.Stop, s.pg.Kill, s.pg.Start
	}
	t.Fatalf("%s store: no SQL server", s.name)
	return nil, nil, nil
}

// TestSQLRestart stops the server cleanly and starts it again, then kills
// it with SIGKILL and starts it again, in turns, while clients contend. The
// lock rows are committed, so they survive both; while the server is down
// every call fails, holders are told of their loss before their deadline,
// and afterwards locking resumes with fences that keep rising. Nothing may
// break.
func TestSQLRestart(t *testing.T) {
	for _, kind := range sqlKinds {
		t.Run(kind, func(t *testing.T) {
			s := startStore(t, kind, storeOptions{OwnServer: true})
			stop, kill, start := s.sqlServer(t)
			var (
				restarts [2]int           // clean stops, kills
				down     [2]time.Duration // their time down in all
			)
			sc := scenario{
				store:    s,
				label:    "sqlrestart",
				names:    runNames(0, 16),
				workload: chaos.Stock,
				fenced:   true,
				duration: 4 * time.Second,
				setup: func(r *runState) {
					for _, w := range r.workers {
						w.BeforeWrite = stallSometimes(r.sc.ttl, 8)
					}
				},
				faults: func(ctx context.Context, r *runState) {
					faultLoop(ctx, r, 400*time.Millisecond, 800*time.Millisecond, func(i int) {
						how, halt := "stop", stop
						if i%2 == 1 {
							how, halt = "kill -9", kill
						}
						r.rec.Note("%s %s", how, kind)
						began := time.Now()
						halt(t)
						// Down for a TTL: the leases held run out, and
						// their holders must be told in time.
						time.Sleep(r.sc.ttl)
						start(t)
						r.rec.Note("%s started again", kind)
						restarts[i%2]++
						down[i%2] += time.Since(began)
					})
				},
				extra: func(t *testing.T, r *runState) {
					t.Logf("%d clean stops (down %v in all) and %d kills (down %v in all), each followed by a start; "+
						"%d leases lost, %d acquires and %d unlocks without an answer",
						restarts[0], down[0].Round(time.Millisecond), restarts[1], down[1].Round(time.Millisecond),
						r.report.Losses, r.report.AcquireUnknown, r.report.ReleaseUnknown)
					if restarts[0] == 0 || restarts[1] == 0 {
						t.Error("the run ended before both a clean stop and a kill")
					}
				},
			}
			runScenario(t, sc)
		})
	}
}
