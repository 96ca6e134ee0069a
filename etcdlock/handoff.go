package etcdlock

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock/driver"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The direct handoff (driver.CapHandoff). A waiter that asks for it
// (AcquireRequest.Handoff) marks its queue entry so; a release that leaves
// the lock to such a head grants it in the release's own transaction: the
// holder's key is written for the head's token on the lease of the head's
// queue entry, and the head's Listener announces the grant from the watch
// event (driver.Handoff). The key is overwritten, not deleted and created
// again (etcd refuses both in one transaction): the grant's fence is the
// revision of that write, which the value marks (see exclusive). One
// Raft commit per grant, as etcd's concurrency.Mutex costs.
//
// An etcd transaction cannot read the queue and write what it read, so
// the release names its head from what the Backend last saw of the queue
// (a headHint, kept by its fair reads of a free lock; see guess) and
// checks it in the same transaction: the hint's entry is there, with the
// same create revision (its place), lease and value, and no entry is older
// (with no hint: nobody is queued). When the check fails, the nested
// transaction writes nothing and reads the queue's head, and the release
// tries again with it (see dropLast). A head that takes no handoff is
// released to as before: the delete wakes it.
//
// The grant lives on the head's entry lease, which lives at least QueueTTL
// past the send time of the request that last wrote or kept the entry (see
// leaseTable.forEntries): the deadline the client gives a handed grant
// before its first renewal, which moves the key to a lease of the head's
// TTL (see migrate). A head whose Lock ended meanwhile releases its token
// in its clean-up, which deletes the grant (or hands it on) and records
// the release, as a clean-up that found nothing would (see release); a
// head that died leaves the grant to its queue lease's expiry.

// handoffMark starts the value of a queue entry that takes handoffs; the
// request's TTL in ms and its owner follow. Owners hold no NUL.
const handoffMark = "\x00h"

// queueValue is the value of req's queue entry: its owner, after the
// handoff mark and its TTL when it takes handoffs.
func queueValue(req driver.AcquireRequest) string {
	if !req.Handoff {
		return req.Owner
	}
	return handoffMark + strconv.FormatInt(req.TTL.Milliseconds(), 10) + "\n" + req.Owner
}

// decodeQueue splits a queue entry's value: whether it takes handoffs, the
// TTL of its request (when it does) and its owner.
func decodeQueue(v []byte) (handoff bool, ttl time.Duration, owner string) {
	rest, ok := strings.CutPrefix(string(v), handoffMark)
	if !ok {
		return false, 0, string(v)
	}
	ms, owner, _ := strings.Cut(rest, "\n")
	n, _ := strconv.ParseInt(ms, 10, 64)
	return true, time.Duration(n) * time.Millisecond, owner
}

// headHint is the head of a lock's fair queue as this Backend last saw it.
type headHint struct {
	token     string
	createRev int64 // the entry's place
	lease     int64 // the entry's lease
	value     []byte
	// skip is the token of the one entry older than the head's that the
	// read passed over (the reader's own, which its grant deletes), and
	// skipRev that entry's create revision; "" when the head was the
	// oldest entry. See lastHold.
	skip    string
	skipRev int64
}

// maxHints bounds the hints kept; past it the set starts over (a release
// without a hint leaves the head to grant itself).
const maxHints = 4096

// setHint records the head of key's queue, or forgets it (nil).
func (b *Backend) setHint(key string, h *headHint) {
	b.queuedMu.Lock()
	defer b.queuedMu.Unlock()
	if h == nil {
		delete(b.hints, key)
		return
	}
	if _, ok := b.hints[key]; !ok && len(b.hints) >= maxHints {
		clear(b.hints)
	}
	b.hints[key] = *h
}

func (b *Backend) hint(key string) (headHint, bool) {
	b.queuedMu.Lock()
	defer b.queuedMu.Unlock()
	h, ok := b.hints[key]
	return h, ok
}

// headOf returns the head of a queue read (sorted by create revision), or
// nil for an empty queue.
func (b *Backend) headOf(kvs []*mvccpb.KeyValue) *headHint {
	if len(kvs) == 0 {
		return nil
	}
	_, _, token, _ := b.parseKey(string(kvs[0].Key))
	return &headHint{token: token, createRev: kvs[0].CreateRevision, lease: kvs[0].Lease, value: kvs[0].Value}
}

// lastHold returns the operation that drops token's last hold of key's
// exclusive grant, with extra, when head (nil for none) heads key's queue:
// a nested transaction that checks that it does, and then grants the lock
// to head when head takes handoffs, or deletes the key otherwise. When the
// check fails, the nested transaction writes nothing and reads the queue's
// head (see headRead), for the caller to try again with it.
//
// With force, it deletes the key whatever the queue holds.
func (b *Backend) lastHold(key, token string, head *headHint, force bool, extra ...clientv3.Op) clientv3.Op {
	ek, qp := b.exclKey(key), b.queuePrefix(key)
	plain := append([]clientv3.Op{clientv3.OpDelete(ek)}, extra...)
	if force {
		return clientv3.OpTxn(nil, plain, nil)
	}
	read := []clientv3.Op{clientv3.OpGet(qp, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))}
	if head == nil {
		// Nobody queued: every key of the prefix (none) has revision 0.
		return clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(qp), "=", 0).WithPrefix()}, plain, read)
	}
	qk := b.queueKey(key, head.token)
	// Nobody ahead of it, checked by one key, not by the whole queue
	// (which etcd would read entry by entry in its apply loop): an entry
	// older than the head's, there now, has been there since before the
	// head was created (a create revision is the revision that wrote it,
	// and an entry deleted and written again gets a new one, younger than
	// every entry there), so it was there when the hint was read, at the
	// same revision. That read saw every entry older than the head: none,
	// or the one it skipped. So the check is that the head's entry is
	// still at its place and the skipped one is not (gone, or written
	// again behind it).
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(qk), "=", head.createRev)}
	if head.skip != "" {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(b.queueKey(key, head.skip)), "!=", head.skipRev))
	}
	handoff, ttl, owner := decodeQueue(head.value)
	if !handoff || head.token == token || head.lease == 0 {
		// A head that takes no handoff: the plain release wakes it (and
		// should its next request have asked for handoffs, it grants
		// itself as before).
		return clientv3.OpTxn(cmps, plain, read)
	}
	// The grant rides the entry's lease, and carries the owner and TTL of
	// its value, as last written.
	cmps = append(cmps,
		clientv3.Compare(clientv3.LeaseValue(qk), "=", clientv3.LeaseID(head.lease)),
		clientv3.Compare(clientv3.Value(qk), "=", string(head.value)))
	grant := append([]clientv3.Op{
		clientv3.OpPut(ek, exclusive{token: head.token, holds: 1, ttl: ttl, owner: owner, fence: fencePending}.encode(), clientv3.WithLease(clientv3.LeaseID(head.lease))),
		clientv3.OpDelete(qk),
	}, extra...)
	return clientv3.OpTxn(cmps, grant, read)
}

// headRead returns, from the response to an operation of lastHold at
// index i whose check failed, the queue's head it read; ok is false when
// the check passed (the hold was dropped).
func (b *Backend) headRead(resp *clientv3.TxnResponse, i int) (head *headHint, ok bool) {
	t := resp.Responses[i].GetResponseTxn()
	if t.GetSucceeded() {
		return nil, false
	}
	return b.headOf(t.GetResponses()[0].GetResponseRange().GetKvs()), true
}

// guess returns the head of key's queue as the Backend last saw it, or
// nil (nobody queued, as far as the Backend knows). A hint of unknownHead
// (a grant handed to this Backend, whose head it never read) is looked up
// with one read: a wrong guess costs a transaction, a Raft commit.
func (b *Backend) guess(ctx context.Context, key string) *headHint {
	h, ok := b.hint(key)
	if !ok {
		return nil
	}
	if h.token != "" {
		return &h
	}
	resp, err := b.get(ctx, b.queuePrefix(key), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
	if err != nil {
		return nil // the transaction reads it
	}
	return b.headOf(resp.Kvs)
}

// unknownHead is the hint of a lock whose queue's head the Backend does
// not know (see guess).
var unknownHead = &headHint{}

// dropLast drops token's last hold of key's exclusive grant, whose key's
// mod revision is modRev, with extra (see lastHold): one transaction when
// the Backend's guess of the queue's head is right (or nobody is queued),
// and one more per wrong guess, each with the head that the last one read.
// It returns the response of the last transaction, whose outer check
// failed (els answered) when Succeeded is false.
func (b *Backend) dropLast(ctx context.Context, key, token string, modRev int64, extra, els []clientv3.Op) (*clientv3.TxnResponse, error) {
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(b.exclKey(key)), "=", modRev)}
	head, force := b.guess(ctx, key), false
	for i := 0; ; i++ {
		resp, err := b.txn(ctx, cmps, []clientv3.Op{b.lastHold(key, token, head, force, extra...)}, els)
		if err != nil {
			if isLeaseNotFound(err) && !force {
				// The head's entry lease ended as the grant was made:
				// the entry went with it, so the check could not pass,
				// but a store may refuse the whole transaction all the
				// same. Release without a handoff.
				force = true
				continue
			}
			return nil, err
		}
		if !resp.Succeeded {
			return resp, nil
		}
		next, again := b.headRead(resp, 0)
		if !again {
			return resp, nil
		}
		b.setHint(key, next)
		head = next
		// The queue keeps changing under us: give up the handoff rather
		// than the release.
		force = i >= maxAttempts
	}
}

// trackHanded tracks the grant kv that a release handed to token, which
// this Backend queued (its Listener saw the handoff), as a hold on the
// lease of token's entry, wanted as long as the entry was: as for a grant
// the Backend made, a release whose earlier try landed unanswered then
// finds the grant gone from a lease that still lives, and counts it as
// released (see liveAndGone), not as lost. A hold already tracked (a
// request of token claimed the grant first) stays.
func (b *Backend) trackHanded(key, token string, kv *mvccpb.KeyValue) {
	entry, ok := b.leases.tracked(b.queueKey(key, token), token)
	if !ok || entry.lease == nil || int64(entry.lease.id) != kv.Lease {
		return
	}
	b.leases.adopt(entry.lease, string(kv.Key), token, kv.ModRevision, entry.ttl, entry.deadline)
}

// adopt tracks a single hold of key by token on l, made by the write at
// revision fence (a handoff), unless the table tracks a hold of it already.
func (t *leaseTable) adopt(l *lease, key, token string, fence int64, ttl time.Duration, deadline time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, had := t.holds[holdID{key, token}]; !had && !l.dead {
		t.trackLocked(l, key, token, fence, fence, 1, ttl, deadline)
		t.holds[holdID{key, token}].handed = true
	}
}
