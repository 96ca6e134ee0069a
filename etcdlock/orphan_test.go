package etcdlock_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/testserver"
	clientv3 "go.etcd.io/etcd/client/v3"
)

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
