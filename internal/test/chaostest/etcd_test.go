package chaostest

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/locktest/chaos"
)

// TestEtcd runs the scenarios on a 3-member etcd cluster: no fault, fair
// locks with and without cancellations, the
// leader killed (SIGKILL) and restarted again and again, the leader frozen
// (SIGSTOP) past the TTL, the whole cluster killed and restarted, and a
// client paused past its lease. Raft keeps every acknowledged grant and
// the revision (the fence) through all of them: nothing may be broken
// where a majority stays up, and where it does not (the full restart)
// acquires fail and holders are told before their deadline.
func TestEtcd(t *testing.T) {
	s := startStore(t, kindEtcd, storeOptions{})
	t.Run("baseline", func(t *testing.T) {
		runBoth(t, scenario{store: s, label: "etcd-baseline", duration: 1500 * time.Millisecond}, longThink)
		runScenario(t, scenario{store: s, label: "etcd-baseline", workload: chaos.Stock, duration: 1500 * time.Millisecond,
			targets: []chaos.Target{
				{Name: "rw", Mode: chaos.Exclusive, RW: true},
				{Name: "rw", Mode: chaos.Shared},
				{Name: "sem", Mode: chaos.Permit, Limit: 2},
			}})
	})
	t.Run("fair", func(t *testing.T) {
		fair := []dlock.Option{dlock.Fair()}
		runScenario(t, scenario{store: s, label: "etcd-fair", workload: chaos.Stock, fenced: true,
			names: prefixed("fair-", nil), duration: 1500 * time.Millisecond, lockOpts: fair})
		runScenario(t, scenario{store: s, label: "etcd-fair", workload: chaos.Stock, fenced: true,
			names: prefixed("fair-cancel-", cancelNames()), cancelRate: 0.2, cancelWithin: 100 * time.Microsecond,
			duration: 1500 * time.Millisecond, lockOpts: fair})
	})
	t.Run("leader-kill", func(t *testing.T) {
		runBoth(t, scenario{store: s, label: "etcd-leader-kill", duration: 4 * time.Second, ttl: time.Second,
			faults: etcdFault(s, func(t *testing.T, r *runState, ctx context.Context) {
				leader := s.etcd.Leader(t)
				r.rec.Note("kill -9 the leader, member %d", leader)
				s.etcd.Kill(t, leader)
				r.sleep(ctx, r.sc.ttl)
				s.etcd.Start(t, leader)
				r.rec.Note("member %d restarted", leader)
			}),
		}, 0)
	})
	t.Run("leader-pause", func(t *testing.T) {
		runScenario(t, scenario{store: s, label: "etcd-leader-pause", workload: chaos.Stock, fenced: true,
			duration: 4 * time.Second, ttl: time.Second,
			faults: etcdFault(s, func(t *testing.T, r *runState, ctx context.Context) {
				leader := s.etcd.Leader(t)
				r.rec.Note("SIGSTOP the leader, member %d", leader)
				s.etcd.Pause(t, leader)
				r.sleep(ctx, 2*r.sc.ttl)
				s.etcd.Resume(t, leader)
				r.rec.Note("SIGCONT member %d", leader)
			}),
		})
	})
	t.Run("cluster-restart", func(t *testing.T) {
		runScenario(t, scenario{store: s, label: "etcd-cluster-restart", workload: chaos.Set,
			duration: 5 * time.Second, ttl: time.Second,
			faults: func(ctx context.Context, r *runState) {
				if !r.sleep(ctx, 500*time.Millisecond) {
					return
				}
				r.rec.Note("kill -9 every member")
				s.etcd.KillAll(t)
				r.sleep(ctx, r.sc.ttl)
				s.etcd.StartAll(t)
				r.rec.Note("every member restarted")
			},
		})
	})
	t.Run("member-partition", func(t *testing.T) {
		ps := startStore(t, kindEtcd, storeOptions{Proxy: true})
		runScenario(t, scenario{store: ps, label: "etcd-member-partition", workload: chaos.Stock, fenced: true,
			duration: 5 * time.Second, ttl: time.Second,
			faults: etcdFault(ps, func(t *testing.T, r *runState, ctx context.Context) {
				// The leader one time, a follower the next.
				cut := ps.etcd.Leader(t)
				if r.rec != nil && len(r.rec.Events())%2 == 1 {
					cut = (cut + 1) % 3
				}
				r.rec.Note("partition member %d (peers and clients)", cut)
				ps.etcd.Partition(t, cut)
				r.sleep(ctx, 2*r.sc.ttl)
				ps.etcd.Heal(t, cut)
				r.rec.Note("heal member %d", cut)
			}),
		})
	})
	t.Run("client-pause", func(t *testing.T) {
		for _, fenced := range []bool{true, false} {
			name := "unfenced"
			if fenced {
				name = "fenced"
			}
			t.Run(name, func(t *testing.T) { runPause(t, s, fenced) })
		}
	})
}

// etcdFault returns a scenario's faults: fault, again and again, with a
// pause between, until the run ends; a run that ended before the first
// fault fails.
func etcdFault(s *store, fault func(t *testing.T, r *runState, ctx context.Context)) func(ctx context.Context, r *runState) {
	return func(ctx context.Context, r *runState) {
		if n := faultLoop(ctx, r, 300*time.Millisecond, 800*time.Millisecond, func(int) { fault(r.t, r, ctx) }); n == 0 {
			r.t.Errorf("%s: the run ended before any fault", s.name)
		}
	}
}
