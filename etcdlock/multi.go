// AcquireAll: the exclusive locks of several keys in one transaction
// (driver.MultiAcquirer).

package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock/driver"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

var _ driver.MultiAcquirer = (*Backend)(nil)

// opsPerName is the number of compares, and of reads when refused, that
// AcquireAll's transaction makes per name: etcd refuses a transaction
// with more of either than its --max-txn-ops.
const opsPerName = 3

// AcquireAll implements driver.MultiAcquirer: one transaction compares
// every key (no exclusive grant, no shared hold, no release record of the
// token) and puts every grant on one lease, or changes nothing. The
// grants share the transaction's revision as their fence. A copy of the
// request that lands after the client released the token on the keys
// finds the release records and grants nothing, as Acquire does. More
// names than a third of the server's --max-txn-ops (42 by default) are
// refused with an error wrapping driver.ErrInvalid.
func (b *Backend) AcquireAll(ctx context.Context, reqs []driver.AcquireRequest) ([]driver.AcquireResult, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	if b.nsErr != nil {
		return nil, wrap(b.nsErr)
	}
	for _, r := range reqs {
		if r.Mode != driver.Exclusive || r.Reentrant || r.Fair || r.Wait || r.LockDelay > 0 || r.Claim || r.Handoff || r.Token != reqs[0].Token || r.TTL != reqs[0].TTL {
			return nil, wrap(fmt.Errorf("%w: AcquireAll takes plain exclusive requests of one token and TTL", driver.ErrInvalid))
		}
	}
	b.leases.revokeIdle()
	caller := ctx
	ctx, cancel := b.bound(ctx)
	defer cancel()
	for range maxAttempts {
		res, retry, err := b.acquireAll(ctx, reqs)
		if errors.Is(err, rpctypes.ErrTooManyOps) || errors.Is(err, rpctypes.ErrGRPCTooManyOps) {
			// Nothing was done: etcd checks the size before the transaction.
			return nil, wrap(fmt.Errorf("%w: %d names need %d operations in one transaction, over the server's --max-txn-ops (128 by default: %d names)",
				driver.ErrInvalid, len(reqs), opsPerName*len(reqs), 128/opsPerName))
		}
		if err != nil {
			return nil, wrapCtx(caller, err)
		}
		if !retry {
			return res, nil
		}
	}
	return nil, wrap(driver.Transient(fmt.Errorf("the store changed under %d attempts", maxAttempts)))
}

// acquireAll is one attempt of AcquireAll; retry reports that it must be
// made again (the lease was gone, or a key changed between the compares
// and the reads).
func (b *Backend) acquireAll(ctx context.Context, reqs []driver.AcquireRequest) ([]driver.AcquireResult, bool, error) {
	req0 := reqs[0]
	sent := time.Now()
	l, err := b.leases.forTTL(ctx, req0.TTL)
	if err != nil {
		return nil, false, err
	}
	var cmps []clientv3.Cmp
	var then, els []clientv3.Op
	var pends []*hold
	for _, r := range reqs {
		ek, sp, rk := b.exclKey(r.Key), b.sharedPrefix(r.Key), b.releasedKey(r.Key, r.Token)
		cmps = append(cmps,
			clientv3.Compare(clientv3.CreateRevision(ek), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(sp), "=", 0).WithPrefix(),
			clientv3.Compare(clientv3.CreateRevision(rk), "=", 0))
		then = append(then,
			clientv3.OpPut(ek, exclusive{token: r.Token, holds: 1, ttl: r.TTL, owner: r.Owner}.encode(), clientv3.WithLease(l.id)))
		els = append(els,
			clientv3.OpGet(ek),
			clientv3.OpGet(sp, clientv3.WithPrefix(), clientv3.WithLimit(1)),
			clientv3.OpGet(rk, clientv3.WithCountOnly()))
		pends = append(pends, b.leases.pend(l, ek, r.Token, sent.Add(r.TTL)))
	}
	resp, err := b.txnFull(ctx, cmps, then, els)
	if err != nil {
		if isLeaseNotFound(err) {
			b.leases.forget(l)
			return nil, true, nil
		}
		return nil, false, err // outcome unknown: the pends stay (see pend)
	}
	for _, p := range pends {
		b.leases.resolve(p)
	}
	out := make([]driver.AcquireResult, len(reqs))
	rev := resp.Header.Revision
	if resp.Succeeded {
		for i, r := range reqs {
			b.leases.track(l, b.exclKey(r.Key), r.Token, rev, rev, 1, r.TTL, sent.Add(r.TTL))
			out[i] = driver.AcquireResult{Acquired: true, Fence: uint64(rev), Holds: 1}
		}
		return out, false, nil
	}
	for i := range reqs {
		excl, shared := rangeKVs(resp, 3*i), rangeKVs(resp, 3*i+1)
		switch {
		case len(excl) == 1:
			e := decodeExclusive(excl[0].Value)
			out[i].Holder, out[i].HolderTTL = e.owner, e.ttl
			return out, false, nil
		case len(shared) > 0:
			_, _, out[i].Holder = decodeShared(shared[0].Value)
			out[i].Shared = len(shared)
			return out, false, nil
		case resp.Responses[3*i+2].GetResponseRange().GetCount() > 0:
			return out, false, nil // released already: a late copy
		}
	}
	return nil, true, nil // gone between the compares and the reads
}
