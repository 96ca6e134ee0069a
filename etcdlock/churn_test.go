package etcdlock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/testserver"
)

// A leader that takes office extends every lease by its full TTL (etcd's
// lessor "promotes" them: it cannot know how long the last leader had
// left). While leaders change faster than a lease's TTL, no lease expires,
// so a grant that counts on its lease's expiry to go away stays: the
// orphan of an acquire whose answer and clean-up were both lost blocked
// its lock for the rest of the leader-kill soak (docs/ETCD.md). A retired
// lease whose holds are all gone or abandoned must be revoked once its
// holders can no longer count on it, not left to expire.
//
// A single member restarted every second or so does the same to leases as
// leader kills in a cluster: each start elects it again.
func TestOrphanGrantGoesUnderLeaderChanges(t *testing.T) {
	srv := testserver.StartEtcd(t)
	orphaned := time.Now()
	c, _ := makeOrphan(t, srv, true)

	// The Client goes on working, as the soak's clients did: other locks
	// taken and released.
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			if l, err := c.Mutex("busy").TryLock(cctx); err == nil {
				_ = l.Unlock(cctx)
			}
			cancel()
			time.Sleep(50 * time.Millisecond)
		}
	}()
	defer func() { stop(); wg.Wait() }()

	other := dlock.New(etcdlock.New(srv.Client(t)))
	defer other.Close()
	free := func() bool {
		cctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		l, err := other.Mutex("orphan").TryLock(cctx)
		if err != nil {
			return false
		}
		_ = l.Unlock(cctx)
		return true
	}
	// TTL 1s: the orphan is abandoned 1s after its grant, and its lease
	// (2s) ran out 2s after its last keep-alive, before that. 12s leaves
	// room for restarts that fail the calls meant to revoke it.
	const bound = 12 * time.Second
	for time.Since(orphaned) < bound {
		srv.Kill(t, 0)
		srv.Start(t, 0)
		for range 8 {
			if free() {
				t.Logf("the orphan is gone %v after its grant", time.Since(orphaned).Round(100*time.Millisecond))
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	info, _, _ := etcdlock.New(srv.Client(t)).Inspect(t.Context(), "orphan")
	t.Fatalf("the orphaned grant of a 1s TTL is still held %v after its grant, with the member restarted every second (%+v)", time.Since(orphaned).Round(time.Second), info)
}

// The same for a queue lease: a grant handed to a head whose Lock ended
// and whose clean-up was lost lives on the head's entry lease, which the
// Backend stops using a second after granting it. While leaders change,
// that lease would not expire; the Backend revokes it once past the expiry
// it was granted with, and not before: a handed grant is trusted until
// S + QueueTTL at most, which that expiry covers (see
// TestQueueLeaseOutlivesLastRequestPlusQueueTTL).
func TestHandedGrantOnQueueLeaseGoesUnderLeaderChanges(t *testing.T) {
	srv := testserver.StartEtcd(t)
	const qttl = 3 * time.Second // leases of 4s
	hb, _ := hoHolder(t, srv, "k")
	b := etcdlock.New(srv.Client(t))
	revoked := etcdlock.ReportRevokes(b)
	sent := time.Now()
	hoHead(t, b, "k", "head", qttl)
	admin := srv.Client(t)
	entry, err := admin.Get(t.Context(), "dlock/k\x00q\x00head")
	if err != nil || len(entry.Kvs) != 1 {
		t.Fatalf("queue entry: %v, %v", entry, err)
	}
	qlease := clientv3.LeaseID(entry.Kvs[0].Lease)
	if _, err := hb.Release(t.Context(), "k", "holder"); err != nil {
		t.Fatal(err)
	}
	if info, ok := hoInspect(t, b, "k"); !ok || info.Owner != "head head" {
		t.Fatalf("after the release: %+v (held %v); want handed to the head", info, ok)
	}
	// The head never claims it nor gives it back. The Backend goes on
	// queueing elsewhere (a new queue lease a second later) and taking
	// other locks, while the member is restarted every second or so.
	time.Sleep(1100 * time.Millisecond)
	hoHolder(t, srv, "k2")
	hoHead(t, b, "k2", "head2", qttl)
	free := func() bool {
		_, ok := hoInspect(t, b, "k")
		return !ok
	}
	_, ok := churnUntil(t, srv, b, 12*time.Second, free)
	gone := time.Since(sent) // from the head's request
	etcdlock.WaitRevokes(b)
	if !ok {
		t.Fatalf("the grant handed to a head that never claimed it is still held %v after the head's request, with the member restarted every second", time.Since(sent).Round(time.Second))
	}
	t.Logf("the handed grant is gone %v after the head's request", gone.Round(100*time.Millisecond))
	if gone < qttl {
		t.Fatalf("the handed grant went %v after the head's request, before its QueueTTL (%v)", gone, qttl)
	}
	for {
		select {
		case id := <-revoked:
			if id == qlease {
				return
			}
			continue
		default:
		}
		t.Fatalf("the handed grant went without the Backend revoking the head's queue lease %x", qlease)
	}
}
