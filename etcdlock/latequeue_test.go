package etcdlock_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/testserver"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// lateKV delivers the puts of fair queue entries late: the request has
// left the client when its ctx ends, and the server runs it afterwards
// (what a cancelled gRPC call may do).
type lateKV struct {
	clientv3.KV
	wg *sync.WaitGroup
}

func (k lateKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	if !strings.Contains(key, "\x00q\x00") {
		return k.KV.Put(ctx, key, val, opts...)
	}
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		time.Sleep(400 * time.Millisecond)
		_, _ = k.KV.Put(context.Background(), key, val, opts...)
	}()
	<-ctx.Done()
	return nil, ctx.Err()
}

// Txn delivers late, in the same way, a transaction that writes a fair
// queue entry (the backend writes entries in a transaction that checks the
// token has not left since).
func (k lateKV) Txn(ctx context.Context) clientv3.Txn {
	return &lateTxn{ctx: ctx, kv: k}
}

type lateTxn struct {
	ctx       context.Context
	kv        lateKV
	cmps      []clientv3.Cmp
	then, els []clientv3.Op
}

func (t *lateTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.cmps = append(t.cmps, cs...); return t }
func (t *lateTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.then = append(t.then, ops...); return t }
func (t *lateTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.els = append(t.els, ops...); return t }

func (t *lateTxn) Commit() (*clientv3.TxnResponse, error) {
	queue := false
	for _, op := range append(append([]clientv3.Op(nil), t.then...), t.els...) {
		if op.IsPut() && strings.Contains(string(op.KeyBytes()), "\x00q\x00") {
			queue = true
		}
	}
	if !queue {
		return t.kv.KV.Txn(t.ctx).If(t.cmps...).Then(t.then...).Else(t.els...).Commit()
	}
	t.kv.wg.Add(1)
	go func() {
		defer t.kv.wg.Done()
		time.Sleep(400 * time.Millisecond)
		_, _ = t.kv.KV.Txn(context.Background()).If(t.cmps...).Then(t.then...).Else(t.els...).Commit()
	}()
	<-t.ctx.Done()
	return nil, t.ctx.Err()
}

// A fair waiter gives up while its queue entry is on its way; the server
// writes the entry after the client's clean-up (a release that records the
// token as released). The entry then heads the queue of a lock that nobody
// waits for under that token, and no fair waiter gets the free lock until
// the entry's lease runs out (up to QueueTTL rounded up + 1s, 6s here), unless the
// entry's write is refused: the release record must refuse the token's
// late queue entries as it refuses its grants.
func TestCancelledFairWaiterLateQueueEntryRefused(t *testing.T) {
	srv := testserver.StartEtcd(t)
	holder := dlock.New(etcdlock.New(srv.Client(t)))
	defer holder.Close()
	lh, err := holder.Mutex("k", dlock.Fair()).TryLock(t.Context())
	if err != nil {
		t.Fatal(err)
	}

	var late sync.WaitGroup
	cli := srv.Client(t)
	cli.KV = lateKV{cli.KV, &late}
	w := dlock.New(etcdlock.New(cli))
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	_, err = w.Mutex("k", dlock.Fair(), dlock.WithTTL(10*time.Second)).Lock(ctx)
	cancel()
	if err == nil {
		t.Fatal("the waiter got the lock")
	}
	late.Wait()
	w.Close()

	if err := lh.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	next := dlock.New(etcdlock.New(srv.Client(t)))
	defer next.Close()
	start := time.Now()
	l, err := next.Mutex("k", dlock.Fair(), dlock.WithWait(3*time.Second)).Lock(t.Context())
	if err != nil {
		n, _ := srv.Client(t).Get(t.Context(), "dlock/k\x00q\x00", clientv3.WithPrefix(), clientv3.WithCountOnly())
		t.Fatalf("free fair lock not granted within 3s (%v): %v; queue entries on the store: %d", time.Since(start).Round(time.Millisecond), err, n.Count)
	}
	_ = l.Unlock(t.Context())
}
