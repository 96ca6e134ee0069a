package redlockfaults_test

// Redlock and restarts. A Redis node that crashes and restarts without its
// data has forgotten the leases it granted and its fence counters. Redlock
// ("Distributed locks with Redis", the Redis documentation) is safe across
// such a restart only if one of these holds:
//
//   - the node rejoins no earlier than the longest lease TTL (plus the
//     clock-drift allowance) after its crash, a delayed restart: by then
//     every lease that counted on its vote has been renewed on a quorum
//     without it or has run out, and its holder has been told so; or
//   - the node persists every write before it answers (appendonly yes with
//     appendfsync always), so that it restarts with the leases it granted.
//
// Otherwise a holder whose quorum was exactly a bare majority that included
// the node, and a newcomer who gets the restarted node plus the nodes the
// holder never had, hold the lock at the same time, and the newcomer's fence
// need not be larger.
//
// A delayed restart saves exclusion but not fences: the restarted node's
// counters start from zero, so a later quorum made of it and nodes that
// missed the latest grant hands out a fence that is not larger. Only
// persistence keeps fences monotonic across restarts.
//
// The tests below check exclusion under the two safe ways (and fences with
// persistence), report fence inversions after delayed restarts, and show
// what an immediate restart does, reporting it without failing, since
// Redlock makes no promise there.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// Nodes crash (SIGKILL, no persistence) one after the other while clients
// contend, and each restarts only after the TTL and drift have passed.
func TestKillAndDelayedRestart(t *testing.T) {
	ns := startNodes(t, 3)
	cfg := run()
	// At least the TTL plus the drift allowance, with room to spare.
	restartDelay := cfg.ttl * 3 / 2
	lg := contend(t, cfg, ns.backends(), func(ctx context.Context) {
		for _, i := range []int{1, 2} {
			if !pause(ctx, cfg.run/8) {
				return
			}
			ns.servers[i].Kill(t)
			pause(ctx, restartDelay)
			ns.servers[i].Start(t)
		}
	})
	// Exclusion holds; fences need not: a restarted node counts from zero
	// again, and a quorum made of it and a node that missed the latest
	// grant (a timeout is enough) hands out a fence that is not larger.
	lg.checkExclusion(t, cfg.names, minGrants)
	for _, inv := range lg.inversions() {
		t.Logf("fence inversion (expected possible without persistence): %s", inv)
	}
}

// restartOutcome is what a newcomer found after a node restart.
type restartOutcome struct {
	holder              *dlock.Lease
	holderFrom          time.Time // when the holder's Lock returned
	holderTo            time.Time // when the holder stopped trusting its lease; zero while it trusts it
	newcomer            *dlock.Lease
	newcomerAt          time.Time // when the newcomer's TryLock returned
	newcomerErr         error
	holderErrAtNewcomer error // the holder's Err when the newcomer's TryLock returned
}

// overlap reports whether both held the lock at the same time as far as each
// of them could tell.
func (o restartOutcome) overlap() bool {
	return o.newcomer != nil && (o.holderTo.IsZero() || o.newcomerAt.Before(o.holderTo))
}

// restartUnderBareQuorum makes a holder whose quorum is exactly nodes 0 and 1
// of 3 (node 2 is down while it locks, then comes back), kills node 1 and
// starts it again delay later, and then lets a newcomer try the lock.
func restartUnderBareQuorum(t *testing.T, ns *nodes, leaseTTL, delay time.Duration) restartOutcome {
	t.Helper()
	ctx := t.Context()
	h := dlock.New(ns.redlock(t), dlock.WithTTL(leaseTTL))
	t.Cleanup(func() { _ = h.Close() })
	ns.proxies[2].Down(t)
	hl := lockSoon(t, h.Mutex("r"))
	o := restartOutcome{holder: hl, holderFrom: time.Now()}
	ns.proxies[2].Up(t)
	doneAt := make(chan time.Time, 1)
	go func() {
		<-hl.Done()
		doneAt <- time.Now()
	}()

	ns.servers[1].Kill(t)
	if delay > 0 {
		time.Sleep(delay) // the delayed restart itself
	}
	ns.servers[1].Start(t)

	x := dlock.New(ns.redlock(t), dlock.WithTTL(leaseTTL))
	t.Cleanup(func() { _ = x.Close() })
	// The newcomer tries until the store answers: a store error (a node
	// missing its 50ms on a loaded machine) says nothing about the lock.
	for range 5 {
		o.newcomer, o.newcomerErr = x.Mutex("r").TryLock(ctx)
		if o.newcomerErr == nil || errors.Is(o.newcomerErr, dlock.ErrNotObtained) {
			break
		}
		t.Logf("newcomer: %v", o.newcomerErr)
	}
	o.newcomerAt = time.Now()
	o.holderErrAtNewcomer = hl.Err()
	select {
	case at := <-doneAt:
		o.holderTo = at
		if dl := hl.Deadline(); dl.Before(at) {
			o.holderTo = dl
		}
	default:
	}
	return o
}

func (o restartOutcome) log(t *testing.T) {
	t.Helper()
	t.Logf("holder: fence %d, Err when the newcomer tried: %v", o.holder.Fence(), o.holderErrAtNewcomer)
	if o.newcomer == nil {
		t.Logf("newcomer: not obtained: %v", o.newcomerErr)
		return
	}
	t.Logf("newcomer: obtained, fence %d, %v after the holder's grant", o.newcomer.Fence(), o.newcomerAt.Sub(o.holderFrom).Round(time.Millisecond))
}

// A holder on a bare majority survives, or is told of its loss in time,
// when one of its nodes crashes and restarts empty after the TTL.
func TestBareQuorumRestartAfterTTL(t *testing.T) {
	ns := startNodes(t, 3)
	const leaseTTL = 500 * time.Millisecond
	delay := leaseTTL + ns.redlock(t).Drift(leaseTTL)
	o := restartUnderBareQuorum(t, ns, leaseTTL, delay)
	o.log(t)
	if o.overlap() {
		t.Errorf("the newcomer got the lock (fence %d) while the holder (fence %d) still trusted its lease, after a restart delay of %v",
			o.newcomer.Fence(), o.holder.Fence(), delay)
	}
	// The fence counter is another matter: only node 0 counted the
	// holder's grant, and the newcomer's quorum (the restarted node 1 and
	// node 2) never saw it. No delay can bring it back; only persistence
	// can. Reported, not checked.
	if o.newcomer != nil && o.newcomer.Fence() <= o.holder.Fence() {
		t.Logf("fence went from %d to %d across the restart: without persistence Redlock's fences are not monotonic",
			o.holder.Fence(), o.newcomer.Fence())
	}
}

// With every write on disk before it is answered, a node restarted at once
// still has the holder's lease.
func TestBareQuorumRestartWithAOF(t *testing.T) {
	ns := startNodes(t, 3, "--appendonly", "yes", "--appendfsync", "always")
	const leaseTTL = 2 * time.Second
	o := restartUnderBareQuorum(t, ns, leaseTTL, 0)
	o.log(t)
	if o.overlap() {
		t.Errorf("the newcomer got the lock (fence %d) while the holder (fence %d) still held it, with appendfsync always",
			o.newcomer.Fence(), o.holder.Fence())
	}
	if o.newcomer == nil && !errors.Is(o.newcomerErr, dlock.ErrNotObtained) {
		t.Errorf("newcomer: %v, want ErrNotObtained (the holder has nodes 0 and 1)", o.newcomerErr)
	}
}

// Without persistence and with an immediate restart, Redlock can grant the
// lock twice. This reports what happens and does not fail: it is the case
// the rules above exist for.
func TestBareQuorumImmediateRestartReport(t *testing.T) {
	ns := startNodes(t, 3)
	const leaseTTL = 2 * time.Second
	o := restartUnderBareQuorum(t, ns, leaseTTL, 0)
	o.log(t)
	switch {
	case o.overlap():
		t.Logf("UNSAFE, as Redlock predicts: both held the lock (holder fence %d, newcomer fence %d); the holder was not told before the newcomer got it",
			o.holder.Fence(), o.newcomer.Fence())
		// Does the holder find out at its next renewal?
		select {
		case <-o.holder.Done():
			t.Logf("holder told afterwards: %v", o.holder.Err())
		case <-time.After(leaseTTL):
			t.Logf("holder still trusts its lease %v later", leaseTTL)
		}
	case o.newcomer != nil:
		t.Logf("newcomer got the lock only after the holder stopped trusting it")
	default:
		t.Logf("the newcomer did not get the lock")
	}
}
