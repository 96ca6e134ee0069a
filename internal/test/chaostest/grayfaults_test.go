package chaostest

// Gray faults: the store is up and answers, but not the way a healthy one
// does. Requests that land late, a server that stops serving for a moment
// (CLIENT PAUSE), a pub/sub connection that goes half-open, a thousand
// waiters on one name. Each must neither strand a lock (leave it free while
// a waiter waits, longer than the bound docs/SAFETY.md states for the
// fault) nor end a wait early, besides breaking nothing.

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/locktest/chaos"
)

// lateStep is one setting of TestLateRequest's request latency: every
// request reaches the store d ± jitter late.
type lateStep struct{ d, jitter time.Duration }

// lateSteps are the request latencies of TestLateRequest, by kind, each in
// force for lateStepFor in turn. They straddle the Locks' wait (lateWait):
// a request still on its way when its caller gives up is cleaned up, and
// the jitter lets the clean-up, sent later on another connection, overtake
// it. A SQL acquire is a few round trips, so its steps are smaller.
var lateSteps = map[string][]lateStep{
	kindRedis:    {{40 * time.Millisecond, 40 * time.Millisecond}, {120 * time.Millisecond, 100 * time.Millisecond}, {200 * time.Millisecond, 100 * time.Millisecond}},
	kindMariaDB:  {{10 * time.Millisecond, 10 * time.Millisecond}, {40 * time.Millisecond, 40 * time.Millisecond}, {80 * time.Millisecond, 70 * time.Millisecond}},
	kindPostgres: {{10 * time.Millisecond, 10 * time.Millisecond}, {40 * time.Millisecond, 40 * time.Millisecond}, {80 * time.Millisecond, 70 * time.Millisecond}},
	// Redlock: node 0's requests, past the node timeout (lateNodeTimeout)
	// half the time; node 1 gets a fifth of it, node 2 none, so that grants
	// go on.
	kindRedlock: {{90 * time.Millisecond, 90 * time.Millisecond}, {180 * time.Millisecond, 150 * time.Millisecond}, {300 * time.Millisecond, 270 * time.Millisecond}},
}

// lateNodeTimeout is Redlock's node timeout in TestLateRequest. With the
// default 50ms, a client process under -race on a loaded machine missed it
// on nodes without any latency as often as on the late one (SAFETY.md: a
// loaded client needs a larger WithNodeTimeout), and the lock sat free while
// its waiters' attempts failed for that, not for the late requests; the
// steps above are set around it.
const lateNodeTimeout = 150 * time.Millisecond

const (
	lateStepFor = 500 * time.Millisecond
	// lateWait is every Lock's wait in TestLateRequest: short, so that
	// calls are cut short while their requests are on their way.
	lateWait = 300 * time.Millisecond
	// lateTTL is long next to lateIdleBound, so that a late request that
	// granted a lock to nobody (or queued nobody at a fair queue's head,
	// for QueueTTL, min(TTL, 5s)) shows as a lock free for a whole TTL
	// after the release it came after.
	lateTTL = 5 * time.Second
	// lateIdleBound: with the late requests harmless, a release is
	// followed by the next grant within a waiter's round trip (at most
	// 300ms of delay) and a retry, but a request delayed about as long as
	// its wait is given back, and a few in a row can be (a 10,000-grant
	// soak on Redis, with requests up to 400ms late, saw 2.0s once; a
	// short PostgreSQL run of fair waiters that came and went, 2.5s). A
	// grant or queue entry for nobody keeps the lock from every waiter for
	// lateTTL: a bound below it tells the two apart.
	lateIdleBound = 4 * time.Second
	// lateRun is the length of a short run: past lateIdleBound and a
	// second, so that a name stranded early in the run shows.
	lateRun = lateIdleBound + 1500*time.Millisecond
)

// TestLateRequest delays the requests (not the answers) of every client on
// their way to the store by a jittered latency, while Locks wait at most
// lateWait and a fifth of the calls have their context cancelled: acquires
// whose outcome is unknown are cleaned up on another connection, and the
// clean-up can land before the request it cleans up. The late request must
// grant nothing and queue nothing: no overlap, no stale write accepted, no
// wait ended early, and no lock free for longer than lateIdleBound after a
// release while a waiter waits (a late grant to nobody would keep it for
// lateTTL). Plain Mutexes, then Fair ones (not on Redlock).
//
// On the SQL stores the watcher reads the holders and queue heads from the
// server (checkNobody): no token whose clean-up was answered may hold or
// head a queue. For their Fair half that check stands in for the idle
// bound: a fair SQL request is a transaction of several statements, each
// one late, so on a loaded machine a fair waiter may give up before its
// second request is answered, and when every waiter joins behind another
// that will give up too, the lock sits free for as long as that lasts.
// Their entries are live waiters', not nobody's; the store tells them
// apart, the history cannot.
func TestLateRequest(t *testing.T) {
	kinds := []string{kindRedis, kindRedlock, kindMariaDB, kindPostgres}
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			s := startStore(t, kind, storeOptions{Proxy: true})
			if kind == kindRedlock {
				s.spec.NodeTimeout = lateNodeTimeout
			}
			steps := lateSteps[kind]
			faults := func(ctx context.Context, r *runState) {
				set := func(st lateStep) {
					if kind != kindRedlock {
						s.proxy.RequestLatency(t, st.d, st.jitter)
						return
					}
					s.proxies[0].RequestLatency(t, st.d, st.jitter)
					s.proxies[1].RequestLatency(t, st.d/5, st.jitter/5)
				}
				defer func() {
					set(lateStep{})
					r.rec.Note("request latency removed")
				}()
				for i := 0; ; i++ {
					st := steps[i%len(steps)]
					set(st)
					r.rec.Note("requests reach the store %v ± %v late", st.d, st.jitter)
					if !r.sleep(ctx, lateStepFor) {
						return
					}
				}
			}
			modes := []string{"plain", "fair"}
			if kind == kindRedlock {
				modes = modes[:1] // no fair locks
			}
			for _, mode := range modes {
				sc := scenario{
					store: s, label: "laterequest-" + mode, workload: chaos.Stock, fenced: true,
					names: prefixed(mode+"-", runNames(4, 8)), ttl: lateTTL, wait: lateWait,
					cancelRate: 0.2, cancelWithin: 150 * time.Millisecond,
					duration: lateRun, faults: faults,
					waitsHold: true, idleBound: lateIdleBound, extra: checkUnknownAcquires,
					watchHeads: s.heads != nil,
				}
				if mode == "fair" {
					sc.lockOpts = []dlock.Option{dlock.Fair()}
					if s.heads != nil {
						sc.idleBound = 0 // see above: checkNobody checks the store
					}
				}
				runScenario(t, sc)
			}
		})
	}
}

// checkUnknownAcquires fails the test unless some store acquire of the run
// had an unknown outcome (its call cut short or failed while the request
// may have been on its way): those are the requests that may land after
// their clean-up.
func checkUnknownAcquires(t *testing.T, r *runState) {
	t.Helper()
	n, all := 0, 0
	for _, e := range r.rec.Events() {
		if e.Kind == chaos.KindStoreAcquire {
			all++
			if e.Outcome == chaos.Unknown {
				n++
			}
		}
	}
	t.Logf("%d of %d store acquires had an unknown outcome and were cleaned up", n, all)
	if n == 0 {
		t.Error("no store acquire had an unknown outcome: no clean-up raced a late request, the run proves nothing")
	}
}

const (
	// pauseTTL is TestClientPause's TTL: a pause takes a good part of it.
	pauseTTL = time.Second
	// pauseIdleBound: a lock freed just before a pause is granted once
	// the pause ends (at most 500ms) and a waiter's request is served;
	// room for a loaded machine.
	pauseIdleBound = 2 * time.Second
)

// TestClientPause pauses the Redis server (CLIENT PAUSE, WRITE and ALL in
// turns) for 200–500ms, again and again, while clients contend; on Redlock
// one node at a time, and every third pause all three. Calls wait for the
// pause to end, renewals run late and leases may be lost, in time; no wait
// may end early and no lock may sit free after a release for longer than
// pauseIdleBound while a waiter waits.
func TestClientPause(t *testing.T) {
	for _, kind := range []string{kindRedis, kindRedlock} {
		t.Run(kind, func(t *testing.T) {
			s := startStore(t, kind, storeOptions{})
			var admins []*redis.Client
			if kind == kindRedis {
				admins = append(admins, s.redis.Client(t))
			}
			for _, n := range s.nodes {
				admins = append(admins, n.Client(t))
			}
			pauses := 0
			runScenario(t, scenario{
				store: s, workload: chaos.Stock, fenced: true, ttl: pauseTTL, duration: 3 * time.Second,
				waitsHold: true, idleBound: pauseIdleBound,
				faults: func(ctx context.Context, r *runState) {
					faultLoop(ctx, r, 200*time.Millisecond, 500*time.Millisecond, func(i int) {
						mode := "WRITE"
						if i%2 == 1 {
							mode = "ALL"
						}
						d := 200*time.Millisecond + rand.N(300*time.Millisecond)
						targets, which := admins, "the server"
						if kind == kindRedlock && i%3 != 2 {
							targets, which = admins[i%3:i%3+1], fmt.Sprintf("node %d", i%3)
						} else if kind == kindRedlock {
							which = "every node"
						}
						for _, a := range targets {
							// Not ctx: the pause must be set (and end) whole.
							if err := a.Do(context.Background(), "CLIENT", "PAUSE", d.Milliseconds(), mode).Err(); err != nil {
								t.Errorf("CLIENT PAUSE %d %s: %v", d.Milliseconds(), mode, err)
								return
							}
						}
						r.rec.Note("CLIENT PAUSE %v %s on %s", d, mode, which)
						pauses++
						time.Sleep(d) // the store is healthy again when the fault returns
					})
				},
				extra: func(t *testing.T, r *runState) {
					t.Logf("%d pauses", pauses)
					if pauses == 0 {
						t.Error("the run ended before any pause")
					}
				},
			})
		})
	}
}

// halfOpenIdleBound is the longest a lock may sit free after a release
// while one client's pub/sub connection is half-open: the listener's health
// check finds the connection dead 3s after it last delivered anything and
// replaces it (docs/REDIS.md), and the waiter's own poll may find the lock
// sooner; room for a reconnect on a loaded machine.
const halfOpenIdleBound = 4 * time.Second

// halfOpenFor is how long, in each round of TestHalfOpenPubSub, every
// pub/sub connection of the client goes half-open as soon as it subscribes:
// its subscriptions are never confirmed.
const halfOpenFor = 2500 * time.Millisecond

// TestHalfOpenPubSub makes one client's pub/sub connection half-open
// (writes vanish, nothing comes back; its command connections are fine) on
// Redis, with Fair Mutexes, in two runs. In the first, the connection the
// client has goes half-open, again and again, and so do those it subscribes
// on for a while after: the releases announced on it never reach it, and a
// waiter of that client may be handed the lock without hearing of it. In
// the second (runHalfOpenFresh), every subscription it makes is never
// confirmed. The lock must not sit free after a release, while a waiter
// waits, for longer than the run's bound, no wait may end early, and
// nothing may break.
func TestHalfOpenPubSub(t *testing.T) {
	t.Run(kindRedis, func(t *testing.T) {
		s := startStore(t, kindRedis, storeOptions{})
		h := &halfOpen{}
		spec := s.spec
		spec.dial = h.dial
		cut := 0
		runScenario(t, scenario{
			store: s, label: "halfopenpubsub", workload: chaos.Stock, fenced: true,
			names: prefixed("cut-", nil), specs: []storeSpec{spec}, duration: 3 * time.Second,
			lockOpts: []dlock.Option{dlock.Fair()}, waitsHold: true, idleBound: halfOpenIdleBound,
			faults: func(ctx context.Context, r *runState) {
				defer h.armed.Store(false)
				faultLoop(ctx, r, 300*time.Millisecond, time.Second, func(int) {
					// Every pub/sub connection c1 has, and every one it
					// subscribes on for the next halfOpenFor.
					h.armed.Store(true)
					n := h.cut()
					cut += n
					r.rec.Note("c1's pub/sub connections half-open: %d cut, and those it subscribes on for %v", n, halfOpenFor)
					r.sleep(ctx, halfOpenFor)
					h.armed.Store(false)
					r.rec.Note("c1's new pub/sub connections healthy again")
				})
			},
			extra: func(t *testing.T, r *runState) {
				n := h.cutAll()
				t.Logf("%d pub/sub connections of c1 made half-open (%d cut as the rounds began); c1 dialled %d connections in all", n, cut, h.dialled())
				if n == 0 {
					t.Error("no pub/sub connection of c1 was made half-open: the run proves nothing")
				}
			},
		})
		runHalfOpenFresh(t, s)
	})
}

const (
	// freshTTL is the TTL of the fresh-subscription run: a lock handed to
	// a waiter that never claims it stays held by nobody that long.
	freshTTL = 5 * time.Second
	// freshWait is the deaf client's wait: shorter than the 5s a
	// subscription may take, so that a wait that waited for its
	// subscription would never poll.
	freshWait = 4 * time.Second
	// freshQuiet is the deaf client's pause between its waits: longer
	// than the 2s a subscription lingers, so that each wait subscribes
	// afresh.
	freshQuiet = 2500 * time.Millisecond
	// freshIdleBound: a waiter whose subscription is not confirmed polls
	// (every 5ms at the head of the fair queue, at most 500ms otherwise),
	// so a lock handed to it is claimed at once; room for a loaded
	// machine.
	freshIdleBound = 2 * time.Second
)

// runHalfOpenFresh is TestHalfOpenPubSub's fresh-subscription run, with
// Fair Mutexes: every pub/sub connection of client c1 goes half-open as it
// subscribes, so none of its subscriptions is ever confirmed. c1 does not
// run as a worker: now and then, after a pause longer than a subscription
// lingers, it waits (freshWait) for one of the names the other clients
// contend for, and so subscribes afresh each time. It may be handed the
// lock while its subscription hangs: it must claim it, so that the name is
// never free, while somebody waits, for longer than freshIdleBound.
func runHalfOpenFresh(t *testing.T, s *store) {
	h := &halfOpen{}
	h.armed.Store(true)
	spec := s.spec
	spec.dial = h.dial
	var deaf *chaos.Worker
	rounds := 0
	names := prefixed("fresh-", nil)
	runScenario(t, scenario{
		store: s, label: "halfopenpubsub-fresh", workload: chaos.Stock, fenced: true,
		names: names, specs: []storeSpec{spec}, ttl: freshTTL, wait: freshWait, duration: 4500 * time.Millisecond,
		lockOpts: []dlock.Option{dlock.Fair()}, waitsHold: true, idleBound: freshIdleBound,
		setup: func(r *runState) {
			deaf, r.workers = r.workers[0], r.workers[1:]
			r.rec.Note("every subscription of c1 goes unconfirmed (its pub/sub connections go half-open as they subscribe)")
		},
		faults: func(ctx context.Context, r *runState) {
			for i := 0; r.sleep(ctx, 300*time.Millisecond); i++ {
				res, err := deaf.Step(ctx, chaos.Target{Name: names[i%len(names)]})
				rounds++
				r.rec.Note("c1's wait %d for %q: granted %t (%v)", i+1, names[i%len(names)], res.Acquired, err)
				if !r.sleep(ctx, freshQuiet) {
					return
				}
			}
		},
		extra: func(t *testing.T, r *runState) {
			t.Logf("c1 waited %d times, each on a fresh subscription; %d of its pub/sub connections went half-open", rounds, h.cutAll())
			if rounds == 0 || h.cutAll() == 0 {
				t.Error("c1 never waited on a half-open subscription: the run proves nothing")
			}
		},
	})
}

// halfOpen is a go-redis Dialer whose pub/sub connections can be made
// half-open: once cut, a connection that has written a subscribe command
// sends nothing and receives nothing, while its deadlines still run, as a
// TCP connection whose peer or middlebox vanished. Connections dialled
// later are healthy; command connections are never cut.
type halfOpen struct {
	mu    sync.Mutex
	conns []*halfOpenConn
	// armed: a connection is cut as it writes a subscribe command, which
	// is lost with it (a subscription never confirmed).
	armed atomic.Bool
}

func (h *halfOpen) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	hc := &halfOpenConn{Conn: c, h: h}
	h.mu.Lock()
	h.conns = append(h.conns, hc)
	h.mu.Unlock()
	return hc, nil
}

// cut makes every pub/sub connection dialled so far half-open and returns
// how many it cut that were not cut already.
func (h *halfOpen) cut() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, c := range h.conns {
		if c.pubsub.Load() && !c.cut.Swap(true) {
			n++
		}
	}
	return n
}

// cutAll returns how many connections are cut.
func (h *halfOpen) cutAll() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, c := range h.conns {
		if c.cut.Load() {
			n++
		}
	}
	return n
}

// dialled returns how many connections were dialled.
func (h *halfOpen) dialled() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.conns)
}

type halfOpenConn struct {
	net.Conn
	h      *halfOpen
	pubsub atomic.Bool // it has written a subscribe command
	cut    atomic.Bool
}

func (c *halfOpenConn) Write(b []byte) (int, error) {
	if c.cut.Load() {
		return len(b), nil // lost on the way
	}
	if bytes.Contains(bytes.ToLower(b), []byte("subscribe")) {
		c.pubsub.Store(true)
		if c.h.armed.Load() {
			c.cut.Store(true)
			return len(b), nil
		}
	}
	return c.Conn.Write(b)
}

func (c *halfOpenConn) Read(b []byte) (int, error) {
	for {
		n, err := c.Conn.Read(b)
		if err != nil || !c.cut.Load() {
			return n, err
		}
		// Lost on the way: read on until the deadline.
	}
}

const (
	// manyClients is the number of clients of TestManyWaiters; the
	// waiters are spread over them.
	manyClients = 10
	// manyShort and manySoak are TestManyWaiters' waiters on the name, in
	// a short run and in a soak.
	manyShort = 200
	manySoak  = 1000
	// manyIdleBound: with that many waiters, a release is followed by
	// the next grant within a wake-up and a round trip (a poll, at most
	// 500ms, on a store without notifications); each client has one
	// request for the name under way at a time, its first attempts
	// included; room for a loaded machine.
	manyIdleBound = 2500 * time.Millisecond
	// manyRun is the length of a short run: longer than manyIdleBound,
	// so that a name stranded early in the run shows.
	manyRun = 3500 * time.Millisecond
	// manyTTL is long next to a store call on a loaded machine: a grant
	// whose answer comes later than its TTL allows is given back, and on
	// SQLite, whose writers take turns on one file, calls under load took
	// up to 3 s, so with a short TTL every grant was given back and the
	// run granted nothing. The scenario is about waking the waiters, not
	// about expiry.
	manyTTL = 5 * time.Second
)

// TestManyWaiters makes manyShort waiters (manySoak in a soak), spread over
// manyClients clients, wait for one name; the clients with an even number
// wait with Fair Mutexes, the others with plain ones, as a service whose
// callers mix the two would. Every wait lasts until it is granted or the
// run ends: none may end early, the lock must never sit free for longer
// than manyIdleBound after a release while somebody waits, and nothing may
// break.
func TestManyWaiters(t *testing.T) {
	waiters := manyShort
	if *soak {
		waiters = manySoak
	}
	kinds := []string{kindMemlock, kindRedis, kindSQLite, kindMariaDB, kindPostgres, kindEtcd}
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			s := startStore(t, kind, storeOptions{})
			// One goroutine per client and target: waiters/manyClients
			// targets of the one name.
			targets := make([]chaos.Target, waiters/manyClients)
			for i := range targets {
				targets[i] = chaos.Target{Name: "many", Mode: chaos.Exclusive}
			}
			runScenario(t, scenario{
				store: s, label: "manywaiters", workload: chaos.Stock, fenced: true,
				clients: manyClients, targets: targets, think: 2 * time.Millisecond, duration: manyRun, ttl: manyTTL,
				clientOpts: func(i int) []dlock.Option {
					if i%2 == 1 { // c2, c4, ...
						return []dlock.Option{dlock.Fair()}
					}
					return nil
				},
				waitsHold: true, idleBound: manyIdleBound,
				extra: func(t *testing.T, r *runState) {
					t.Logf("%d waiters on %q over %d clients, half of them Fair: %d grants", waiters, "many", manyClients, r.report.Grants)
				},
			})
		})
	}
}

const (
	// leaderChangeClients is the load of TestLeaderChangeUnderLoad: each
	// client waits on every name.
	leaderChangeClients = 6
	// leaderChangeIdleBound: a new leader is up within about a second;
	// the waits' and releases' retries (pauses of up to 1s) reach it; room
	// for a loaded machine. docs/SAFETY.md: nothing held by nobody when a
	// new leader is up within the call timeout (3s).
	leaderChangeIdleBound = 4 * time.Second
	// frozenFor is how long TestFrozenFollower keeps a follower stopped.
	frozenFor = 2 * time.Second
	// frozenTTL is TestFrozenFollower's TTL: a renewal whose attempt hangs
	// on the frozen member (500ms) is tried again on another well before
	// the lease's safe deadline.
	frozenTTL = 3 * time.Second
	// frozenIdleBound: a release whose announcement went through the
	// frozen member is heard when it resumes (or its connection is closed
	// by the keep-alive); the waiters' own retries may find it sooner.
	frozenIdleBound = frozenFor + 2*time.Second
)

// TestLeaderChangeUnderLoad kills the etcd leader (SIGKILL) and restarts
// it, again and again, while six clients wait on every name with waits that
// last until the run ends: leader changes fail calls in flight with
// transient errors, which waits, releases and renewals must ride out. No
// wait may end early, no lock may sit free after a release for longer than
// leaderChangeIdleBound while a waiter waits, and nothing may break.
// Plain Mutexes, then Fair ones.
func TestLeaderChangeUnderLoad(t *testing.T) {
	t.Run(kindEtcd, func(t *testing.T) {
		s := startStore(t, kindEtcd, storeOptions{})
		for _, mode := range []string{"plain", "fair"} {
			kills := 0
			sc := scenario{
				store: s, label: "leaderchange-" + mode, workload: chaos.Stock, fenced: true,
				names: prefixed(mode+"-", nil), clients: leaderChangeClients, ttl: time.Second, duration: 4 * time.Second,
				waitsHold: true, idleBound: leaderChangeIdleBound,
				faults: func(ctx context.Context, r *runState) {
					faultLoop(ctx, r, 300*time.Millisecond, time.Second, func(int) {
						leader := s.etcd.Leader(t)
						r.rec.Note("kill -9 the leader, member %d", leader)
						s.etcd.Kill(t, leader)
						kills++
						time.Sleep(500 * time.Millisecond)
						s.etcd.Start(t, leader)
						r.rec.Note("member %d restarted", leader)
					})
				},
				extra: func(t *testing.T, r *runState) {
					t.Logf("%d leaders killed", kills)
					if kills == 0 {
						t.Error("the run ended before any leader was killed")
					}
				},
			}
			if mode == "fair" {
				sc.lockOpts = []dlock.Option{dlock.Fair()}
			}
			runScenario(t, sc)
		}
	})
}

// TestFrozenFollower stops one etcd follower (SIGSTOP) for frozenFor, then
// continues it, again and again, while clients contend: the clients spread
// their calls over the members, and those that land on the frozen one hang
// until their attempt's timeout. Held locks must not be lost for it (the
// leader and a majority are healthy), no wait may end early, no lock may
// sit free after a release for longer than frozenIdleBound while a waiter
// waits, and nothing may break. Plain Mutexes, then Fair ones.
func TestFrozenFollower(t *testing.T) {
	t.Run(kindEtcd, func(t *testing.T) {
		s := startStore(t, kindEtcd, storeOptions{})
		for _, mode := range []string{"plain", "fair"} {
			freezes := 0
			sc := scenario{
				store: s, label: "frozenfollower-" + mode, workload: chaos.Stock, fenced: true,
				names: prefixed(mode+"-", nil), ttl: frozenTTL, duration: 4 * time.Second,
				waitsHold: true, idleBound: frozenIdleBound,
				faults: func(ctx context.Context, r *runState) {
					faultLoop(ctx, r, 300*time.Millisecond, time.Second, func(i int) {
						follower := (s.etcd.Leader(t) + 1 + i%2) % s.etcd.Members()
						r.rec.Note("SIGSTOP follower %d", follower)
						s.etcd.Pause(t, follower)
						freezes++
						time.Sleep(frozenFor) // the store is whole again when the fault returns
						s.etcd.Resume(t, follower)
						r.rec.Note("SIGCONT member %d", follower)
					})
				},
				extra: func(t *testing.T, r *runState) {
					t.Logf("%d freezes of %v; %d leases lost", freezes, frozenFor, r.report.Losses)
					if freezes == 0 {
						t.Error("the run ended before any follower was frozen")
					}
					if r.report.Losses > 0 {
						t.Errorf("%d leases lost while the leader and a majority were healthy", r.report.Losses)
					}
				},
			}
			if mode == "fair" {
				sc.lockOpts = []dlock.Option{dlock.Fair()}
			}
			runScenario(t, sc)
		}
	})
}
