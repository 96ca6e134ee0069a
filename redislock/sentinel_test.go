package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/locktest"
	"github.com/dlock-go/dlock/redislock"
)

// ackTimeout is the WAIT timeout of the tests that use WithReplicaAck.
const ackTimeout = 100 * time.Millisecond

// TestSentinelConformance runs the locktest suite through go-redis failover
// clients on one SentinelSet, with and without WithReplicaAck. Each case
// gets a namespace of its own; Kill cuts the case's clients off the store
// (every connection closed, every dial refused, sentinels included), which
// is what a dead store looks like to them, without costing the next case a
// new set.
func TestSentinelConformance(t *testing.T) {
	set := testserver.StartSentinel(t)
	admin := set.Client(t)
	var cases atomic.Int32
	for _, mode := range []struct {
		name string
		opts []redislock.Option
	}{
		{"plain", nil},
		{"replica-ack", []redislock.Option{redislock.WithReplicaAck(1, ackTimeout)}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			locktest.Run(t, func(t *testing.T) *locktest.Store {
				ns := fmt.Sprintf("case%d", cases.Add(1))
				cut := &cutter{}
				lockKey := func(key string) string { return ns + ":{" + key + "}" }
				return &locktest.Store{
					NewBackend: func(t *testing.T) driver.Backend {
						opts := set.FailoverOptions()
						// One dial attempt: once cut, Close gives up at once
						// instead of backing off through go-redis's retries.
						opts.Dialer, opts.DialerRetries = cut.dial, 1
						rdb := redis.NewFailoverClient(opts)
						t.Cleanup(func() { _ = rdb.Close() })
						return redislock.New(rdb, append(slices.Clone(mode.opts), redislock.WithNamespace(ns))...)
					},
					Delete: func(t *testing.T, key string) {
						if n, err := admin.Del(t.Context(), lockKey(key)).Result(); err != nil || n != 1 {
							t.Fatalf("DEL lock %q = %d, %v", key, n, err)
						}
					},
					Leftovers: func(t *testing.T, key string) []string {
						keys, err := admin.Keys(t.Context(), lockKey(key)+"*").Result()
						if err != nil {
							t.Fatalf("KEYS: %v", err)
						}
						var left []string
						for _, k := range keys {
							if !strings.HasSuffix(k, ":fence") && !strings.HasSuffix(k, ":r") && !strings.HasSuffix(k, ":late") { // kept on purpose: the fence counter; recent releases (15s); the late-request record (5s)
								left = append(left, k)
							}
						}
						return left
					},
					Kill: func(t *testing.T) { cut.cut() },
				}
			})
		})
	}
}

// cutter is a Dialer that can cut every connection it made and refuse new
// ones, as a store that died would.
type cutter struct {
	mu    sync.Mutex
	done  bool
	conns []net.Conn
}

func (c *cutter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		_ = conn.Close()
		return nil, fmt.Errorf("dial %s: connection refused (cut off by the test)", addr)
	}
	c.conns = append(c.conns, conn)
	return conn, nil
}

func (c *cutter) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.done = true
	for _, conn := range c.conns {
		_ = conn.Close()
	}
}

// TestReplicaAckAcquireAndRenew checks WithReplicaAck on a primary with one
// replica: grants and renewals pass while the replica is up; with the
// replica down a grant is refused with a *ReplicaAckError and undone, a
// re-entry gives back only the hold it added, and renewals fail.
func TestReplicaAckAcquireAndRenew(t *testing.T) {
	set := testserver.StartSentinel(t)
	b := redislock.New(set.Client(t), redislock.WithReplicaAck(1, ackTimeout))
	primary := set.Primary(t).Client(t)
	ctx := t.Context()

	tok := newToken(t)
	req := driver.AcquireRequest{Key: "a", Token: tok, Owner: "o", TTL: 10 * time.Second, Reentrant: true}
	mustAcquire(t, b, req)
	if !renew(t, b, "a", tok, 10*time.Second) {
		t.Fatal("Renew with the replica up = false")
	}
	tokB := newToken(t)
	mustAcquire(t, b, driver.AcquireRequest{Key: "b", Token: tokB, Owner: "o", TTL: 10 * time.Second})
	for i, r := range b.RenewBatch(ctx, []driver.RenewRequest{{Key: "a", Token: tok, TTL: 10 * time.Second}, {Key: "b", Token: tokB, TTL: 10 * time.Second}, {Key: "c", Token: tok, TTL: time.Second}}) {
		if want := i < 2; r.Err != nil || r.Held != want {
			t.Errorf("RenewBatch[%d] = %+v, want held %v", i, r, want)
		}
	}
	// So are shared holds.
	reader := newToken(t)
	mustAcquire(t, b, driver.AcquireRequest{Key: "rw", Token: reader, Owner: "o", TTL: 10 * time.Second, Mode: driver.Shared})
	if !renew(t, b, "rw", reader, 10*time.Second) {
		t.Fatal("Renew of a shared hold with the replica up = false")
	}
	// The grants are on the replica already: WAIT said so.
	if got, err := set.Replica(t).Client(t).HGet(ctx, "dlock:{a}", tok).Result(); err != nil || got != "1" {
		t.Errorf("replica's hold count of a = %q, %v; want 1", got, err)
	}
	if _, err := set.Replica(t).Client(t).ZScore(ctx, "dlock:{rw}:s", reader).Result(); err != nil {
		t.Errorf("replica's shared hold of rw: %v", err)
	}

	set.Replica(t).Kill(t)

	start := time.Now()
	_, err := b.Acquire(ctx, driver.AcquireRequest{Key: "new", Token: newToken(t), Owner: "o", TTL: 10 * time.Second})
	var ackErr *redislock.ReplicaAckError
	if !errors.As(err, &ackErr) || ackErr.Op != "acquire" || ackErr.Key != "new" || ackErr.Want != 1 || ackErr.Got != 0 {
		t.Fatalf("Acquire with the replica down = %v, want a *ReplicaAckError{acquire new 1 0}", err)
	}
	if !strings.HasPrefix(err.Error(), "redis (Sentinel): ") || strings.Contains(err.Error(), `"new"`) {
		t.Errorf("error %q does not name the store alone", err)
	}
	t.Logf("refused after %v: %v", time.Since(start).Round(time.Millisecond), err)
	if exists(t, primary, "dlock:{new}") {
		t.Error("the refused grant is still on the primary")
	}

	// A shared grant that is not acknowledged is undone; its renewal fails.
	if _, err := b.Acquire(ctx, driver.AcquireRequest{Key: "rw", Token: newToken(t), Owner: "o", TTL: 10 * time.Second, Mode: driver.Shared}); !errors.As(err, &ackErr) {
		t.Fatalf("shared Acquire with the replica down = %v, want a *ReplicaAckError", err)
	}
	if n, err := primary.ZCard(ctx, "dlock:{rw}:s").Result(); err != nil || n != 1 {
		t.Errorf("shared holds of rw after the refused grant = %d, %v; want the first reader's only", n, err)
	}
	if held, err := b.Renew(ctx, "rw", reader, 10*time.Second); held || !errors.As(err, &ackErr) {
		t.Errorf("Renew of a shared hold with the replica down = %v, %v; want a *ReplicaAckError", held, err)
	}

	// A re-entry that is not acknowledged gives back its own hold only.
	if _, err := b.Acquire(ctx, req); !errors.As(err, &ackErr) {
		t.Fatalf("re-entry with the replica down = %v, want a *ReplicaAckError", err)
	}
	if got, err := primary.HGet(ctx, "dlock:{a}", tok).Result(); err != nil || got != "1" {
		t.Errorf("hold count after the refused re-entry = %q, %v; want 1", got, err)
	}

	// NOSCRIPT: the EVAL that follows is waited for as well.
	if err := primary.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, driver.AcquireRequest{Key: "flushed", Token: newToken(t), Owner: "o", TTL: 10 * time.Second}); !errors.As(err, &ackErr) {
		t.Fatalf("Acquire after SCRIPT FLUSH with the replica down = %v, want a *ReplicaAckError", err)
	}
	if exists(t, primary, "dlock:{flushed}") {
		t.Error("the refused grant after SCRIPT FLUSH is still on the primary")
	}

	if held, err := b.Renew(ctx, "a", tok, 10*time.Second); held || !errors.As(err, &ackErr) || ackErr.Op != "renew" {
		t.Errorf("Renew with the replica down = %v, %v; want a *ReplicaAckError", held, err)
	}
	for i, r := range b.RenewBatch(ctx, []driver.RenewRequest{{Key: "a", Token: tok, TTL: 10 * time.Second}, {Key: "c", Token: tok, TTL: time.Second}}) {
		switch {
		case i == 0 && !errors.As(r.Err, &ackErr):
			t.Errorf("RenewBatch[0] with the replica down = %+v, want a *ReplicaAckError", r)
		case i == 1 && (r.Held || r.Err != nil):
			t.Errorf("RenewBatch[1] of a lock not held = %+v, want not held and no error", r)
		}
	}

	set.Recover(t)
	mustAcquire(t, b, driver.AcquireRequest{Key: "new", Token: newToken(t), Owner: "o", TTL: 10 * time.Second})
	if !renew(t, b, "a", tok, 10*time.Second) {
		t.Error("Renew after the replica came back = false")
	}
}

// TestReplicaAckLosesLeaseWhenReplicaGoes checks that a dlock lease whose
// renewals are not acknowledged is reported lost, with the
// *ReplicaAckError as its cause, before its TTL runs out.
func TestReplicaAckLosesLeaseWhenReplicaGoes(t *testing.T) {
	set := testserver.StartSentinel(t)
	c := dlock.New(redislock.New(set.Client(t), redislock.WithReplicaAck(1, ackTimeout)), dlock.WithLogger(quietLog))
	t.Cleanup(func() { _ = c.Close() })
	const ttl = 1500 * time.Millisecond
	lease, err := c.Mutex("renewed", dlock.WithTTL(ttl)).Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	set.Replica(t).Kill(t)
	killed := time.Now()
	select {
	case <-lease.Done():
	case <-time.After(5 * ttl):
		t.Fatalf("lease still held %v after the replica died", 5*ttl)
	}
	var lost *dlock.LostError
	var ackErr *redislock.ReplicaAckError
	if !errors.As(lease.Err(), &lost) || lost.Reason != dlock.LostUnreachable || !errors.As(lease.Err(), &ackErr) {
		t.Fatalf("Err() = %v, want a LostUnreachable *LostError caused by a *ReplicaAckError", lease.Err())
	}
	t.Logf("lease lost %v after the replica died: %v", time.Since(killed).Round(time.Millisecond), lease.Err())
	if _, err := c.Mutex("other", dlock.WithTTL(ttl)).TryLock(t.Context()); !errors.As(err, &ackErr) {
		t.Errorf("TryLock with the replica down = %v, want a *ReplicaAckError", err)
	}
}

// TestReplicaAckOnCluster checks that on a Cluster the WAIT goes to the
// primary of the lock's slot: a one-primary cluster with one replica.
func TestReplicaAckOnCluster(t *testing.T) {
	nodeArgs := []string{"--cluster-enabled", "yes", "--cluster-node-timeout", "5000", "--repl-diskless-sync-delay", "0"}
	primary, replica := testserver.StartRedis(t, nodeArgs...), testserver.StartRedis(t, nodeArgs...)
	pc, rc := primary.Client(t), replica.Client(t)
	ctx := t.Context()
	if err := pc.ClusterAddSlotsRange(ctx, 0, 16383).Err(); err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(primary.Addr())
	if err := rc.ClusterMeet(ctx, host, port).Err(); err != nil {
		t.Fatal(err)
	}
	id, err := pc.ClusterMyID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	replicating := false
	waitUntilOK(t, 20*time.Second, "the replica to know the primary and replicate it", func() error {
		if !replicating {
			// Refused with "Unknown node" until the handshake is done.
			if err := rc.ClusterReplicate(ctx, id).Err(); err != nil {
				return err
			}
			replicating = true
		}
		info, err := rc.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "master_link_status:up") {
			return errors.New("link not up")
		}
		state, err := pc.ClusterInfo(ctx).Result()
		if err != nil || !strings.Contains(state, "cluster_state:ok") {
			return fmt.Errorf("cluster not ok: %v", err)
		}
		return nil
	})
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{primary.Addr()}})
	t.Cleanup(func() { _ = cc.Close() })
	b := redislock.New(cc, redislock.WithReplicaAck(1, ackTimeout))

	tok := newToken(t)
	mustAcquire(t, b, driver.AcquireRequest{Key: "x", Token: tok, Owner: "o", TTL: 10 * time.Second})
	if !renew(t, b, "x", tok, 10*time.Second) {
		t.Fatal("Renew on the cluster = false")
	}
	for i, r := range b.RenewBatch(ctx, []driver.RenewRequest{{Key: "x", Token: tok, TTL: 10 * time.Second}, {Key: "y", Token: tok, TTL: time.Second}}) {
		if want := i == 0; r.Err != nil || r.Held != want {
			t.Errorf("RenewBatch[%d] = %+v, want held %v", i, r, want)
		}
	}

	replica.Kill(t)
	var ackErr *redislock.ReplicaAckError
	if _, err := b.Acquire(ctx, driver.AcquireRequest{Key: "z", Token: newToken(t), Owner: "o", TTL: 10 * time.Second}); !errors.As(err, &ackErr) {
		t.Fatalf("Acquire on the cluster with the replica down = %v, want a *ReplicaAckError", err)
	}
	if exists(t, pc, "dlock:{z}") {
		t.Error("the refused grant is still on the primary")
	}
	if held, err := b.Renew(ctx, "x", tok, 10*time.Second); held || !errors.As(err, &ackErr) {
		t.Errorf("Renew on the cluster with the replica down = %v, %v; want a *ReplicaAckError", held, err)
	}

	// A Ring has no single primary for WAIT to reach.
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": primary.Addr()}})
	t.Cleanup(func() { _ = ring.Close() })
	if _, err := redislock.New(ring, redislock.WithReplicaAck(1, ackTimeout)).Acquire(ctx, driver.AcquireRequest{Key: "r", Token: tok, Owner: "o", TTL: time.Second}); err == nil || !strings.Contains(err.Error(), "Ring") {
		t.Errorf("Acquire with WithReplicaAck on a Ring = %v, want an error that names the Ring", err)
	}
}

// TestSentinelFailoverWhileHeld holds locks with auto-renewal and
// WithReplicaAck through a SENTINEL FAILOVER and then a SIGKILL of the
// primary, with a contender waiting on every name. After each failover
// every lock must be on the new primary with its holder's fence, and every
// lease must either be renewed on the new primary or report its loss; no
// two holders of one name may overlap.
func TestSentinelFailoverWhileHeld(t *testing.T) {
	set := testserver.StartSentinel(t)
	const (
		holders = 3
		perHold = 2
		ttl     = 10 * time.Second
	)
	led := &ledger{}
	var leases []*dlock.Lease
	for h := range holders {
		c := newSentinelClient(t, set, true)
		for i := range perHold {
			name := fmt.Sprintf("held-%d-%d", h, i)
			l, err := c.Mutex(name, dlock.WithTTL(ttl)).Lock(t.Context())
			if err != nil {
				t.Fatalf("Lock(%q): %v", name, err)
			}
			led.open(name, fmt.Sprintf("holder %d", h), l, time.Now())
			leases = append(leases, l)
		}
	}
	// One contender per name, on clients of their own, waiting to take it.
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	var contenderErrs atomic.Int32
	for _, l := range leases {
		c := newSentinelClient(t, set, true)
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := c.Mutex(l.Name(), dlock.WithTTL(ttl))
			for ctx.Err() == nil {
				cl, err := m.Lock(ctx)
				if err != nil {
					if ctx.Err() == nil {
						contenderErrs.Add(1)
						sleepCtx(ctx, 50*time.Millisecond)
					}
					continue
				}
				end := led.open(l.Name(), "contender", cl, time.Now())
				sleepCtx(ctx, 20*time.Millisecond)
				end(time.Now())
				uctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_ = cl.Unlock(uctx)
				cancel()
			}
		}()
	}

	check := func(phase string) {
		t.Helper()
		done := time.Now()
		// The failover kept every lock: WAIT put each on the replica that
		// was promoted.
		np := set.Primary(t).Client(t)
		for _, l := range leases {
			if l.Err() != nil {
				continue
			}
			fence, err := np.HGet(t.Context(), "dlock:{"+l.Name()+"}", "fence").Uint64()
			if (err != nil || fence != l.Fence()) && l.Err() == nil {
				t.Errorf("%s: lock %q on the new primary has fence %d (%v), want %d", phase, l.Name(), fence, err, l.Fence())
			}
		}
		// Each lease is renewed on the new primary (a renewal sent after
		// the failover succeeded) or has said that it is lost.
		renewed, lost := 0, map[string]int{}
		for _, l := range leases {
			waitUntilOK(t, 2*ttl, fmt.Sprintf("%s: lease %q renewed or lost", phase, l.Name()), func() error {
				if l.Err() != nil || l.Deadline().After(done.Add(ttl)) {
					return nil
				}
				return fmt.Errorf("deadline %v", l.Deadline().Sub(done).Round(time.Millisecond))
			})
			if err := l.Err(); err != nil {
				lost[lostReasonName(err)]++
			} else {
				renewed++
			}
		}
		t.Logf("%s: %d of %d leases renewed on the new primary, lost %v; contender errors so far %d",
			phase, renewed, len(leases), lost, contenderErrs.Load())
	}

	start := time.Now()
	set.Failover(t)
	t.Logf("SENTINEL FAILOVER took %v", time.Since(start).Round(time.Millisecond))
	check("SENTINEL FAILOVER")

	start = time.Now()
	set.KillPrimary(t)
	t.Logf("failover after SIGKILL took %v", time.Since(start).Round(time.Millisecond))
	set.Recover(t) // the new primary needs a replica to acknowledge renewals
	check("SIGKILL of the primary")

	uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, l := range leases {
		led.closeLease(l, time.Now())
		if err := l.Unlock(uctx); err != nil && l.Err() == nil {
			t.Errorf("Unlock(%q): %v", l.Name(), err)
		}
	}
	stop()
	wg.Wait()
	s := led.summary()
	t.Logf("grants %d (contenders %d), overlaps %d", s.grants, s.grants-len(leases), len(s.overlaps))
	for _, o := range s.overlaps {
		t.Errorf("two holders at once: %s", o)
	}
}

// TestSentinelFailoverUnderContention runs 4 clients that lock, work and
// unlock 2 names in a loop across a SENTINEL FAILOVER and then a SIGKILL of
// the primary, with plain and with Fair Mutexes (whose releases hand the
// lock to the queue's head without WithReplicaAck: the failovers come in
// the middle of handoffs). With WithReplicaAck no two holders of a name may
// overlap; without it the test only reports what happened, since
// asynchronous replication may lose a grant that was just made, handed or
// not.
func TestSentinelFailoverUnderContention(t *testing.T) {
	for _, c := range []struct {
		name      string
		ack, fair bool
	}{
		{"replica-ack", true, false},
		{"no-ack", false, false},
		{"replica-ack/fair", true, true},
		{"no-ack/fair", false, true},
	} {
		ack := c.ack
		t.Run(c.name, func(t *testing.T) {
			s := runContention(t, ack, c.fair)
			t.Logf("grants %d, lock errors %d %v (replica-ack refusals %d), losses %v, unlock errors %d, overlaps %d",
				s.grants, s.lockErrs, s.lockErrsIn, s.ackErrs, s.lost, s.unlockErrs, len(s.overlaps))
			for msg, n := range s.samples {
				t.Logf("%dx %s", n, msg)
			}
			for _, o := range s.overlaps {
				if ack {
					t.Errorf("two holders at once: %s", o)
				} else {
					t.Logf("two holders at once: %s", o)
				}
			}
			if s.grants == 0 {
				t.Error("no grants at all")
			}
		})
	}
}

type contentionStats struct {
	ledgerSummary
	lockErrs, ackErrs, unlockErrs int
	lost                          map[string]int // by phase and reason
	lockErrsIn                    map[string]int // by phase
	samples                       map[string]int // error messages, up to a few
}

// sample counts msg among the first few distinct error messages.
func (s *contentionStats) sample(err error) {
	msg := err.Error()
	if _, ok := s.samples[msg]; ok || len(s.samples) < 6 {
		s.samples[msg]++
	}
}

func runContention(t *testing.T, ack, fair bool) contentionStats {
	set := testserver.StartSentinel(t)
	const (
		clients = 4
		ttl     = time.Second
		spell   = 1500 * time.Millisecond // of work between the events
	)
	// The phase names where the workers are, for the counts.
	var phase atomic.Value
	phase.Store("before")
	names := []string{"busy-0", "busy-1"}
	led := &ledger{}
	var (
		mu    sync.Mutex
		stats = contentionStats{lost: map[string]int{}, lockErrsIn: map[string]int{}, samples: map[string]int{}}
	)
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for i := range clients {
		c := newSentinelClient(t, set, ack)
		for _, name := range names {
			wg.Add(1)
			go func() {
				defer wg.Done()
				opts := []dlock.Option{dlock.WithTTL(ttl)}
				if fair {
					opts = append(opts, dlock.Fair())
				}
				m := c.Mutex(name, opts...)
				for ctx.Err() == nil {
					lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					l, err := m.Lock(lctx)
					cancel()
					if err != nil {
						if ctx.Err() != nil {
							return
						}
						var ackErr *redislock.ReplicaAckError
						mu.Lock()
						stats.lockErrs++
						stats.lockErrsIn[phase.Load().(string)]++
						if errors.As(err, &ackErr) {
							stats.ackErrs++
						} else {
							stats.sample(err)
						}
						mu.Unlock()
						sleepCtx(ctx, 20*time.Millisecond)
						continue
					}
					end := led.open(name, fmt.Sprintf("client %d", i), l, time.Now())
					sleepCtx(l.Context(), time.Duration(5+rand.IntN(15))*time.Millisecond) // the critical section
					end(time.Now())
					uctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					uerr := l.Unlock(uctx)
					cancel()
					mu.Lock()
					if err := l.Err(); errors.Is(err, dlock.ErrLost) {
						stats.lost[phase.Load().(string)+": "+lostReasonName(err)]++
					} else if uerr != nil {
						stats.unlockErrs++
						stats.sample(uerr)
					}
					mu.Unlock()
				}
			}()
		}
	}
	time.Sleep(spell)
	start := time.Now()
	phase.Store("failover")
	set.Failover(t)
	t.Logf("SENTINEL FAILOVER took %v", time.Since(start).Round(time.Millisecond))
	phase.Store("after failover")
	time.Sleep(spell)
	start = time.Now()
	phase.Store("kill")
	set.KillPrimary(t)
	t.Logf("failover after SIGKILL took %v", time.Since(start).Round(time.Millisecond))
	set.Recover(t)
	phase.Store("after kill")
	time.Sleep(spell)
	stop()
	wg.Wait()
	stats.ledgerSummary = led.summary()
	return stats
}

// newSentinelClient returns a dlock Client on a failover client of set,
// with WithReplicaAck(1, ackTimeout) when ack is set, closed at cleanup.
func newSentinelClient(t *testing.T, set *testserver.SentinelSet, ack bool) *dlock.Client {
	t.Helper()
	var opts []redislock.Option
	if ack {
		opts = append(opts, redislock.WithReplicaAck(1, ackTimeout))
	}
	c := dlock.New(redislock.New(set.Client(t), opts...), dlock.WithLogger(quietLog))
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// quietLog drops the client's warnings: the failover tests cause many.
var quietLog = slog.New(slog.DiscardHandler)

// ledger is the tests' own record of who believed they held which lock and
// when: from the return of Lock until the holder stopped using it (the
// start of Unlock) or the lease ended, whichever came first.
type ledger struct {
	mu    sync.Mutex
	spans []grantSpan
	index map[*dlock.Lease]int
}

type grantSpan struct {
	name, who  string
	fence      uint64
	start, end time.Time // end is zero while held
}

// open records a grant that began at start and closes it when the lease
// ends; the returned func closes it earlier.
func (g *ledger) open(name, who string, l *dlock.Lease, start time.Time) func(at time.Time) {
	g.mu.Lock()
	if g.index == nil {
		g.index = make(map[*dlock.Lease]int)
	}
	g.index[l] = len(g.spans)
	g.spans = append(g.spans, grantSpan{name: name, who: who, fence: l.Fence(), start: start})
	g.mu.Unlock()
	context.AfterFunc(l.Context(), func() { g.closeLease(l, time.Now()) })
	return func(at time.Time) { g.closeLease(l, at) }
}

func (g *ledger) closeLease(l *dlock.Lease, at time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := &g.spans[g.index[l]]
	if s.end.IsZero() || at.Before(s.end) {
		s.end = at
	}
}

type ledgerSummary struct {
	grants   int
	overlaps []string
}

// summary counts the grants and lists every pair of spans of one name that
// overlap.
func (g *ledger) summary() ledgerSummary {
	g.mu.Lock()
	defer g.mu.Unlock()
	byName := make(map[string][]grantSpan)
	for _, s := range g.spans {
		byName[s.name] = append(byName[s.name], s)
	}
	var out ledgerSummary
	out.grants = len(g.spans)
	forever := time.Now().Add(time.Hour)
	for name, spans := range byName {
		sort.Slice(spans, func(i, j int) bool { return spans[i].start.Before(spans[j].start) })
		for i, a := range spans {
			aEnd := a.end
			if aEnd.IsZero() {
				aEnd = forever
			}
			for _, b := range spans[i+1:] {
				if b.start.Before(aEnd) {
					out.overlaps = append(out.overlaps, fmt.Sprintf("%q: %s (fence %d) until %s, %s (fence %d) from %s",
						name, a.who, a.fence, aEnd.Format("15:04:05.000"), b.who, b.fence, b.start.Format("15:04:05.000")))
				}
			}
		}
	}
	return out
}

// lostReasonName names the LostReason of err, or err itself when it is not a
// *LostError.
func lostReasonName(err error) string {
	var lost *dlock.LostError
	if errors.As(err, &lost) {
		return lost.Reason.String()
	}
	return err.Error()
}

// waitUntilOK polls check every 20ms until it returns nil, failing the test
// with its last error after limit.
func waitUntilOK(t *testing.T, limit time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s: %v", limit, what, err)
		}
		<-tick.C
	}
}

// sleepCtx waits for d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-ctx.Done():
	}
}

// TestReplicaAckFollowsRedirects checks that WithReplicaAck on a Cluster
// follows a MOVED reply (the slot map of its client is stale) and an ASK
// reply (the slot is migrating and the key is not on the old master) to
// the node it names. The two primaries have no replica, so a script that
// ran answers with a *ReplicaAckError, never with the redirection.
func TestReplicaAckFollowsRedirects(t *testing.T) {
	t.Parallel()
	c := testserver.StartCluster(t, 2)
	cc := c.Client(t)
	b := redislock.New(cc, redislock.WithReplicaAck(1, ackTimeout))
	plain := redislock.New(c.Client(t))
	ctx := t.Context()
	keys := keysPerNode(t, c, 3)
	granted, renewed, asked := keys[0][0], keys[0][1], keys[0][2]
	if err := cc.Ping(ctx).Err(); err != nil { // loads the slot map
		t.Fatal(err)
	}
	var ackErr *redislock.ReplicaAckError

	// MOVED, on Acquire: the grant runs on the new master and is undone.
	c.MoveSlot(t, c.Slot(t, lockKey(granted)), 1)
	if _, err := b.Acquire(ctx, driver.AcquireRequest{Key: granted, Token: newToken(t), Owner: "o", TTL: 10 * time.Second}); !errors.As(err, &ackErr) {
		t.Fatalf("Acquire after its slot moved behind the client = %v, want a *ReplicaAckError", err)
	}
	if exists(t, c.Node(1).Client(t), lockKey(granted)) {
		t.Error("the refused grant is still on the new master")
	}

	// MOVED, on Renew: the lease is extended on the new master.
	tok := newToken(t)
	mustAcquire(t, plain, driver.AcquireRequest{Key: renewed, Token: tok, Owner: "o", TTL: time.Second})
	c.MoveSlot(t, c.Slot(t, lockKey(renewed)), 1)
	if err := cc.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if held, err := b.Renew(ctx, renewed, tok, time.Minute); held || !errors.As(err, &ackErr) {
		t.Fatalf("Renew after its slot moved behind the client = %v, %v; want a *ReplicaAckError", held, err)
	}
	if ttl, err := c.Node(1).Client(t).PTTL(ctx, lockKey(renewed)).Result(); err != nil || ttl < 30*time.Second {
		t.Errorf("PTTL on the new master after the renewal = %v, %v; want the renewed minute", ttl, err)
	}

	// ASK: the slot is being migrated from node 0 to node 1, and the lock's
	// keys have gone over already, so node 0 sends the scripts to node 1.
	// The scripts declare every key of the lock, its shared holds, intent
	// and queue among them, and those do not exist: node 1 answers a script
	// of several keys that are not all there with TRYAGAIN (it cannot tell
	// a key that is still on node 0 from one that never was) rather than
	// run it on half the lock. A TRYAGAIN, not an ASK or a MOVED, shows that
	// the scripts reached node 1 with ASKING; nothing was written.
	holder := newToken(t)
	mustAcquire(t, plain, driver.AcquireRequest{Key: asked, Token: holder, Owner: "o", TTL: 30 * time.Second})
	slot := c.Slot(t, lockKey(asked))
	ids := make([]string, 2)
	for i := range ids {
		id, err := c.Node(i).Client(t).ClusterMyID(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	src, dst := c.Node(0).Client(t), c.Node(1).Client(t)
	if err := dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[0]).Err(); err != nil {
		t.Fatal(err)
	}
	if err := src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[1]).Err(); err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(c.Node(1).Addr())
	if err := src.Do(ctx, "MIGRATE", host, port, "", 0, 5000, "KEYS", lockKey(asked), lockKey(asked)+":fence").Err(); err != nil {
		t.Fatal(err)
	}
	if res, err := b.Acquire(ctx, driver.AcquireRequest{Key: asked, Token: newToken(t), Owner: "o", TTL: 10 * time.Second}); err == nil || !strings.Contains(err.Error(), "TRYAGAIN") {
		t.Fatalf("Acquire of a held lock while its slot migrates = %+v, %v; want TRYAGAIN from the importing node", res, err)
	}
	if held, err := b.Renew(ctx, asked, holder, time.Minute); held || err == nil || !strings.Contains(err.Error(), "TRYAGAIN") {
		t.Fatalf("Renew while its slot migrates = %v, %v; want TRYAGAIN from the importing node", held, err)
	}
	pipe := dst.Pipeline()
	pipe.Do(ctx, "asking")
	ttl := pipe.PTTL(ctx, lockKey(asked))
	pipe.Do(ctx, "asking")
	holds := pipe.HGet(ctx, lockKey(asked), holder)
	if _, err := pipe.Exec(ctx); err != nil || ttl.Val() > 30*time.Second || holds.Val() != "1" {
		t.Errorf("lock on the importing node after the refused scripts: PTTL %v, holds %q, %v; want it as granted", ttl.Val(), holds.Val(), err)
	}
}
