package etcdlock_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/test/testserver"
	clientv3 "go.etcd.io/etcd/client/v3"
)

var (
	manyLocks = flag.Int("etcd.locks", 300, "TestKeepAlivesDoNotGrowWithLocks: the larger number of locks (the issue's figure: 10000)")
	manyTTL   = flag.Duration("etcd.ttl", time.Second, "TestKeepAlivesDoNotGrowWithLocks: the locks' TTL")
	manyHold  = flag.Duration("etcd.hold", 3*time.Second, "TestKeepAlivesDoNotGrowWithLocks: how long the locks are held")
)

// One Client's auto-renewed locks share a lease: the keep-alives sent per
// interval do not grow with the number of locks, and none is lost. With
// -etcd.locks 10000 -etcd.ttl 5s -etcd.hold 15s it is the run of
// docs/ETCD.md.
func TestKeepAlivesDoNotGrowWithLocks(t *testing.T) {
	srv := testserver.StartEtcd(t)
	ttl := *manyTTL
	for _, n := range []int{10, *manyLocks} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			b := etcdlock.New(srv.Client(t), etcdlock.WithNamespace(fmt.Sprintf("ka%d/", n)))
			keepAlives, grants := etcdlock.CountLeaseCalls(b)
			c := dlock.New(b, dlock.WithTTL(ttl))
			defer c.Close()
			leases := make([]*dlock.Lease, n)
			for i := range leases {
				l, err := c.Mutex(fmt.Sprintf("lock-%d", i)).TryLock(t.Context())
				if err != nil {
					t.Fatalf("TryLock %d: %v", i, err)
				}
				leases[i] = l
			}
			start := keepAlives.Load()
			hold := *manyHold
			time.Sleep(hold)
			sent := keepAlives.Load() - start
			for i, l := range leases {
				if err := l.Err(); err != nil {
					t.Fatalf("lease %d lost: %v", i, err)
				}
				if err := l.Unlock(t.Context()); err != nil {
					t.Fatalf("Unlock %d: %v", i, err)
				}
			}
			// The lease (living 1.5 TTL, at least TTL + 1s) needs a
			// keep-alive about every half TTL at most: some 6 in 3s for a
			// TTL of 1s, whatever the number of locks. Allow twice that.
			t.Logf("%d locks for %v: %d keep-alives, %d lease grants", n, hold, sent, grants.Load())
			if limit := int64(2*hold/(ttl/2)) + 2; sent > limit {
				t.Errorf("%d keep-alives for %d locks in %v, want at most %d", sent, n, hold, limit)
			}
			if g := grants.Load(); g != 1 {
				t.Errorf("%d lease grants, want 1", g)
			}
		})
	}
}

// A lock that its holder stops renewing expires on the store even though
// it shares its lease with locks that are renewed: the lease is retired and
// the renewed locks move to a fresh one, keeping their fences.
func TestUnrenewedLockExpiresOnSharedLease(t *testing.T) {
	srv := testserver.StartEtcd(t)
	b := etcdlock.New(srv.Client(t))
	c := dlock.New(b, dlock.WithTTL(time.Second))
	defer c.Close()
	kept := lockNow(t, c.Mutex("kept"))
	left := lockNow(t, c.Mutex("left", dlock.WithAutoRenew(false)))

	other := dlock.New(etcdlock.New(srv.Client(t)))
	defer other.Close()
	// "left" must become free on the store: its TTL (1s) rounded to the
	// lease (2s), plus etcd's expiry check (up to 0.5s), plus a retired
	// lease's remaining life.
	deadline := time.Now().Add(6 * time.Second)
	for {
		l, err := other.Mutex("left").TryLock(t.Context())
		if err == nil {
			if l.Fence() <= left.Fence() {
				t.Errorf("fence %d after %d", l.Fence(), left.Fence())
			}
			_ = l.Unlock(t.Context())
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lock without renewal still held on the store after 6s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := left.Err(); err == nil {
		t.Error("the unrenewed lease is still shown as held")
	}
	if err := kept.Err(); err != nil {
		t.Fatalf("the renewed lock was lost: %v", err)
	}
	if _, err := other.Mutex("kept").TryLock(t.Context()); err == nil {
		t.Fatal("the renewed lock is free on the store")
	}
	info, ok, err := b.Inspect(t.Context(), "kept")
	if err != nil || !ok || info.Fence != kept.Fence() {
		t.Errorf("Inspect(kept) = %+v, %v, %v; want fence %d", info, ok, err, kept.Fence())
	}
	if err := kept.Unlock(t.Context()); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
}

func lockNow(t *testing.T, m *dlock.Mutex) *dlock.Lease {
	t.Helper()
	l, err := m.TryLock(t.Context())
	if err != nil {
		t.Fatalf("TryLock(%q): %v", m.Name(), err)
	}
	return l
}

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

// flakyKV loses the answer of the transaction that grants "orphan" (the
// server commits it; the client sees a broken connection) and, while down
// is set, fails every transaction on "orphan" without sending it.
type flakyKV struct {
	clientv3.KV
	loseGrant, down *atomic.Bool
}

func (k flakyKV) Txn(ctx context.Context) clientv3.Txn {
	return &flakyTxn{Txn: k.KV.Txn(ctx), kv: k}
}

type flakyTxn struct {
	clientv3.Txn
	kv  flakyKV
	ops []clientv3.Op
}

func (t *flakyTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.Txn = t.Txn.If(cs...); return t }
func (t *flakyTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.ops = append(t.ops, ops...)
	t.Txn = t.Txn.Then(ops...)
	return t
}
func (t *flakyTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.ops = append(t.ops, ops...)
	t.Txn = t.Txn.Else(ops...)
	return t
}

var errConnLost = errors.New("simulated: connection lost")

func (t *flakyTxn) Commit() (*clientv3.TxnResponse, error) {
	orphan, grant := false, false
	for _, op := range t.ops {
		k := string(op.KeyBytes())
		if strings.HasPrefix(k, "dlock/orphan\x00") {
			orphan = true
			if op.IsPut() && k == "dlock/orphan\x00e" {
				grant = true
			}
		}
	}
	if orphan && t.kv.down.Load() {
		return nil, errConnLost
	}
	resp, err := t.Txn.Commit()
	if err == nil && grant && t.kv.loseGrant.CompareAndSwap(true, false) {
		t.kv.down.Store(true) // the network stays down for the clean-up
		return nil, errConnLost
	}
	return resp, err
}

// An acquire whose answer is lost (the server granted it) and whose
// clean-up release fails too leaves a grant on the Backend's shared lease.
// The client's warning says "the lock expires after its TTL", and it would
// on a lease of its own; but the shared lease is kept alive for the
// Backend's other locks. The Backend must count the grant of unknown
// outcome as abandoned after its TTL, as it does an unrenewed lock, and
// retire the lease, or the orphan never expires while the process lives.
func TestOrphanGrantOnSharedLeaseExpires(t *testing.T) {
	srv := testserver.StartEtcd(t)
	_, keep := makeOrphan(t, srv, true)

	// TTL 1s on a lease of 2s: free on the store within ~3s of the grant.
	if freeWithin(t, srv, "orphan", 8*time.Second) {
		return
	}
	info, _, _ := etcdlock.New(srv.Client(t)).Inspect(t.Context(), "orphan")
	t.Fatalf("the orphaned grant of a 1s TTL is still held after ~9.5s (%+v); keep err=%v", info, keep.Err())
}

// The same without any failed release: a reentrant handle does not release
// after an acquire of unknown outcome (its token may hold the lock for
// another goroutine), counting on the grant to "lapse after its TTL"
// (handle.unknownOutcome). On etcd the grant sits on the shared lease,
// which the Backend's other locks keep alive: it must lapse all the same.
func TestReentrantUnknownOutcomeLapses(t *testing.T) {
	testUnknownOutcomeLapses(t, dlock.Reentrant())
}

// The same for a fair lock, whose grant is a transaction of its own.
func TestReentrantFairUnknownOutcomeLapses(t *testing.T) {
	testUnknownOutcomeLapses(t, dlock.Reentrant(), dlock.Fair())
}

func testUnknownOutcomeLapses(t *testing.T, opts ...dlock.Option) {
	srv := testserver.StartEtcd(t)
	_, keep := makeOrphan(t, srv, false, opts...) // the network is back at once

	if freeWithin(t, srv, "orphan", 8*time.Second) {
		return
	}
	t.Fatalf("the reentrant handle's grant of unknown outcome (TTL 1s) is still held after 8s; keep err=%v", keep.Err())
}

// makeOrphan makes a Client of TTL 1s on srv (closed at the test's end)
// that holds "keep" and whose TryLock of "orphan" (with opts) is granted on
// the store while its answer is lost. With failClean, the network stays
// down for that Client's transactions on "orphan" for 1.5s, so that its
// clean-up release (bounded by the TTL) fails too.
func makeOrphan(t *testing.T, srv *testserver.Etcd, failClean bool, opts ...dlock.Option) (*dlock.Client, *dlock.Lease) {
	t.Helper()
	cli := srv.Client(t)
	var loseGrant, down atomic.Bool
	cli.KV = flakyKV{cli.KV, &loseGrant, &down}
	c := dlock.New(etcdlock.New(cli), dlock.WithTTL(time.Second))
	t.Cleanup(func() { _ = c.Close() })
	keep, err := c.Mutex("keep").TryLock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = keep.Unlock(context.Background()) })
	loseGrant.Store(true)
	if _, err := c.Mutex("orphan", opts...).TryLock(t.Context()); err == nil {
		t.Fatal("TryLock succeeded despite the lost answer")
	} else {
		t.Logf("TryLock: %v", err)
	}
	if failClean {
		time.Sleep(1500 * time.Millisecond)
	}
	down.Store(false)
	return c, keep
}

// freeWithin reports whether another Client on srv can lock name (and
// unlocks it) within d, trying every 100ms.
func freeWithin(t *testing.T, srv *testserver.Etcd, name string, d time.Duration) bool {
	t.Helper()
	other := dlock.New(etcdlock.New(srv.Client(t)))
	defer other.Close()
	for until := time.Now().Add(d); time.Now().Before(until); time.Sleep(100 * time.Millisecond) {
		if l, err := other.Mutex(name).TryLock(t.Context()); err == nil {
			_ = l.Unlock(t.Context())
			return true
		}
	}
	return false
}

// A lock left unrenewed (WithAutoRenew(false)) past its TTL retires the
// shared lease at the next acquire that needs the lease extended. That
// acquire must get a fresh lease, not fail with the retirement ("lease
// retired") as a store error.
func TestAcquireWhenLeaseRetires(t *testing.T) {
	srv := testserver.StartEtcd(t)
	c := dlock.New(etcdlock.New(srv.Client(t)), dlock.WithTTL(time.Second))
	defer c.Close()
	left, err := c.Mutex("left", dlock.WithAutoRenew(false)).TryLock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer left.Unlock(t.Context())
	time.Sleep(1300 * time.Millisecond) // past left's TTL, within the lease's 2s
	l, err := c.Mutex("x").TryLock(t.Context())
	if err != nil {
		t.Fatalf("TryLock of a free lock failed: %v", err)
	}
	_ = l.Unlock(t.Context())
}

// churnUntil restarts the single member about every second, runs busy on
// the Backend between restarts (as a working process would), and returns
// how long it took gone() to report true, or false after bound.
func churnUntil(t *testing.T, srv *testserver.Etcd, b *etcdlock.Backend, bound time.Duration, gone func() bool) (time.Duration, bool) {
	t.Helper()
	start := time.Now()
	for time.Since(start) < bound {
		srv.Kill(t, 0)
		srv.Start(t, 0)
		for range 8 {
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			tok := "t" + time.Now().String()
			if res, err := b.Acquire(ctx, driver.AcquireRequest{Key: "busy", Token: tok, TTL: time.Second}); err == nil && res.Acquired {
				_, _ = b.Release(ctx, "busy", tok)
			}
			cancel()
			if gone() {
				return time.Since(start), true
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return time.Since(start), false
}

// A hold that is renewed on a lease that is already retired stays tracked
// on it (RenewBatch tracks before it extends: here the retired lease still
// covers the renewal, so nothing moves; a failed move leaves it the same
// way). When its holder then stops (WithAutoRenew(false), or renewals that
// fail past its deadline and a failed clean-up), the hold is past its
// deadline, but revokeIdle looks for abandoned holds only on leases that
// are not retired yet: the retired lease keeps a hold forever, is never
// revoked, and under leader changes the key on it never goes.
func TestAbandonedHoldOnRetiredLeaseGoes(t *testing.T) {
	srv := testserver.StartEtcd(t)
	b := etcdlock.New(srv.Client(t))
	revoked := etcdlock.ReportRevokes(b)
	admin := srv.Client(t)
	const ttl = 500 * time.Millisecond // bucket 1s, leases of 2s
	for _, k := range []string{"gone", "stuck"} {
		if res, err := b.Acquire(t.Context(), driver.AcquireRequest{Key: k, Token: k, Owner: k, TTL: ttl}); err != nil || !res.Acquired {
			t.Fatalf("acquire %s: %+v, %v", k, res, err)
		}
	}
	entry, err := admin.Get(t.Context(), "dlock/stuck\x00e")
	if err != nil || len(entry.Kvs) != 1 {
		t.Fatalf("stuck's key: %v, %v", entry, err)
	}
	lid := clientv3.LeaseID(entry.Kvs[0].Lease)
	// "gone" is never renewed: past its deadline, the next call's scan
	// retires the shared lease.
	time.Sleep(ttl + 300*time.Millisecond)
	if res, err := b.Acquire(t.Context(), driver.AcquireRequest{Key: "x", Token: "x", TTL: ttl}); err != nil || !res.Acquired {
		t.Fatalf("acquire x: %+v, %v", res, err)
	}
	if _, err := b.Release(t.Context(), "x", "x"); err != nil {
		t.Fatal(err)
	}
	// "stuck" is renewed once on the retired lease (which still covers
	// it), then its holder stops without releasing.
	r := b.RenewBatch(t.Context(), []driver.RenewRequest{{Key: "stuck", Token: "stuck", TTL: ttl}})
	if !r[0].Held || r[0].Err != nil {
		t.Fatalf("renew stuck: %+v", r[0])
	}
	if _, err := b.Release(t.Context(), "gone", "gone"); err != nil {
		t.Fatal(err)
	}
	held := func() bool {
		g, err := admin.Get(t.Context(), "dlock/stuck\x00e")
		return err == nil && len(g.Kvs) == 1
	}
	took, ok := churnUntil(t, srv, b, 12*time.Second, func() bool { return !held() })
	etcdlock.WaitRevokes(b)
	var ids []clientv3.LeaseID
	for len(revoked) > 0 {
		ids = append(ids, <-revoked)
	}
	if !ok {
		t.Fatalf("the abandoned hold on retired lease %x (TTL %v) is still held %v later with the member restarted every second; revoked: %x", lid, ttl, took.Round(time.Second), ids)
	}
	t.Logf("gone after %v; revoked %x", took.Round(100*time.Millisecond), ids)
}

// A handed grant on the Backend's current queue lease: the Backend queues
// nowhere else afterwards, so the lease is never superseded, and only
// superseded queue leases are revoked. Under leader changes the grant that
// the head never claimed stays.
func TestHandedGrantOnCurrentQueueLeaseGoes(t *testing.T) {
	srv := testserver.StartEtcd(t)
	const qttl = 3 * time.Second
	hb, _ := hoHolder(t, srv, "k")
	b := etcdlock.New(srv.Client(t))
	sent := time.Now()
	hoHead(t, b, "k", "head", qttl)
	if _, err := hb.Release(t.Context(), "k", "holder"); err != nil {
		t.Fatal(err)
	}
	if info, ok := hoInspect(t, b, "k"); !ok || info.Owner != "head head" {
		t.Fatalf("after the release: %+v (held %v); want handed to the head", info, ok)
	}
	took, ok := churnUntil(t, srv, b, 12*time.Second, func() bool {
		_, ok := hoInspect(t, b, "k")
		return !ok
	})
	etcdlock.WaitRevokes(b)
	if !ok {
		t.Fatalf("the grant handed to a head that never claimed it is still held %v later, with the member restarted every second", took.Round(time.Second))
	}
	if gone := time.Since(sent); gone < qttl {
		t.Fatalf("the handed grant went %v after the head's request, before its QueueTTL (%v)", gone, qttl)
	}
	t.Logf("gone after %v", took.Round(100*time.Millisecond))
}

// delayKV delays, once armed, the next transaction that puts key.
type delayKV struct {
	clientv3.KV
	key   string
	armed *atomic.Bool
	delay time.Duration
}

func (k delayKV) Txn(ctx context.Context) clientv3.Txn {
	return &delayTxn{Txn: k.KV.Txn(ctx), kv: k}
}

type delayTxn struct {
	clientv3.Txn
	kv  delayKV
	put bool
}

func (t *delayTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.Txn = t.Txn.If(cs...); return t }
func (t *delayTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	for _, op := range ops {
		if op.IsPut() && string(op.KeyBytes()) == t.kv.key {
			t.put = true
		}
	}
	t.Txn = t.Txn.Then(ops...)
	return t
}
func (t *delayTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }
func (t *delayTxn) Commit() (*clientv3.TxnResponse, error) {
	if t.put && t.kv.armed.CompareAndSwap(true, false) {
		time.Sleep(t.kv.delay) // as a txn queued behind an election
	}
	return t.Txn.Commit()
}

// Two Backends share a token (an owner ID shared by processes). B renews
// the grant, which is on A's lease: it moves it to a lease of its own,
// taken (forTTL) before the move's transaction, which is slow. A renews
// the grant meanwhile, on its own lease (its read comes before the move),
// and counts on it until its send time + TTL. The move then puts the key
// on B's lease, which lives only TTL (+ slack) past B's forTTL call; B's
// holder stops; B retires and revokes that lease at its expiry, before A's
// renewal runs out: a third Backend takes the lock while A holds it.
func TestForeignMoveCoversOtherHolder(t *testing.T) {
	srv := testserver.StartEtcd(t)
	const ttl = time.Second // leases of 2s
	a := etcdlock.New(srv.Client(t))
	cliB := srv.Client(t)
	var armed atomic.Bool
	cliB.KV = delayKV{cliB.KV, "dlock/k\x00e", &armed, 1500 * time.Millisecond}
	b := etcdlock.New(cliB)
	c := etcdlock.New(srv.Client(t))
	req := driver.AcquireRequest{Key: "k", Token: "shared", Owner: "o", TTL: ttl}
	if res, err := a.Acquire(t.Context(), req); err != nil || !res.Acquired {
		t.Fatalf("A: %+v, %v", res, err)
	}
	armed.Store(true)
	bDone := make(chan driver.RenewResult, 1)
	go func() {
		bDone <- b.RenewBatch(t.Context(), []driver.RenewRequest{{Key: "k", Token: "shared", TTL: ttl}})[0]
	}()
	time.Sleep(1300 * time.Millisecond) // B's move is on its way
	sentA := time.Now()
	if r := a.RenewBatch(t.Context(), []driver.RenewRequest{{Key: "k", Token: "shared", TTL: ttl}})[0]; !r.Held || r.Err != nil {
		t.Fatalf("A's renewal: %+v", r)
	}
	if r := <-bDone; !r.Held || r.Err != nil {
		t.Fatalf("B's renewal: %+v", r)
	}
	// B's holder stops; B goes on working.
	for time.Since(sentA) < ttl {
		tok := "x" + time.Now().String()
		if res, err := b.Acquire(t.Context(), driver.AcquireRequest{Key: "x", Token: tok, TTL: ttl}); err == nil && res.Acquired {
			_, _ = b.Release(t.Context(), "x", tok)
		}
		if res, err := c.Acquire(t.Context(), driver.AcquireRequest{Key: "k", Token: "c", Owner: "c", TTL: ttl}); err == nil && res.Acquired {
			etcdlock.WaitRevokes(b)
			t.Fatalf("C acquired k %v after A's renewal of %v was sent (A counts on it until then + TTL): two holders", time.Since(sentA).Round(time.Millisecond), ttl)
		}
		time.Sleep(20 * time.Millisecond)
	}
	etcdlock.WaitRevokes(b)
}

// A queue entry lives at least QueueTTL past the send time of its owner's
// last request, and not much longer. A handed grant lives on the head's
// entry lease, and the client trusts it until S + QueueTTL − drift −
// margin, S being the send time of the head's last request answered with
// the entry: the lease must not expire on the server before S + QueueTTL,
// for every S. Entries are kept alive through their lease (one keep-alive
// per request, shared by the entries on it), so a lease may outlive the
// first request written on it; but once its waiter stops asking, nothing
// keeps it: it goes within its granted TTL (the entry's TTL rounded up +
// 1 s, 4 s here: the bound ETCD.md gives for a head that died) of the last
// request, give or take etcd's expiry sweep (every 500 ms, later on a
// loaded machine). A waiter refreshes its entry every 100 ms for 2.5 s
// (plain default QueueTTL 3 s), and each lease's expiry on the server is
// compared with the last request written on it.
func TestQueueLeaseOutlivesLastRequestPlusQueueTTL(t *testing.T) {
	srv := testserver.StartEtcd(t)
	const qttl = 3 * time.Second
	hoHolder(t, srv, "k")
	b := etcdlock.New(srv.Client(t))
	cli := srv.Client(t)
	last := map[clientv3.LeaseID]time.Time{} // lease → send time of the last request on it
	granted := map[clientv3.LeaseID]time.Duration{}
	for end := time.Now().Add(2500 * time.Millisecond); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		s := time.Now()
		hoHead(t, b, "k", "head", qttl)
		resp, err := cli.Get(t.Context(), "dlock/k\x00q\x00head")
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("queue entry: %v, %v", resp, err)
		}
		id := clientv3.LeaseID(resp.Kvs[0].Lease)
		last[id] = s
		if _, ok := granted[id]; !ok {
			r, err := cli.TimeToLive(t.Context(), id)
			if err != nil {
				t.Fatal(err)
			}
			granted[id] = time.Duration(r.GrantedTTL) * time.Second
		}
	}
	t.Logf("%d queue leases", len(last))
	gone := map[clientv3.LeaseID]time.Time{}
	for deadline := time.Now().Add(8 * time.Second); len(gone) < len(last) && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for id := range last {
			if _, ok := gone[id]; ok {
				continue
			}
			r, err := cli.TimeToLive(t.Context(), id)
			if err != nil {
				t.Fatal(err)
			}
			if r.TTL < 0 {
				gone[id] = time.Now()
			}
		}
	}
	for id, s := range last {
		g, ok := gone[id]
		if !ok {
			t.Errorf("lease %x still alive 8 s after its last request", id)
			continue
		}
		lived := g.Sub(s)
		t.Logf("lease %x (granted %v): gone %v after its last request", id, granted[id], lived.Round(time.Millisecond))
		if lived < qttl {
			t.Errorf("queue lease %x expired %v after the last request written on it, before S + QueueTTL (%v): a handed grant on it is trusted longer than it lives", id, lived.Round(time.Millisecond), qttl)
		}
		if most := 4 * time.Second; granted[id] > most {
			t.Errorf("queue lease %x was granted for %v, more than the entry's TTL rounded up + 1 s (%v): a dead head would hold a handed grant on it longer than documented", id, granted[id], most)
		}
		if most := granted[id] + 1500*time.Millisecond; lived > most {
			t.Errorf("queue lease %x lived %v after the last request written on it, more than its granted TTL and slack (%v): something kept it alive", id, lived.Round(time.Millisecond), most)
		}
	}
}

// A process holds "k" with owner ID X on a lease of 1s (living 2s), then
// dies. A second process with the same owner ID re-enters with a TTL of
// 10s: its lease's deadline is 10s away. The key must not stay on the dead
// process's 2s lease (a keep-alive of that lease extends it by 2s only, and
// the key would expire long before the second holder's deadline, letting a
// third process in while the second still believes it holds the lock): the
// re-entry moves it onto a lease of the second process's.
func TestReentryOnForeignLeaseKeepsItsTTL(t *testing.T) {
	srv := testserver.StartEtcd(t)
	dead := etcdlock.New(srv.Client(t))
	if res, err := dead.Acquire(t.Context(), driver.AcquireRequest{Key: "k", Token: "X", Owner: "dead", TTL: time.Second, Reentrant: true}); err != nil || !res.Acquired {
		t.Fatalf("Acquire: %+v, %v", res, err)
	}
	// The process dies: no renewal, no release.

	b := dlock.New(etcdlock.New(srv.Client(t)))
	defer b.Close()
	lb, err := b.Mutex("k", dlock.WithOwnerID("X"), dlock.Reentrant(), dlock.WithTTL(10*time.Second)).TryLock(t.Context())
	if err != nil {
		t.Fatalf("re-entry: %v", err)
	}
	defer lb.Unlock(t.Context())
	t.Logf("re-entered: fence %d, deadline in %v", lb.Fence(), time.Until(lb.Deadline()).Round(time.Millisecond))

	c := dlock.New(etcdlock.New(srv.Client(t)))
	defer c.Close()
	until := time.Now().Add(6 * time.Second)
	for time.Now().Before(until) {
		lc, err := c.Mutex("k", dlock.WithTTL(time.Second)).TryLock(t.Context())
		if err == nil {
			held := lb.Err() == nil
			left := time.Until(lb.Deadline())
			_ = lc.Unlock(t.Context())
			if held {
				t.Fatalf("two holders: a third process got fence %d while the re-entered lease (fence %d) is held, %v before its deadline",
					lc.Fence(), lb.Fence(), left.Round(time.Millisecond))
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A process that dies leaves two grants on its shared lease: "k" with
// owner ID X and "other". Another process holds "k" with the same owner
// ID; it must not keep the dead process's lease alive for it, or "other",
// which nobody holds any more, would never expire.
func TestForeignLeaseNotKeptAlive(t *testing.T) {
	srv := testserver.StartEtcd(t)
	dead := etcdlock.New(srv.Client(t))
	for _, r := range []driver.AcquireRequest{
		{Key: "k", Token: "X", Owner: "dead", TTL: time.Second, Reentrant: true},
		{Key: "other", Token: "o", Owner: "dead", TTL: time.Second},
	} {
		if res, err := dead.Acquire(t.Context(), r); err != nil || !res.Acquired {
			t.Fatalf("Acquire %s: %+v, %v", r.Key, res, err)
		}
	}

	b := dlock.New(etcdlock.New(srv.Client(t)))
	defer b.Close()
	lb, err := b.Mutex("k", dlock.WithOwnerID("X"), dlock.Reentrant(), dlock.WithTTL(time.Second)).TryLock(t.Context())
	if err != nil {
		t.Fatalf("re-entry: %v", err)
	}
	defer lb.Unlock(t.Context())

	c := dlock.New(etcdlock.New(srv.Client(t)))
	defer c.Close()
	// "other" was granted for 1s on a lease of 2s: free within ~3s.
	until := time.Now().Add(8 * time.Second)
	for time.Now().Before(until) {
		if l, err := c.Mutex("other").TryLock(t.Context()); err == nil {
			_ = l.Unlock(t.Context())
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("\"other\", abandoned by a dead process with a 1s TTL, is still held after 8s (lease kept alive by another Backend's renewal of \"k\"); lb err=%v", lb.Err())
}

// A renewal that finds its grant on another Backend's lease (the owner ID
// shared with another process) moves it onto a lease of its own, and that
// lease must cover the other holder's TTL as well as the renewal's: the
// other process's holder counts on its own TTL until its next renewal, and
// the key must not expire before then. For an exclusive grant and for a
// shared hold.
func TestForeignGrantMovesToLeaseOfLongestTTL(t *testing.T) {
	srv := testserver.StartEtcd(t)
	admin := srv.Client(t)
	a := etcdlock.New(srv.Client(t))
	b := etcdlock.New(srv.Client(t))
	for _, tc := range []struct {
		mode driver.Mode
		key  string
	}{
		{driver.Exclusive, "dlock/e\x00e"},
		{driver.Shared, "dlock/s\x00s\x00X"},
	} {
		name := tc.key[len("dlock/") : len("dlock/")+1]
		if res, err := a.Acquire(t.Context(), driver.AcquireRequest{Key: name, Token: "X", Owner: "a", TTL: 6 * time.Second, Mode: tc.mode, Reentrant: true}); err != nil || !res.Acquired {
			t.Fatalf("Acquire %s: %+v, %v", name, res, err)
		}
		before, err := admin.Get(t.Context(), tc.key)
		if err != nil || len(before.Kvs) != 1 {
			t.Fatalf("Get %q: %v, %v", tc.key, before, err)
		}
		if held, err := b.Renew(t.Context(), name, "X", time.Second); err != nil || !held {
			t.Fatalf("Renew %s from the other Backend: %v, %v", name, held, err)
		}
		after, err := admin.Get(t.Context(), tc.key)
		if err != nil || len(after.Kvs) != 1 {
			t.Fatalf("Get %q after the renewal: %v, %v", tc.key, after, err)
		}
		kv := after.Kvs[0]
		if kv.Lease == before.Kvs[0].Lease {
			t.Errorf("%s: still on the other Backend's lease after the renewal", name)
		}
		if kv.CreateRevision != before.Kvs[0].CreateRevision {
			t.Errorf("%s: create revision (fence) %d, was %d", name, kv.CreateRevision, before.Kvs[0].CreateRevision)
		}
		ttl, err := admin.TimeToLive(t.Context(), clientv3.LeaseID(kv.Lease))
		if err != nil {
			t.Fatal(err)
		}
		if ttl.TTL < 6 {
			t.Errorf("%s: moved to a lease with %ds left (granted %ds), less than the other holder's TTL of 6s", name, ttl.TTL, ttl.GrantedTTL)
		}
	}
}

// A queued waiter's request keeps its entry's lease alive even when the
// member answers keep-alives more slowly than the lease's slack over
// QueueTTL (1 s): the request sends a bounded number of keep-alives and the
// entry stays on its lease. Each answer used to find the lease short of
// "now + QueueTTL" again and send another, until the entry's own deadline
// passed and retired the lease, whose entries were then all written again.
func TestEntriesLeaseFromSlowMember(t *testing.T) {
	srv := testserver.StartEtcd(t)
	const qttl = 5 * time.Second // Fair()'s: an entries lease of 6 s
	hoHolder(t, srv, "k")
	// A call timeout of 6 s lets one call take up to 1 s.
	b := etcdlock.New(srv.Client(t), etcdlock.WithTimeout(6*time.Second))
	keepAlives := etcdlock.SlowKeepAlives(b, 600*time.Millisecond)
	req := hoHead(t, b, "k", "head", qttl) // grants the entries lease
	cli := srv.Client(t)
	entryLease := func() int64 {
		resp, err := cli.Get(t.Context(), "dlock/k\x00q\x00head")
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("queue entry: %v, %v", resp, err)
		}
		return resp.Kvs[0].Lease
	}
	first := entryLease()
	time.Sleep(qttl / 3) // the next refresh: the lease no longer covers now + QueueTTL
	start, before := time.Now(), keepAlives.Load()
	res, err := b.Acquire(t.Context(), req)
	sent := keepAlives.Load() - before
	t.Logf("a request with keep-alives of 1.2 s: %v, %d keep-alives", time.Since(start).Round(time.Millisecond), sent)
	if err != nil || !res.Queued {
		t.Fatalf("a queued waiter's request with keep-alives of 1.2 s: %+v, %v (%d keep-alives sent)", res, err, sent)
	}
	if sent > 2 {
		t.Errorf("%d keep-alives for one request, want at most 2", sent)
	}
	if now := entryLease(); now != first {
		t.Errorf("the entry moved from lease %x to %x: its lease was retired and every entry on it written again", first, now)
	}
}

// frozenFirstGrant is a Lease whose first grant goes to a frozen member:
// it is answered by nothing until its ctx ends. Every later grant goes to
// a healthy one.
type frozenFirstGrant struct {
	clientv3.Lease
	calls  atomic.Int64
	frozen chan struct{} // closed once the first grant hangs
}

func (l *frozenFirstGrant) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	if l.calls.Add(1) == 1 {
		close(l.frozen)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return l.Lease.Grant(ctx, ttl)
}

// A call that may not wait (a TryLock, a renewal that moves a grant to a
// lease of its TTL) does not wait out a waiting call's lease grant that
// hangs on a frozen member, which lasts the whole call timeout: after one
// attempt it grants a lease itself, which the next member answers.
func TestFrozenGrantOfWaitingCallDoesNotHoldUpOthers(t *testing.T) {
	srv := testserver.StartEtcd(t)
	cli := srv.Client(t)
	fl := &frozenFirstGrant{Lease: cli.Lease, frozen: make(chan struct{})}
	cli.Lease = fl
	b := etcdlock.New(cli) // call timeout 3 s, one attempt 500 ms
	waited := make(chan error, 1)
	go func() {
		_, err := b.Acquire(t.Context(), driver.AcquireRequest{Key: "w", Token: "tw", Owner: "o", TTL: 5 * time.Second, Wait: true})
		waited <- err
	}()
	<-fl.frozen
	// Well within the waiting call's 3 s, and four attempts long.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	res, err := b.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "t", Owner: "o", TTL: 5 * time.Second})
	if err != nil || !res.Acquired {
		t.Errorf("try-acquire of the same TTL while a waiting call's grant hangs on a frozen member: %+v, %v", res, err)
	}
	<-waited
}
