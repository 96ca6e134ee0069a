package etcdlock

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/dlock-go/dlock/driver"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Release implements driver.Backend.
func (b *Backend) Release(ctx context.Context, key, token string) (driver.ReleaseResult, error) {
	return b.release(ctx, key, token, 0)
}

// ReleaseGrant implements driver.GrantReleaser: the exclusive hold is
// dropped only when the grant's fence (see fenceOf) is fence.
func (b *Backend) ReleaseGrant(ctx context.Context, key, token string, fence uint64) (driver.ReleaseResult, error) {
	return b.release(ctx, key, token, int64(fence))
}

// release drops one hold of token, of the grant with the given fence when
// it is not 0. The last hold of a grant this Backend made or renewed, and
// that nobody changed since, goes in one transaction, which hands the lock
// to the queue's head when it takes handoffs (see dropLast); otherwise one
// transaction reads the exclusive holder (and drops token's shared hold
// and writer intent, which are token's alone), and a second changes the
// holder's key if it is token's, on the condition that it is unchanged.
//
// A release is safe to repeat (its writes compare the key's mod revision,
// or delete and record what a repeat deletes and records again), so it
// starts over after a transient error (a leader change, a call that hung
// on one member) for as long as the call timeout and ctx allow, but for
// the change of a hold count, which is not repeated (onceError). A repeat
// that finds the hold gone while the lease it was on still lives counts
// it as released: only a delete takes a key off a live lease.
func (b *Backend) release(ctx context.Context, key, token string, fence int64) (driver.ReleaseResult, error) {
	defer b.leases.revokeIdle() // the release may leave a retired lease empty
	caller := ctx
	ctx, cancel := b.bound(ctx)
	defer cancel()
	b.setQueued(key, token, 0)
	again := false
	pause := 25 * time.Millisecond
	for {
		res, err := b.releaseOnce(ctx, key, token, fence, again)
		if err == nil {
			return res, nil
		}
		if !mayRepeat(ctx, err) || !sleep(ctx, pause/2+rand.N(pause)) {
			return driver.ReleaseResult{}, wrapCtx(caller, err)
		}
		again = true
		pause = min(2*pause, 250*time.Millisecond)
	}
}

// releaseOnce is one try of release; again says that an earlier try
// failed, and may have landed.
func (b *Backend) releaseOnce(ctx context.Context, key, token string, fence int64, again bool) (driver.ReleaseResult, error) {
	ek, sk, wk := b.exclKey(key), b.sharedKey(key, token), b.intentKey(key, token)
	qk := b.queueKey(key, token)
	readOps := []clientv3.Op{
		clientv3.OpGet(ek),
		clientv3.OpDelete(sk),
		clientv3.OpDelete(wk),
		clientv3.OpDelete(qk),
	}
	var (
		resp *clientv3.TxnResponse
		err  error
	)
	h, tracked := b.leases.tracked(ek, token)
	if modRev := lastWrite(h, tracked, fence); modRev > 0 {
		resp, err = b.dropLast(ctx, key, token, modRev, []clientv3.Op{clientv3.OpDelete(wk), clientv3.OpDelete(qk)}, readOps)
		if err != nil {
			return driver.ReleaseResult{}, err
		}
		if resp.Succeeded {
			b.leases.untrack(ek, token)
			return driver.ReleaseResult{Held: true}, nil
		}
	} else if fence == 0 {
		// When token holds nothing, mark it released in the same step
		// (see markReleased).
		id, err := b.leases.forQueue(ctx, b.releasedFor())
		if err != nil {
			return driver.ReleaseResult{}, err
		}
		resp, err = b.txn(ctx,
			[]clientv3.Cmp{
				clientv3.Compare(clientv3.CreateRevision(ek), "=", 0),
				clientv3.Compare(clientv3.CreateRevision(sk), "=", 0),
			},
			[]clientv3.Op{clientv3.OpPut(b.releasedKey(key, token), "", clientv3.WithLease(id)), clientv3.OpDelete(wk), clientv3.OpDelete(qk)},
			readOps)
		if err != nil {
			return driver.ReleaseResult{}, err
		}
		if resp.Succeeded {
			b.leases.untrack(ek, token)
			b.leases.untrack(sk, token)
			return driver.ReleaseResult{}, nil
		}
	} else {
		resp, err = b.txn(ctx, nil, readOps, nil)
		if err != nil {
			return driver.ReleaseResult{}, err
		}
	}
	if resp.Responses[1].GetResponseDeleteRange().GetDeleted() > 0 || (again && b.leases.liveAndGone(sk, token, nil)) {
		b.leases.untrack(sk, token)
		return driver.ReleaseResult{Held: true}, nil
	}
	kvs := rangeKVs(resp, 0)
	for range maxAttempts {
		if len(kvs) != 1 {
			break
		}
		kv := kvs[0]
		e := decodeExclusive(kv.Value)
		if e.token != token || (fence != 0 && fenceOf(kv) != fence) {
			break
		}
		f := fenceOf(kv)
		e = e.rewritten(kv)
		e.holds--
		els := []clientv3.Op{clientv3.OpGet(ek)}
		var resp *clientv3.TxnResponse
		var err error
		var recID clientv3.LeaseID
		if e.holds > 0 {
			resp, err = b.txnOnce(ctx,
				[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(ek), "=", kv.ModRevision)},
				[]clientv3.Op{clientv3.OpPut(ek, e.encode(), clientv3.WithIgnoreLease())}, els)
		} else {
			var extra []clientv3.Op
			if fence == 0 && e.fence != 0 {
				// A clean-up (no fence) that drops a grant a release
				// handed to token: without the handoff it would have
				// found nothing and recorded the release (see
				// markReleased), which refuses a request of token still
				// on its way. Record it here too, in the same
				// transaction.
				if recID, err = b.leases.forQueue(ctx, b.releasedFor()); err != nil {
					return driver.ReleaseResult{}, err
				}
				extra = []clientv3.Op{clientv3.OpPut(b.releasedKey(key, token), "", clientv3.WithLease(recID))}
			}
			resp, err = b.dropLast(ctx, key, token, kv.ModRevision, extra, els)
		}
		if err != nil {
			if recID != 0 && isLeaseNotFound(err) {
				// The record's lease is gone: try again with another.
				b.leases.forgetQueue(recID)
				continue
			}
			return driver.ReleaseResult{}, err
		}
		if !resp.Succeeded {
			kvs = rangeKVs(resp, 0)
			continue
		}
		if e.holds == 0 {
			b.leases.untrack(ek, token)
		} else if l := b.leases.mine(clientv3.LeaseID(kv.Lease)); l != nil {
			b.leases.track(l, ek, token, f, resp.Header.Revision, e.holds, 0, time.Time{})
		}
		return driver.ReleaseResult{Held: true, Remaining: e.holds}, nil
	}
	if len(kvs) == 1 && decodeExclusive(kvs[0].Value).token == token {
		return driver.ReleaseResult{}, nil // another grant of token (ReleaseGrant)
	}
	if again && b.leases.liveAndGone(ek, token, kvs) {
		// An earlier try dropped the last hold (or handed it on).
		b.leases.untrack(ek, token)
		return driver.ReleaseResult{Held: true}, nil
	}
	b.leases.untrack(ek, token)
	b.leases.untrack(sk, token)
	if fence == 0 {
		// A release that found nothing may have overtaken the acquire it
		// cleans up after (a cancelled call that the server still runs):
		// keep that acquire from granting, for as long as it can be on
		// its way.
		if err := b.markReleased(ctx, key, token); err != nil {
			return driver.ReleaseResult{}, err
		}
	}
	return driver.ReleaseResult{}, nil
}

// lastWrite returns the mod revision that the holder's key has while it
// is still the single hold of the grant that release drops (a tracked
// hold h, or the grant of the given fence), or 0 when unknown (the hold is
// read first).
//
// An untracked grant with a fence (ReleaseGrant of a grant that a release
// handed to the token: see handoff.go) is the write at revision fence,
// which is that grant's fence: while the key's last write is that one,
// its value is what that write left, the token's single hold. A release
// that drops it compares that alone: one transaction, as for a tracked
// hold.
//
// A clean-up (no fence) of a handed grant reads it first: it records the
// release (see releaseOnce).
func lastWrite(h hold, tracked bool, fence int64) int64 {
	switch {
	case tracked && h.handed && fence == 0:
	case tracked && h.count == 1 && (fence == 0 || h.fence == fence):
		return h.modRev
	case !tracked && fence > 0:
		return fence
	}
	return 0
}

// releasedTTL is how long, at least, a release that found nothing keeps
// its token from being granted: no shorter than an acquire of the token
// can be on its way to the store, the call timeout (releasedFor). The
// client draws a token per call for everything but reentrant handles and
// owner IDs, whose releases that find nothing are rare (an unlock after a
// loss, the clean-up after an acquire of unknown outcome): such a handle
// may then wait up to this long for its next grant.
// The record lives on a shared short lease (see leaseTable.forQueue):
// from releasedTTL (or the call timeout, when it is longer) to that
// rounded up to whole seconds, plus one.
const releasedTTL = 3 * time.Second

// releasedFor is how long the records of a release that found nothing and
// of a withdrawal live: releasedTTL, or the call timeout when longer.
func (b *Backend) releasedFor() time.Duration { return max(releasedTTL, b.timeout) }

// markReleased records that token released key while it held nothing
// (another token held it: when it holds nothing at all, the release's
// transaction records it itself).
func (b *Backend) markReleased(ctx context.Context, key, token string) error {
	id, err := b.leases.forQueue(ctx, b.releasedFor())
	if err != nil {
		return err
	}
	return b.attempt.repeat(ctx, func(ctx context.Context) error {
		_, err := b.c.Put(ctx, b.releasedKey(key, token), "", clientv3.WithLease(id))
		return err
	})
}

// Withdraw implements driver.Withdrawer: it deletes token's writer intent
// and fair queue entry (the watch of every waiter sees the deletes), and
// leaves a record of the withdrawal (x\x00TOKEN, releasedFor) that refuses
// the entry or intent of a request of token that read the lock before it
// (see notLeftSince): a request still on its way when its caller gave up.
// The token's holds and grants are untouched.
func (b *Backend) Withdraw(ctx context.Context, key, token string) error {
	b.setQueued(key, token, 0)
	ctx, cancel := b.bound(ctx)
	defer cancel()
	id, err := b.leases.forQueue(ctx, b.releasedFor())
	if err != nil {
		return wrap(err)
	}
	if _, err := b.read(ctx, nil, []clientv3.Op{
		clientv3.OpDelete(b.intentKey(key, token)),
		clientv3.OpDelete(b.queueKey(key, token)),
		clientv3.OpPut(b.withdrawnKey(key, token), "", clientv3.WithLease(id)),
	}, nil); err != nil {
		return wrap(err)
	}
	return nil
}
