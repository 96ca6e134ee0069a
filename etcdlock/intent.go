// Passing a waiting writer's intent to its next token (driver.IntentMover).

package etcdlock

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/driver"
)

var _ driver.IntentMover = (*Backend)(nil)

// MoveIntent implements driver.IntentMover: a read of the holder and the
// intents, then one transaction, unless either changed since the read,
// that deletes from's intent and puts to's on a queue lease of ttl (tried
// again, up to three times, after such a change). A token whose release or
// withdrawal is recorded gets none (see notLeftSince).
func (b *Backend) MoveIntent(ctx context.Context, key, from, to, owner string, ttl time.Duration) (bool, error) {
	ctx, cancel := b.bound(ctx)
	defer cancel()
	ek, ip := b.exclKey(key), b.intentPrefix(key)
	for range 3 {
		read, err := b.read(ctx, nil, []clientv3.Op{clientv3.OpGet(ek), clientv3.OpGet(ip, clientv3.WithPrefix())}, nil)
		if err != nil {
			return false, wrapCtx(ctx, err)
		}
		rev := read.Header.Revision
		excl, intents := rangeKVs(read, 0), rangeKVs(read, 1)
		ok := len(intents) > 0
		for _, kv := range intents {
			_, _, token, _ := b.parseKey(string(kv.Key))
			ok = ok && (token == from || token == to)
		}
		if len(intents) == 0 {
			ok = len(excl) == 1 && decodeExclusive(excl[0].Value).token == from
		}
		if !ok {
			return false, nil
		}
		qid, err := b.leases.forQueue(ctx, ttl)
		if err != nil {
			return false, wrapCtx(ctx, err)
		}
		put, err := b.txn(ctx,
			append(b.notLeftSince(key, to, rev),
				clientv3.Compare(clientv3.ModRevision(ek), "<", rev+1),
				clientv3.Compare(clientv3.ModRevision(ip), "<", rev+1).WithPrefix()),
			[]clientv3.Op{
				clientv3.OpDelete(b.intentKey(key, from)),
				clientv3.OpPut(b.intentKey(key, to), owner, clientv3.WithLease(qid)),
			}, nil)
		if err != nil {
			return false, wrapCtx(ctx, err)
		}
		if put.Succeeded {
			return true, nil
		}
	}
	return false, nil
}
