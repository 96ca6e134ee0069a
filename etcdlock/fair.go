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
// lives on an entries lease of this Backend's (see leaseTable.forEntries),
// which each later request of its waiter keeps alive rather than writing
// the entry again, so that a waiter's refresh wakes nobody (see notify.go:
// a waiter watches the entry ahead of its own). A grant is one transaction
// that checks the lock is free and that nobody is ahead of the caller in
// the queue; nobody can queue ahead of a head, whose entry is older than
// any new one.
//
// A caller that this Backend has not queued tries the grant at once, in a
// transaction that also checks that nobody is queued, and queues when
// refused, in the same transaction: an uncontended fair lock costs one
// round trip, as a plain one does, and a new waiter one Raft commit. A
// queued caller reads its entry and the lock's holder; only when the lock
// is free does it read the queue's head. Every read is of a fixed number
// of keys, whatever the length of the queue.
func (b *Backend) acquireFair(ctx context.Context, req driver.AcquireRequest, retried bool) (driver.AcquireResult, bool, error) {
	sent := time.Now()
	ek, sp, qp := b.exclKey(req.Key), b.sharedPrefix(req.Key), b.queuePrefix(req.Key)
	qk := b.queueKey(req.Key, req.Token)
	// The reads answer, in order: the holder, the number of shared holds,
	// the token's entry, the number of entries; and, when the lock is
	// free, the queue's two oldest entries (a nested transaction, whose
	// range reads the whole queue on the server only then).
	readOps := []clientv3.Op{
		clientv3.OpGet(ek),
		clientv3.OpGet(sp, clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpGet(qk),
		clientv3.OpGet(qp, clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(ek), "=", 0)},
			[]clientv3.Op{clientv3.OpGet(qp, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(2))}, nil),
	}
	const nReads = 5
	var (
		read *clientv3.TxnResponse
		err  error
		ql   *lease // the entries lease of the first transaction's entry
	)
	// enqueued: the first transaction wrote the token's queue entry (see
	// below).
	enqueued := false
	// left: the first transaction's entry was refused, as the token
	// released or withdrew already: no later write of this request queues
	// it either.
	left := false
	if !b.isQueued(req.Key, req.Token) {
		forTTL := b.leases.forTTL
		if req.Wait {
			forTTL = b.leases.forWaitingTTL
		}
		l, err := forTTL(ctx, req.TTL)
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
		if req.Wait && req.QueueTTL > 0 && !req.Reentrant {
			if ql, err = b.leases.forEntries(ctx, req.QueueTTL); err != nil {
				return driver.AcquireResult{}, false, err
			}
			els = append(append([]clientv3.Op(nil), readOps...), clientv3.OpTxn(
				[]clientv3.Cmp{
					clientv3.Compare(clientv3.CreateRevision(b.releasedKey(req.Key, req.Token)), "=", 0),
					clientv3.Compare(clientv3.CreateRevision(b.withdrawnKey(req.Key, req.Token)), "=", 0),
				},
				[]clientv3.Op{clientv3.OpPut(qk, queueValue(req), clientv3.WithLease(ql.id), clientv3.WithPrevKV())}, nil))
		}
		// The holder's compare first: etcd stops at the first that
		// fails, and the queue's reads its whole range.
		cmps := []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(ek), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(b.releasedKey(req.Key, req.Token)), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(sp), "=", 0).WithPrefix(),
			clientv3.Compare(clientv3.CreateRevision(qp), "=", 0).WithPrefix(),
		}
		then := []clientv3.Op{
			clientv3.OpPut(ek, exclusive{token: req.Token, holds: 1, ttl: req.TTL, owner: req.Owner}.encode(), clientv3.WithLease(l.id)),
			clientv3.OpDelete(b.intentKey(req.Key, req.Token)),
		}
		if ql != nil {
			p := b.leases.pend(l, ek, req.Token, sent.Add(req.TTL))
			// An entry of unknown outcome is abandoned on ql at its
			// deadline unless a later request finds it: see pend.
			pq := b.leases.pend(ql, qk, req.Token, sent.Add(req.QueueTTL))
			read, err = b.txn(ctx, cmps, then, els)
			if err != nil {
				if isLeaseNotFound(err) {
					// Either lease may be the one gone: ask.
					if ttl, terr := b.c.TimeToLive(ctx, l.id); terr == nil && ttl.TTL <= 0 {
						b.leases.forget(l)
					} else {
						b.leases.forget(ql)
					}
					return driver.AcquireResult{}, true, nil
				}
				return driver.AcquireResult{}, false, err // outcome unknown: p and pq stay (see pend)
			}
			b.leases.resolve(p)
			if !read.Succeeded {
				enqueued = read.Responses[nReads].GetResponseTxn().GetSucceeded()
				left = !enqueued
			}
			if !enqueued {
				b.leases.resolve(pq)
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
	}
	var heads []*mvccpb.KeyValue // the queue's two oldest entries, read while the lock is free
	if read == nil {
		// A queued caller's read writes nothing: no nested transaction,
		// which etcd would put through Raft as a write, but a second read
		// of the head at the same revision when the lock is free (rarely:
		// a release hands the lock to a head that takes handoffs, or wakes
		// it).
		//
		// The entries lease is kept alive first: a loaded member answers
		// the read late, and the keep-alive after it would come that much
		// later than a refresh period after the last one, past the
		// lease's end (the entry would lapse and lose its place).
		if req.Wait && req.QueueTTL > 0 {
			if ql, err = b.leases.forEntries(ctx, req.QueueTTL); err != nil {
				return driver.AcquireResult{}, false, err
			}
		}
		// Nor does it count the queue, which only a new entry's place
		// needs, and which the member would walk entry by entry at every
		// refresh of every waiter: it reads its own entry there instead.
		ops := append(append([]clientv3.Op(nil), readOps[:3]...), clientv3.OpGet(qk, clientv3.WithCountOnly()))
		if read, err = b.read(ctx, nil, ops, nil); err != nil {
			return driver.AcquireResult{}, false, err
		}
		if len(rangeKVs(read, 0)) == 0 && read.Responses[1].GetResponseRange().GetCount() == 0 {
			hr, err := b.get(ctx, qp, clientv3.WithPrefix(), clientv3.WithRev(read.Header.Revision),
				clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(2))
			if err != nil {
				return driver.AcquireResult{}, false, err
			}
			heads = hr.Kvs
		}
	} else if t := read.Responses[4].GetResponseTxn(); t.GetSucceeded() {
		heads = t.GetResponses()[0].GetResponseRange().GetKvs()
	}
	rev := read.Header.Revision
	excl, mineKVs := rangeKVs(read, 0), rangeKVs(read, 2)
	shared := read.Responses[1].GetResponseRange().GetCount()
	entries := read.Responses[3].GetResponseRange().GetCount()
	var mine, head, second *mvccpb.KeyValue
	if len(mineKVs) == 1 {
		mine = mineKVs[0]
	}
	if len(heads) > 0 {
		head = heads[0]
		if len(heads) > 1 {
			second = heads[1]
		}
	}
	isMine := func(kv *mvccpb.KeyValue) bool { return kv != nil && string(kv.Key) == qk }
	// The head for a release of this Backend's to hand the lock to: the
	// oldest entry but the caller's.
	switch {
	case head != nil && !isMine(head):
		b.setHint(req.Key, &headHint{token: tokenOf(b, head), createRev: head.CreateRevision, lease: head.Lease, value: head.Value})
	case second != nil:
		b.setHint(req.Key, &headHint{token: tokenOf(b, second), createRev: second.CreateRevision, lease: second.Lease, value: second.Value,
			skip: req.Token, skipRev: head.CreateRevision})
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
	case head == nil || isMine(head):
		l, err := b.leases.forTTL(ctx, req.TTL)
		if err != nil {
			return driver.AcquireResult{}, false, err
		}
		cmps := []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(ek), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(b.releasedKey(req.Key, req.Token)), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(sp), "=", 0).WithPrefix(),
		}
		if head == nil {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(qp), "<", rev+1).WithPrefix())
		}
		resp, retry, err := b.grantTxn(ctx, l, ek, req, sent, cmps, []clientv3.Op{
			clientv3.OpPut(ek, exclusive{token: req.Token, holds: 1, ttl: req.TTL, owner: req.Owner}.encode(), clientv3.WithLease(l.id)),
			clientv3.OpDelete(qk),
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
		b.setQueued(req.Key, req.Token, 0)
		b.leases.track(l, ek, req.Token, r, r, 1, req.TTL, sent.Add(req.TTL))
		return driver.AcquireResult{Acquired: true, Fence: uint64(r), Holds: 1}, false, nil
	default:
		// Free, but promised to the head of the queue: no holder to name.
	}
	if !req.Wait || req.QueueTTL <= 0 {
		return res, false, nil
	}
	if req.Handoff {
		// The answer's revision: a handoff at or below it is over (see
		// driver.AcquireResult.Counter), as this answer would have been
		// that grant.
		res.Counter = uint64(rev)
	}
	if enqueued {
		// Entries older than this one: all that the count saw.
		at := rev
		if prev := read.Responses[nReads].GetResponseTxn().GetResponses()[0].GetResponsePut().GetPrevKv(); prev != nil {
			at = prev.CreateRevision // an entry of an earlier request, whose answer was lost
		}
		b.leases.track(ql, qk, req.Token, at, rev, 1, req.QueueTTL, sent.Add(req.QueueTTL))
		b.setQueued(req.Key, req.Token, at)
		res.Position, res.Queued = int(entries)+1, true
		return res, false, nil
	}
	if left {
		// A request of a token that released or withdrew (a late one,
		// whose caller gave up): its read comes after the record, which
		// the compare below would let through.
		return res, false, nil
	}
	// The place: known while the lock is free (the head read), unknown
	// otherwise (counting the entries ahead would read the whole queue).
	position := 0
	if head != nil && isMine(head) {
		position = 1
	} else if second != nil && isMine(second) {
		position = 2
	}
	if ql == nil {
		if ql, err = b.leases.forEntries(ctx, req.QueueTTL); err != nil {
			return driver.AcquireResult{}, false, err
		}
	}
	if mine != nil && mine.Lease == int64(ql.id) {
		// Kept: its lease lives QueueTTL from now (forEntries), and a
		// grant handed to the token since the read lives on it.
		b.leases.track(ql, qk, req.Token, mine.CreateRevision, mine.ModRevision, 1, req.QueueTTL, sent.Add(req.QueueTTL))
		b.setQueued(req.Key, req.Token, mine.CreateRevision)
		res.Position, res.Queued = position, true
		return res, false, nil
	}
	// The entry is gone (lapsed) or on a lease that retired: written
	// again, on ql (a put keeps its place). It is written unless the token
	// released or withdrew since the read (see notLeftSince): then this
	// request's caller has given up. It is not written either when the
	// lock changed since the read: a release may have handed it to the
	// token meanwhile, and an entry written after that would stand behind
	// the token's own grant.
	pq := b.leases.pend(ql, qk, req.Token, sent.Add(req.QueueTTL))
	put, err := b.txn(ctx,
		append(b.notLeftSince(req.Key, req.Token, rev), clientv3.Compare(clientv3.ModRevision(ek), "<", rev+1)),
		[]clientv3.Op{clientv3.OpPut(qk, queueValue(req), clientv3.WithLease(ql.id), clientv3.WithPrevKV())},
		[]clientv3.Op{clientv3.OpGet(ek, clientv3.WithKeysOnly())})
	if err != nil {
		if isLeaseNotFound(err) {
			b.leases.forget(ql)
			return driver.AcquireResult{}, true, nil
		}
		return driver.AcquireResult{}, false, err // outcome unknown: pq stays (see pend)
	}
	if req.Handoff {
		res.Counter = uint64(put.Header.Revision)
	}
	if !put.Succeeded {
		b.leases.resolve(pq)
		if kvs := rangeKVs(put, 0); (len(kvs) == 1 && kvs[0].ModRevision > rev) || (len(kvs) == 0 && len(excl) == 1) {
			return res, true, nil // the lock changed: read again
		}
		return res, false, nil
	}
	at := put.Header.Revision
	if prev := put.Responses[0].GetResponsePut().GetPrevKv(); prev != nil {
		at = prev.CreateRevision
	} else if mine == nil && head == nil && len(excl) == 0 {
		position = 1
	}
	b.leases.track(ql, qk, req.Token, at, put.Header.Revision, 1, req.QueueTTL, sent.Add(req.QueueTTL))
	b.setQueued(req.Key, req.Token, at)
	res.Position, res.Queued = position, true
	return res, false, nil
}

// tokenOf returns the token of queue entry kv.
func tokenOf(b *Backend, kv *mvccpb.KeyValue) string {
	_, _, token, _ := b.parseKey(string(kv.Key))
	return token
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
	b.setQueued(req.Key, req.Token, 0)
	b.setHint(req.Key, unknownHead)
	b.leases.track(l, ek, req.Token, fence, resp.Header.Revision, e.holds, req.TTL, sent.Add(req.TTL))
	return driver.AcquireResult{Acquired: true, Fence: uint64(fence), Holds: e.holds}, false, nil
}
