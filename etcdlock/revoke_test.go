package etcdlock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/testserver"
)

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
