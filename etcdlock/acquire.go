// Acquire of an exclusive or a shared hold: the transactions that grant,
// re-enter, or refuse and say who holds.

package etcdlock

import (
	"context"
	"time"

	"github.com/dlock-go/dlock/driver"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func (b *Backend) acquireExclusive(ctx context.Context, req driver.AcquireRequest, retried bool) (driver.AcquireResult, bool, error) {
	sent := time.Now()
	forTTL := b.leases.forTTL
	if req.Wait {
		forTTL = b.leases.forWaitingTTL
	}
	l, err := forTTL(ctx, req.TTL)
	if err != nil {
		return driver.AcquireResult{}, false, err
	}
	ek, sp, ip := b.exclKey(req.Key), b.sharedPrefix(req.Key), b.intentPrefix(req.Key)
	resp, retry, err := b.grantTxn(ctx, l, ek, req, sent, []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(ek), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(sp), "=", 0).WithPrefix(),
		clientv3.Compare(clientv3.CreateRevision(b.releasedKey(req.Key, req.Token)), "=", 0),
	},
		[]clientv3.Op{
			clientv3.OpPut(ek, exclusive{token: req.Token, holds: 1, ttl: req.TTL, owner: req.Owner}.encode(), clientv3.WithLease(l.id)),
			clientv3.OpDelete(b.intentKey(req.Key, req.Token)),
			clientv3.OpDelete(b.queueKey(req.Key, req.Token)),
			// Overtook: is anyone queued (two keys tell whether another
			// than Token is)?
			clientv3.OpGet(b.queuePrefix(req.Key), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(2)),
		},
		[]clientv3.Op{
			clientv3.OpGet(ek),
			clientv3.OpGet(sp, clientv3.WithPrefix()),
			clientv3.OpGet(ip, clientv3.WithPrefix()),
			clientv3.OpGet(b.releasedKey(req.Key, req.Token), clientv3.WithCountOnly()),
			// QueueLive: is anyone queued?
			clientv3.OpGet(b.queuePrefix(req.Key), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1)),
		})
	if err != nil || retry {
		return driver.AcquireResult{}, retry, err
	}
	rev := resp.Header.Revision
	if resp.Succeeded {
		b.leases.track(l, ek, req.Token, rev, rev, 1, req.TTL, sent.Add(req.TTL))
		overtook := false
		for _, kv := range rangeKVs(resp, 3) {
			if _, _, token, _ := b.parseKey(string(kv.Key)); token != req.Token {
				overtook = true
			}
		}
		return driver.AcquireResult{Acquired: true, Fence: uint64(rev), Holds: 1, Overtook: overtook}, false, nil
	}
	excl, shared, intents := rangeKVs(resp, 0), rangeKVs(resp, 1), rangeKVs(resp, 2)
	var res driver.AcquireResult
	res.Shared = len(shared)
	// A waiter refused while others are queued joins the queue (see
	// driver.AcquireResult.QueueLive): a Client with no queued token does
	// not hear the handoffs between them (see watchFree).
	res.QueueLive = req.Wait && len(rangeKVs(resp, 4)) > 0
	if len(excl) == 1 {
		kv := excl[0]
		e := decodeExclusive(kv.Value)
		if e.token == req.Token && req.Reentrant {
			return b.reenter(ctx, req, kv, e, sent)
		}
		if e.token == req.Token && ownAttempt(retried, req, e.owner) {
			return b.claimGrant(ctx, req, kv, e, sent) // an earlier attempt's
		}
		res.Holder = e.owner
		res.HolderTTL = min(b.remaining(ctx, req.Wait, kv.Lease), e.ttl)
	} else if len(shared) > 0 {
		// The hold that expires last is not known without asking for
		// each lease; the newest is the best guess.
		last := shared[len(shared)-1]
		for _, kv := range shared {
			if kv.CreateRevision > last.CreateRevision {
				last = kv
			}
		}
		_, _, res.Holder = decodeShared(last.Value)
	} else if resp.Responses[3].GetResponseRange().GetCount() > 0 {
		return res, false, nil // released already: see releasedTTL
	} else {
		return res, true, nil // gone between the compare and the read: cannot be, but try again
	}
	if !req.Wait || req.QueueTTL <= 0 {
		return res, false, nil
	}
	// A writer refused by shared holds records its intent, unless another
	// token's is live; one that has an intent keeps it.
	mine, others := false, false
	for _, kv := range intents {
		if _, _, token, _ := b.parseKey(string(kv.Key)); token == req.Token {
			mine = true
		} else {
			others = true
		}
	}
	if others || (!mine && len(excl) == 1) {
		return res, false, nil
	}
	qid, err := b.leases.forQueue(ctx, req.QueueTTL)
	if err != nil {
		return driver.AcquireResult{}, false, err
	}
	put, err := b.txn(ctx,
		append(b.notLeftSince(req.Key, req.Token, rev), clientv3.Compare(clientv3.ModRevision(ip), "<", rev+1).WithPrefix()),
		[]clientv3.Op{clientv3.OpPut(b.intentKey(req.Key, req.Token), req.Owner, clientv3.WithLease(qid))},
		nil)
	if err != nil {
		return driver.AcquireResult{}, false, err
	}
	res.Queued = put.Succeeded
	return res, false, nil
}

// grantTxn runs a transaction that may grant key to req.Token on lease l:
// the grant counts as pending on l (see pend) until the answer, and stays
// so when the outcome is unknown (err). retry reports that the server no
// longer had l, which is forgotten: the caller tries again with another.
func (b *Backend) grantTxn(ctx context.Context, l *lease, key string, req driver.AcquireRequest, sent time.Time, cmps []clientv3.Cmp, then, els []clientv3.Op) (resp *clientv3.TxnResponse, retry bool, err error) {
	p := b.leases.pend(l, key, req.Token, sent.Add(req.TTL))
	resp, err = b.txn(ctx, cmps, then, els)
	if err != nil {
		if isLeaseNotFound(err) {
			b.leases.forget(l)
			return nil, true, nil
		}
		return nil, false, err // outcome unknown: p stays (see pend)
	}
	b.leases.resolve(p)
	return resp, false, nil
}

// reenter adds a hold to token's exclusive grant kv.
func (b *Backend) reenter(ctx context.Context, req driver.AcquireRequest, kv *mvccpb.KeyValue, e exclusive, sent time.Time) (driver.AcquireResult, bool, error) {
	ek := string(kv.Key)
	// The grant must live req.TTL from now, never less than it did: keep
	// its lease alive first, or, when that lease is ours and too short for
	// req.TTL, move the grant to a lease of req.TTL's.
	//
	// A grant on another Backend's lease (an owner ID shared with another
	// process) moves to a lease of ours: that lease's TTL is not ours to
	// trust, and keeping it alive would keep alive whatever else its
	// Backend left on it. The new lease covers the longest TTL the grant's
	// holders asked for, so that the other process's holder, whose next
	// renewal moves the key back to its own lease, keeps it meanwhile.
	leaseOpt := clientv3.WithIgnoreLease()
	l := b.leases.mine(clientv3.LeaseID(kv.Lease))
	foreign := l == nil
	moved := true
	switch {
	case l == nil:
		nl, err := b.leases.forTTL(ctx, max(req.TTL, e.ttl))
		if err != nil {
			return driver.AcquireResult{}, false, err
		}
		l, leaseOpt = nl, clientv3.WithLease(nl.id)
	case bucketOf(req.TTL) > l.bucket:
		nl, err := b.leases.forTTL(ctx, req.TTL)
		if err != nil {
			return driver.AcquireResult{}, false, err
		}
		l, leaseOpt = nl, clientv3.WithLease(nl.id)
	default:
		switch err := b.leases.extend(ctx, l, sent.Add(req.TTL)); {
		case err == errRetired:
			nl, err := b.leases.forTTL(ctx, req.TTL)
			if err != nil {
				return driver.AcquireResult{}, false, err
			}
			l, leaseOpt = nl, clientv3.WithLease(nl.id)
		case isLeaseNotFound(err):
			return driver.AcquireResult{}, true, nil
		case err != nil:
			return driver.AcquireResult{}, false, err
		default:
			moved = false
		}
	}
	fence := fenceOf(kv)
	e = e.rewritten(kv)
	e.holds++
	e.ttl = max(e.ttl, req.TTL)
	// A key moving to l may be left there by a re-entry of unknown
	// outcome: see pend.
	var p *hold
	if moved {
		p = b.leases.pend(l, ek, req.Token, sent.Add(req.TTL))
	}
	// The key's mod revision stands for its create revision (the grant)
	// and its lease too: any write of the key changes it.
	resp, err := b.txnOnce(ctx,
		[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(ek), "=", kv.ModRevision)},
		[]clientv3.Op{
			clientv3.OpPut(ek, e.encode(), leaseOpt),
			clientv3.OpDelete(b.intentKey(req.Key, req.Token)),
		}, nil)
	if err != nil {
		if moved && isLeaseNotFound(err) {
			b.leases.forget(l)
			return driver.AcquireResult{}, true, nil
		}
		return driver.AcquireResult{}, false, err
	}
	if p != nil {
		b.leases.resolve(p)
	}
	if !resp.Succeeded {
		return driver.AcquireResult{}, true, nil
	}
	if foreign {
		b.leases.coverMoved(ctx, l, ek, req.Token, fence, resp.Header.Revision, e.holds, e.ttl, sent.Add(req.TTL))
	} else {
		b.leases.track(l, ek, req.Token, fence, resp.Header.Revision, e.holds, req.TTL, sent.Add(req.TTL))
	}
	return driver.AcquireResult{Acquired: true, Fence: uint64(fence), Holds: e.holds}, false, nil
}

func (b *Backend) acquireShared(ctx context.Context, req driver.AcquireRequest, retried bool) (driver.AcquireResult, bool, error) {
	sent := time.Now()
	ek, sp, ip := b.exclKey(req.Key), b.sharedPrefix(req.Key), b.intentPrefix(req.Key)
	sk := b.sharedKey(req.Key, req.Token)
	// Read first: the limit needs the count of live shared holds, which no
	// compare of etcd's gives; the transaction then checks that no shared
	// hold came since the read (a release since only leaves more room).
	read, err := b.read(ctx, nil, []clientv3.Op{
		clientv3.OpGet(ek),
		clientv3.OpGet(sp, clientv3.WithPrefix()),
		clientv3.OpGet(ip, clientv3.WithPrefix()),
	}, nil)
	if err != nil {
		return driver.AcquireResult{}, false, err
	}
	rev := read.Header.Revision
	excl, shared, intents := rangeKVs(read, 0), rangeKVs(read, 1), rangeKVs(read, 2)
	res := driver.AcquireResult{Shared: len(shared)}
	for _, kv := range shared {
		if string(kv.Key) == sk {
			_, _, owner := decodeShared(kv.Value)
			if ownAttempt(retried, req, owner) {
				// The hold is this request's, granted to an earlier
				// attempt whose answer was lost.
				return b.claimShared(ctx, req, kv, sent)
			}
			res.Holder = owner
			return res, false, nil
		}
	}
	for _, kv := range shared {
		if limit, _, _ := decodeShared(kv.Value); limit != max(req.Limit, 0) {
			// The live shared holds bind the name's kind and limit (a
			// semaphore of another size, a reader on a semaphore's name,
			// a permit beside readers): see driver.AcquireRequest.Limit.
			newest := kv
			for _, o := range shared {
				if o.CreateRevision > newest.CreateRevision {
					newest = o
				}
			}
			_, ttl, owner := decodeShared(newest.Value)
			res.Holder, res.HolderTTL = owner, min(b.remaining(ctx, req.Wait, newest.Lease), ttl)
			res.Conflict, res.HeldLimit = true, limit
			return res, false, nil
		}
	}
	if len(excl) == 1 {
		e := decodeExclusive(excl[0].Value)
		res.Holder = e.owner
		res.HolderTTL = min(b.remaining(ctx, req.Wait, excl[0].Lease), e.ttl)
		return res, false, nil
	}
	if len(intents) > 0 {
		res.Holder, res.WriterWaiting = string(intents[0].Value), true
		res.HolderTTL = b.remaining(ctx, req.Wait, intents[0].Lease)
		return res, false, nil
	}
	if req.Limit > 0 && len(shared) >= req.Limit {
		first := shared[0]
		for _, kv := range shared {
			if kv.CreateRevision < first.CreateRevision {
				first = kv
			}
		}
		_, ttl, owner := decodeShared(first.Value)
		res.Holder = owner
		res.HolderTTL = min(b.remaining(ctx, req.Wait, first.Lease), ttl)
		return res, false, nil
	}
	l, err := b.leases.forTTL(ctx, req.TTL)
	if err != nil {
		return driver.AcquireResult{}, false, err
	}
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(ek), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(ip), "=", 0).WithPrefix(),
		clientv3.Compare(clientv3.CreateRevision(b.releasedKey(req.Key, req.Token)), "=", 0),
	}
	// No shared hold came since the read: a permit needs the count, and
	// every shared request needs the kind and limit the read saw to be
	// the holds' (a permit and a reader that both read an empty name
	// must not both get in).
	cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(sp), "<", rev+1).WithPrefix())
	if req.Limit == 0 {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(sk), "=", 0))
	}
	resp, retry, err := b.grantTxn(ctx, l, sk, req, sent, cmps,
		[]clientv3.Op{clientv3.OpPut(sk, sharedValue(req.Limit, req.TTL, req.Owner), clientv3.WithLease(l.id))}, nil)
	if err != nil || retry {
		return driver.AcquireResult{}, retry, err
	}
	if !resp.Succeeded {
		if n, err := b.get(ctx, b.releasedKey(req.Key, req.Token), clientv3.WithCountOnly()); err == nil && n.Count > 0 {
			return res, false, nil // released already: see releasedTTL
		}
		return res, true, nil
	}
	r := resp.Header.Revision
	b.leases.track(l, sk, req.Token, r, r, 1, req.TTL, sent.Add(req.TTL))
	return driver.AcquireResult{Acquired: true, Fence: uint64(r), Holds: 1}, false, nil
}

// claimShared answers a shared request with the hold kv of its token,
// which an earlier attempt of the request made when its answer was lost
// (a token is drawn per shared request): it moves the key to a lease of
// req.TTL, as claimGrant does. The fence is the key's create revision.
func (b *Backend) claimShared(ctx context.Context, req driver.AcquireRequest, kv *mvccpb.KeyValue, sent time.Time) (driver.AcquireResult, bool, error) {
	sk := string(kv.Key)
	l, err := b.leases.forTTL(ctx, req.TTL)
	if err != nil {
		return driver.AcquireResult{}, false, err
	}
	resp, retry, err := b.grantTxn(ctx, l, sk, req, sent, []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(sk), "=", kv.ModRevision)},
		[]clientv3.Op{clientv3.OpPut(sk, "", clientv3.WithIgnoreValue(), clientv3.WithLease(l.id))}, nil)
	if err != nil || retry {
		return driver.AcquireResult{}, retry, err
	}
	if !resp.Succeeded {
		return driver.AcquireResult{}, true, nil // changed since the read: read again
	}
	b.leases.track(l, sk, req.Token, kv.CreateRevision, resp.Header.Revision, 1, req.TTL, sent.Add(req.TTL))
	return driver.AcquireResult{Acquired: true, Fence: uint64(kv.CreateRevision), Holds: 1}, false, nil
}

// ownAttempt reports whether a grant of req's token, written for owner,
// may be one that an earlier attempt of the same Acquire call made
// (retried) when its answer was lost. A token is not always drawn per
// call: another process with the same owner ID (not reentrant) holds its
// own grant of the token, which is not this call's to take.
func ownAttempt(retried bool, req driver.AcquireRequest, owner string) bool {
	return retried && owner == req.Owner
}
