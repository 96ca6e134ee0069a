package etcdlock

import (
	"context"
	"time"

	"github.com/dlock-go/dlock/driver"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// acquireFair is an exclusive acquire in arrival order. The queue is the
// lock's q\x00TOKEN keys, in the order of their create revisions; an entry
// lives on a queue lease of its request's QueueTTL and is written again by
// each later request of its waiter (which keeps its create revision, and so
// its place). A fair acquire reads the lock and its queue, then, when the
// lock is free and the caller heads the queue (or the queue is empty),
// grants in one transaction that checks the lock is still free and, for an
// empty queue, that nobody queued since the read; nobody can queue ahead of
// a head, whose entry is older than any new one.
//
// A caller that this Backend has not queued tries the grant at once, in a
// transaction that also checks that nobody is queued, and reads the lock
// and its queue when refused: an uncontended fair lock costs one round
// trip, as a plain one does.
func (b *Backend) acquireFair(ctx context.Context, req driver.AcquireRequest, retried bool) (driver.AcquireResult, bool, error) {
	sent := time.Now()
	ek, sp, qp := b.exclKey(req.Key), b.sharedPrefix(req.Key), b.queuePrefix(req.Key)
	readOps := []clientv3.Op{
		clientv3.OpGet(ek),
		clientv3.OpGet(sp, clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpGet(qp, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)),
	}
	var (
		read *clientv3.TxnResponse
		err  error
	)
	// enqueued: the first transaction wrote the token's queue entry (see
	// below).
	enqueued := false
	// left: the first transaction's entry was refused, as the token
	// released or withdrew already: no later write of this request queues
	// it either.
	left := false
	if !b.isQueued(req.Key, req.Token) {
		l, err := b.leases.forTTL(ctx, req.TTL)
		if err != nil {
			return driver.AcquireResult{}, false, err
		}
		// A waiter (a token drawn per call) that is refused queues in the
		// same transaction, after the reads: one Raft proposal, not two,
		// for a new waiter. The entry is written unless the token released
		// or withdrew already (a late request whose caller gave up); a
		// handoff to the token cannot come between the read and the
		// entry, which are one transaction.
		els := readOps
		var qid clientv3.LeaseID
		if req.Wait && req.QueueTTL > 0 && !req.Reentrant {
			if qid, err = b.leases.forQueue(ctx, req.QueueTTL); err != nil {
				return driver.AcquireResult{}, false, err
			}
			els = append(append([]clientv3.Op(nil), readOps...), clientv3.OpTxn(
				[]clientv3.Cmp{
					clientv3.Compare(clientv3.CreateRevision(b.releasedKey(req.Key, req.Token)), "=", 0),
					clientv3.Compare(clientv3.CreateRevision(b.withdrawnKey(req.Key, req.Token)), "=", 0),
				},
				[]clientv3.Op{clientv3.OpPut(b.queueKey(req.Key, req.Token), queueValue(req), clientv3.WithLease(qid))}, nil))
		}
		cmps := []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(ek), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(sp), "=", 0).WithPrefix(),
			clientv3.Compare(clientv3.CreateRevision(qp), "=", 0).WithPrefix(),
			clientv3.Compare(clientv3.CreateRevision(b.releasedKey(req.Key, req.Token)), "=", 0),
		}
		then := []clientv3.Op{
			clientv3.OpPut(ek, exclusive{token: req.Token, holds: 1, ttl: req.TTL, owner: req.Owner}.encode(), clientv3.WithLease(l.id)),
			clientv3.OpDelete(b.intentKey(req.Key, req.Token)),
		}
		if qid != 0 {
			p := b.leases.pend(l, ek, req.Token, sent.Add(req.TTL))
			read, err = b.txn(ctx, cmps, then, els)
			if err != nil {
				if isLeaseNotFound(err) {
					// Either lease may be the one gone: ask.
					if ttl, terr := b.c.TimeToLive(ctx, l.id); terr == nil && ttl.TTL <= 0 {
						b.leases.forget(l)
					} else {
						b.leases.forgetQueue(qid)
					}
					return driver.AcquireResult{}, true, nil
				}
				return driver.AcquireResult{}, false, err // outcome unknown: p stays (see pend)
			}
			b.leases.resolve(p)
			if !read.Succeeded {
				enqueued = read.Responses[len(readOps)].GetResponseTxn().GetSucceeded()
				left = !enqueued
			}
		} else {
			var retry bool
			read, retry, err = b.grantTxn(ctx, l, ek, req, sent, cmps, then, els)
			if err != nil || retry {
				return driver.AcquireResult{}, retry, err
			}
		}
		if read.Succeeded {
			r := read.Header.Revision
			b.leases.track(l, ek, req.Token, r, r, 1, req.TTL, sent.Add(req.TTL))
			return driver.AcquireResult{Acquired: true, Fence: uint64(r), Holds: 1}, false, nil
		}
	} else {
		read, err = b.read(ctx, nil, readOps, nil)
		if err != nil {
			return driver.AcquireResult{}, false, err
		}
	}
	rev := read.Header.Revision
	excl, queue := rangeKVs(read, 0), rangeKVs(read, 2)
	for _, kv := range queue {
		if _, _, token, _ := b.parseKey(string(kv.Key)); token != req.Token {
			b.setHint(req.Key, &headHint{token: token, createRev: kv.CreateRevision, lease: kv.Lease, value: kv.Value})
			break
		}
	}
	shared := read.Responses[1].GetResponseRange().GetCount()
	mine := -1
	for i, kv := range queue {
		if _, _, token, _ := b.parseKey(string(kv.Key)); token == req.Token {
			mine = i
			break
		}
	}
	res := driver.AcquireResult{Shared: int(shared)}
	switch {
	case len(excl) == 1:
		kv := excl[0]
		e := decodeExclusive(kv.Value)
		if e.token == req.Token && req.Reentrant {
			return b.reenter(ctx, req, kv, e, sent) // a re-entry is no new grant: the queue does not hold it back
		}
		if e.token == req.Token && (req.Handoff || ownAttempt(retried, req, e.owner)) {
			// A release handed it over, or an earlier attempt of this
			// call got it and its answer was lost.
			return b.claimGrant(ctx, req, kv, e, sent)
		}
		res.Holder = e.owner
		res.HolderTTL = min(b.remaining(ctx, req.Wait, kv.Lease), e.ttl)
	case shared > 0:
	case mine == 0 || len(queue) == 0:
		l, err := b.leases.forTTL(ctx, req.TTL)
		if err != nil {
			return driver.AcquireResult{}, false, err
		}
		cmps := []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(ek), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(sp), "=", 0).WithPrefix(),
			clientv3.Compare(clientv3.CreateRevision(b.releasedKey(req.Key, req.Token)), "=", 0),
		}
		if len(queue) == 0 {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(qp), "<", rev+1).WithPrefix())
		}
		resp, retry, err := b.grantTxn(ctx, l, ek, req, sent, cmps, []clientv3.Op{
			clientv3.OpPut(ek, exclusive{token: req.Token, holds: 1, ttl: req.TTL, owner: req.Owner}.encode(), clientv3.WithLease(l.id)),
			clientv3.OpDelete(b.queueKey(req.Key, req.Token)),
			clientv3.OpDelete(b.intentKey(req.Key, req.Token)),
		}, nil)
		if err != nil || retry {
			return driver.AcquireResult{}, retry, err
		}
		if !resp.Succeeded {
			if n, err := b.get(ctx, b.releasedKey(req.Key, req.Token), clientv3.WithCountOnly()); err == nil && n.Count > 0 {
				return res, false, nil // released already: see releasedTTL
			}
			return res, true, nil // changed since the read: read again
		}
		r := resp.Header.Revision
		b.setQueued(req.Key, req.Token, false)
		b.leases.track(l, ek, req.Token, r, r, 1, req.TTL, sent.Add(req.TTL))
		return driver.AcquireResult{Acquired: true, Fence: uint64(r), Holds: 1}, false, nil
	default:
		// Free, but promised to the head of the queue: no holder to name.
	}
	if !req.Wait || req.QueueTTL <= 0 {
		return res, false, nil
	}
	if enqueued {
		b.setQueued(req.Key, req.Token, true)
		if req.Handoff {
			res.Counter = uint64(rev) // see below
		}
		at := rev
		if mine >= 0 {
			at = queue[mine].CreateRevision
		}
		res.Position, res.Queued = 1, true
		for i, kv := range queue {
			if i != mine && kv.CreateRevision < at {
				res.Position++
			}
		}
		return res, false, nil
	}
	if left {
		// A request of a token that released or withdrew (a late one,
		// whose caller gave up): its read comes after the record, which
		// the compare below would let through.
		return res, false, nil
	}
	qid, err := b.leases.forQueue(ctx, req.QueueTTL)
	if err != nil {
		return driver.AcquireResult{}, false, err
	}
	// The entry is written unless the token released or withdrew since
	// the read (see notLeftSince): then this request's caller has given up.
	// It is not written either when the lock changed since the read: a
	// release may have handed it to the token meanwhile, and an entry
	// written after that would stand behind the token's own grant.
	put, err := b.txn(ctx,
		append(b.notLeftSince(req.Key, req.Token, rev), clientv3.Compare(clientv3.ModRevision(ek), "<", rev+1)),
		[]clientv3.Op{clientv3.OpPut(b.queueKey(req.Key, req.Token), queueValue(req), clientv3.WithLease(qid), clientv3.WithPrevKV())},
		[]clientv3.Op{clientv3.OpGet(ek, clientv3.WithKeysOnly())})
	if err != nil {
		if isLeaseNotFound(err) {
			b.leases.forgetQueue(qid)
			return driver.AcquireResult{}, true, nil
		}
		return driver.AcquireResult{}, false, err
	}
	if req.Handoff {
		// The answer's revision: a handoff at or below it is over (see
		// driver.AcquireResult.Counter), as this answer would have been
		// that grant.
		res.Counter = uint64(put.Header.Revision)
	}
	if !put.Succeeded {
		if kvs := rangeKVs(put, 0); (len(kvs) == 1 && kvs[0].ModRevision > rev) || (len(kvs) == 0 && len(excl) == 1) {
			return res, true, nil // the lock changed: read again
		}
		return res, false, nil
	}
	b.setQueued(req.Key, req.Token, true)
	at := put.Header.Revision
	if prev := put.Responses[0].GetResponsePut().GetPrevKv(); prev != nil {
		at = prev.CreateRevision
	}
	res.Position, res.Queued = 1, true
	for i, kv := range queue {
		if i != mine && kv.CreateRevision < at {
			res.Position++
		}
	}
	return res, false, nil
}

// claimGrant answers a request of token, which is not reentrant, with the
// grant kv that token holds but that the request did not see made: one
// that a release handed to it (see handoff.go), or that an earlier attempt
// of the same call made when its answer was lost (the client draws a token
// per call for a handle that is not reentrant, so the grant is this
// call's). It moves the key to a lease of req.TTL, which lives req.TTL
// past this request's send time, in one transaction that checks that kv
// is unchanged, and deletes the token's queue entry (a request that wrote
// it again, see acquireFair) and intent. The fence stays (see fenceOf).
func (b *Backend) claimGrant(ctx context.Context, req driver.AcquireRequest, kv *mvccpb.KeyValue, e exclusive, sent time.Time) (driver.AcquireResult, bool, error) {
	ek := string(kv.Key)
	l, err := b.leases.forTTL(ctx, req.TTL)
	if err != nil {
		return driver.AcquireResult{}, false, err
	}
	fence := fenceOf(kv)
	e = e.rewritten(kv)
	e.ttl = max(e.ttl, req.TTL)
	resp, retry, err := b.grantTxn(ctx, l, ek, req, sent, []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(ek), "=", kv.ModRevision)},
		[]clientv3.Op{
			clientv3.OpPut(ek, e.encode(), clientv3.WithLease(l.id)),
			clientv3.OpDelete(b.queueKey(req.Key, req.Token)),
			clientv3.OpDelete(b.intentKey(req.Key, req.Token)),
		}, nil)
	if err != nil || retry {
		return driver.AcquireResult{}, retry, err
	}
	if !resp.Succeeded {
		return driver.AcquireResult{}, true, nil // changed since the read: read again
	}
	b.setQueued(req.Key, req.Token, false)
	b.leases.track(l, ek, req.Token, fence, resp.Header.Revision, e.holds, req.TTL, sent.Add(req.TTL))
	return driver.AcquireResult{Acquired: true, Fence: uint64(fence), Holds: e.holds}, false, nil
}
