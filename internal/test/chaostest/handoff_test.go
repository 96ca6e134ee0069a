//go:build linux

package chaostest

// Faults at the direct handoff (Redis): a fair release grants the lock to
// the queue's head and announces it on the head's notification connection.
// These scenarios break that connection while the handoffs go on.

import (
	"context"
	"errors"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/locktest/chaos"
)

// notifyDropRecovery bounds how long after a dropped notification
// connection some client must be granted a name again: a head whose
// announcement was lost learns of its grant at its next queue refresh
// (every third of the queue entry's TTL, the run's 500ms TTL here) or by
// subscribing again, well under the bound on an idle machine; the bound
// is generous for a loaded one. It is liveness, not speed: a lost
// announcement must not leave a name held by nobody for good.
const notifyDropRecovery = 2 * time.Second

// TestFairNotifyDrop runs Fair Mutexes on one Redis node while an operator
// kills every pub/sub connection (CLIENT KILL TYPE pubsub) again and again:
// the announcements of handoffs made meanwhile are lost. A head that was
// handed the lock and never heard of it must learn of its grant at its
// next refresh, or the grant must lapse and go to the next head: no two
// holders, no stale write accepted, no lost update, nothing left on the
// store, and every name granted again soon after each drop.
func TestFairNotifyDrop(t *testing.T) {
	s := startStore(t, kindRedis, storeOptions{})
	admin := s.redis.Client(t)
	var kills []int64 // chaos.Now just after each drop
	names := prefixed("fair-drop-", nil)
	runScenario(t, scenario{
		store:    s,
		workload: chaos.Stock,
		fenced:   true,
		names:    names,
		clients:  4,
		duration: 4 * time.Second,
		lockOpts: []dlock.Option{dlock.Fair()},
		faults: func(ctx context.Context, r *runState) {
			faultLoop(ctx, r, 200*time.Millisecond, 250*time.Millisecond, func(int) {
				n, err := admin.ClientKillByFilter(ctx, "TYPE", "pubsub").Result()
				if err != nil && ctx.Err() == nil {
					t.Errorf("CLIENT KILL TYPE pubsub: %v", err)
					return
				}
				r.rec.Note("CLIENT KILL TYPE pubsub: %d connections dropped", n)
				kills = append(kills, chaos.Now())
			})
		},
		extra: func(t *testing.T, r *runState) {
			if len(kills) < 3 {
				t.Fatalf("%d drops of the notification connections; the run was too short to show anything", len(kills))
			}
			events := r.rec.Events()
			last := events[len(events)-1].End
			for _, name := range names {
				var grants []int64 // End of each grant of name
				for _, e := range events {
					if e.Name == name && e.Kind == chaos.KindAcquire && e.Outcome == chaos.OK {
						grants = append(grants, e.End)
					}
				}
				slices.Sort(grants)
				for i, k := range kills {
					if last-k < int64(notifyDropRecovery) {
						break // too close to the end of the run to tell
					}
					j, _ := slices.BinarySearch(grants, k)
					if j == len(grants) || grants[j]-k > int64(notifyDropRecovery) {
						t.Errorf("%q: no grant within %v of drop %d (%v into the run)", name, notifyDropRecovery, i+1, offset(events, k))
					}
				}
			}
			t.Logf("%d drops of every notification connection; %d grants", len(kills), r.report.Grants)
		},
	})
}

// TestHeadCrash kills the head of a fair queue as the lock is released to
// it: a child process waits for procName with a Fair Mutex behind a holder;
// once its entry is in the queue, the holder releases and the child is
// killed (SIGKILL). On Redis it is stopped (SIGSTOP) before the release and
// killed after it, without having heard of it: the release has granted the
// lock to the stopped head (the direct handoff), which never claims it. On
// the SQL stores it is killed before the release, which leaves the lock
// free but promised to the dead head. Either way the in-process clients
// behind it must get the lock once the dead head's queue entry lapses
// (within the queue's time to live, at most the TTL), with no exclusion
// broken and nothing left on the store. On Redis, redis-plain does the same
// with plain Mutexes everywhere: the child's wait starves and queues, and a
// queued plain wait takes the handoff too.
func TestHeadCrash(t *testing.T) {
	for _, kind := range storeKinds {
		if kind == kindRedlock {
			continue // no fair locks
		}
		t.Run(kind, func(t *testing.T) { runHeadCrash(t, startStore(t, kind, storeOptions{}), true) })
		if kind == kindRedis {
			t.Run(kind+"-plain", func(t *testing.T) { runHeadCrash(t, startStore(t, kind, storeOptions{}), false) })
		}
	}
}

// maxCrashRestarts bounds how often runHeadCrash makes a round again
// because the holder's lease was lost before the head queued, or the
// stopped head's entry ran out before the release.
const maxCrashRestarts = 5

// plainCrashSlack is what runHeadCrash allows beyond a plain head's queue
// entry: a waiter's wake-up at the handed grant's expiry and its request.
const plainCrashSlack = time.Second

func runHeadCrash(t *testing.T, s *store, fair bool) {
	sc := procScenario(s, "headcrash", true)
	sc.fair = fair
	var opts []dlock.Option
	// The lock must come free within the dead head's queue entry (at most
	// the TTL) and crashSlack.
	bound := sc.ttl + crashSlack
	if fair {
		opts = append(opts, dlock.Fair())
	} else {
		// A plain head's entry lives three times the safety margin, at
		// least 1s: with a 5s TTL, 1.5s, where a Fair entry would live 5s.
		sc.ttl = 5 * time.Second
		bound = 1500*time.Millisecond + plainCrashSlack
	}
	r := startProcRun(t, sc)
	holder := s.clientOn(t, s.spec, r.rec, "holder", nil, dlock.WithTTL(sc.ttl))
	b, closeFn, err := s.spec.open()
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	in, ok := b.(driver.Inspector)
	if !ok {
		t.Fatalf("the %s backend cannot inspect a lock", s.name)
	}
	inspect := func() driver.LockInfo {
		var info driver.LockInfo
		_ = retryStore(t, "inspect", func() (err error) {
			info, _, err = in.Inspect(t.Context(), procName)
			return err
		})
		return info
	}
	rounds := crashRounds
	if *soak {
		rounds = procSoakRounds
	}
	// As in the pause and crash scenarios, a soak goes on past its rounds
	// until it has made soakOps critical sections (on a SQL store 25
	// rounds make a few thousand).
	restarts := 0
	for i := 0; i < rounds || (*soak && r.grants.Load() < soakOps); i++ {
		c := r.startChild(roleHead)
		c.expectLine(t, "ready")
		r.gate.close(t)
		ctx, cancel := context.WithTimeout(t.Context(), procWait)
		l, err := holder.Mutex(procName, opts...).Lock(ctx)
		cancel()
		if err != nil {
			t.Fatalf("round %d: the holder's Lock: %v", i+1, err)
		}
		c.send(t, "step")
		lost := false
		c.waitOrDump(t, "its entry in the fair queue", procWait, func() bool {
			if inspect().Queued > 0 {
				return true
			}
			lost = l.Err() != nil
			return lost
		})
		if lost {
			// A loaded machine starved the holder's renewals (TTL 500ms)
			// before the head queued, and the head may have been granted
			// the lock instead of queueing: nothing of what the round
			// checks happened. The head is killed and the round made again.
			c.signal(t, syscall.SIGKILL)
			c.waitExit(t, -1)
			r.rec.Note("SIGKILL %s: the holder's lease was lost before it queued", c.client())
			_ = l.Unlock(t.Context())
			r.gate.open()
			if restarts++; restarts > maxCrashRestarts {
				t.Fatalf("round %d: the holder's lease was lost before the head queued, %d times", i+1, restarts)
			}
			t.Logf("round %d: the holder's lease was lost before the head queued (%v); the round starts over", i+1, l.Err())
			i--
			continue
		}
		var killed int64
		kill := func() {
			killed = chaos.Now()
			c.signal(t, syscall.SIGKILL)
			c.waitExit(t, -1)
			r.rec.Note("SIGKILL %s", c.client())
		}
		// On Redis the head is stopped, so that it hears nothing of the
		// release, and killed after it. A SQL head polls in transactions:
		// stopped in one, it would hold row locks on the server and stall
		// the release itself (another fault); there nothing is handed at
		// the release, and the head is killed before it.
		redis := s.spec.Kind == kindRedis
		if redis {
			c.stopAtRest(t)
			r.rec.Note("SIGSTOP %s, the head of the queue of %q", c.client(), procName)
		} else {
			kill()
		}
		if err := l.Unlock(t.Context()); err != nil {
			// A loaded machine can starve the holder's renewals (TTL
			// 500 ms) until its lease is lost; the lock is then free
			// as it would be after the release, which is what the
			// round checks from here.
			if l.Err() == nil || !errors.Is(err, dlock.ErrNotHeld) {
				t.Fatalf("round %d: the holder's Unlock: %v", i+1, err)
			}
			t.Logf("round %d: the holder's lease was lost before its Unlock: %v", i+1, err)
		}
		info := inspect()
		handed := info.Owner != ""
		r.rec.Note("released: held by %q (fence %d), %d queued", info.Owner, info.Fence, info.Queued)
		if redis && !handed && info.Queued == 0 {
			// The stopped head's entry ran out (its time to live is the
			// TTL, 500 ms) before the release reached the store: on a
			// loaded machine stopping the head and releasing can take
			// that long. Nothing was there to hand the lock to; the round
			// is made again. A release that failed to hand over to a live
			// entry leaves it queued.
			kill()
			r.rec.Note("the stopped head's entry ran out before the release")
			r.gate.open()
			if restarts++; restarts > maxCrashRestarts {
				t.Fatalf("round %d: the stopped head's entry ran out before the release, %d times", i+1, restarts)
			}
			t.Logf("round %d: the stopped head's entry ran out before the release; the round starts over", i+1)
			i--
			continue
		}
		if redis {
			if !handed {
				t.Errorf("round %d: the release did not hand the lock to the stopped head (held by %q, %d queued)", i+1, info.Owner, info.Queued)
			}
			kill()
		}
		r.gate.open()
		var next int64
		r.waitFor(t, "an in-process client to get the lock after the head's kill", procWait, func() bool {
			next = r.watch.lastGrant.Load()
			return next > killed
		})
		after := time.Duration(next - killed)
		when := "before"
		if redis {
			when = "after"
		}
		t.Logf("round %d: head killed %s the release (handed the lock: %t); an in-process client got it %v after the kill", i+1, when, handed, after.Round(time.Millisecond))
		if after > bound {
			t.Errorf("round %d: the lock came free %v after the head's kill: more than its queue entry's time to live and the slack allow (%v)", i+1, after, bound)
		}
	}
	r.finish()
}
