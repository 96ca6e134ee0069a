package chaostest

// Faults at the direct handoff (Redis): a fair release grants the lock to
// the queue's head and announces it on the head's notification connection.
// These scenarios break that connection while the handoffs go on.

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
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
