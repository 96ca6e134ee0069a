package etcdlock

import (
	"context"

	"github.com/dlock-go/dlock/driver"
	clientv3 "go.etcd.io/etcd/client/v3"
)

var _ driver.Proclaimer = (*Backend)(nil)

// Proclaim implements driver.Proclaimer, as etcd's own Election.Proclaim
// does: it reads the exclusive holder's key and, when token holds it with
// the grant of req.Fence and no proclaim of req.Seq or later was applied,
// rewrites its value with the new owner, on the same lease, in a
// transaction that compares the key's mod revision (read again when
// another write came between). A grant whose lease has expired has no key.
func (b *Backend) Proclaim(ctx context.Context, req driver.ProclaimRequest) (bool, error) {
	caller := ctx
	ctx, cancel := b.bound(ctx)
	defer cancel()
	ek := b.exclKey(req.Key)
	for {
		resp, err := b.read(ctx, nil, []clientv3.Op{clientv3.OpGet(ek)}, nil)
		if err != nil {
			return false, wrapCtx(caller, err)
		}
		kvs := rangeKVs(resp, 0)
		if len(kvs) != 1 {
			return false, nil
		}
		kv := kvs[0]
		e := decodeExclusive(kv.Value)
		fence := fenceOf(kv)
		switch {
		case e.token != req.Token || (req.Fence != 0 && fence != int64(req.Fence)):
			return false, nil
		case e.seq >= req.Seq:
			return true, nil // a later proclaim was applied: this one is late
		}
		e = e.rewritten(kv)
		e.owner, e.seq = req.Owner, req.Seq
		put, err := b.txn(ctx,
			[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(ek), "=", kv.ModRevision)},
			[]clientv3.Op{clientv3.OpPut(ek, e.encode(), clientv3.WithLease(clientv3.LeaseID(kv.Lease)))}, nil)
		if err != nil {
			return false, wrapCtx(caller, err)
		}
		if put.Succeeded {
			// A release's fast path compares the mod revision of the
			// Backend's last write of the key: this one.
			if h, ok := b.leases.tracked(ek, req.Token); ok && h.modRev == kv.ModRevision && h.fence == fence {
				b.leases.track(h.lease, ek, req.Token, h.fence, put.Header.Revision, h.count, h.ttl, h.deadline)
			}
			return true, nil
		}
	}
}
