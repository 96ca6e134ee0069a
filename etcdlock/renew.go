package etcdlock

import (
	"context"
	"sync"
	"time"

	"github.com/dlock-go/dlock/driver"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Renew implements driver.Backend. It reads the hold (one transaction) and
// keeps its lease alive until ttl from now: a lease shared with other
// grants was often kept alive recently enough already, and then costs
// nothing more.
func (b *Backend) Renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	r := b.RenewBatch(ctx, []driver.RenewRequest{{Key: key, Token: token, TTL: ttl}})[0]
	return r.Held, r.Err
}

// RenewGrant implements driver.GrantRenewer: Renew, of the grant with the
// given fence only (see fenceOf); a newer grant of the same token (an
// owner ID shared by processes) is neither extended nor reported as held.
func (b *Backend) RenewGrant(ctx context.Context, key, token string, fence uint64, ttl time.Duration) (bool, error) {
	r := b.RenewBatch(ctx, []driver.RenewRequest{{Key: key, Token: token, TTL: ttl, Fence: fence}})[0]
	return r.Held, r.Err
}

// renewChunk is how many requests share one read transaction: two reads
// each, under etcd's default limit of 128 operations per transaction.
const renewChunk = 64

// RenewBatch implements driver.BatchRenewer: one read transaction per 64
// requests, then one keep-alive per lease that needs one, whatever the
// number of grants on it. A request with a Fence renews only that grant
// (see RenewGrant).
func (b *Backend) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) []driver.RenewResult {
	defer b.leases.revokeIdle() // the renewals may leave a retired lease empty
	ctx, cancel := b.bound(ctx)
	defer cancel()
	out := make([]driver.RenewResult, len(reqs))
	sent := time.Now()
	found := make([]*mvccpb.KeyValue, len(reqs))
	other := make([]bool, len(reqs))
	for start := 0; start < len(reqs); start += renewChunk {
		chunk := reqs[start:min(start+renewChunk, len(reqs))]
		ops := make([]clientv3.Op, 0, 2*len(chunk))
		for _, r := range chunk {
			ops = append(ops, clientv3.OpGet(b.exclKey(r.Key)), clientv3.OpGet(b.sharedKey(r.Key, r.Token)))
		}
		resp, err := b.read(ctx, nil, ops, nil)
		for i, r := range chunk {
			if err != nil {
				out[start+i].Err = wrap(err)
				continue
			}
			var kv *mvccpb.KeyValue
			fence := int64(0)
			if kvs := rangeKVs(resp, 2*i); len(kvs) == 1 && decodeExclusive(kvs[0].Value).token == r.Token {
				kv, fence = kvs[0], fenceOf(kvs[0])
			} else if kvs := rangeKVs(resp, 2*i+1); len(kvs) == 1 {
				kv, fence = kvs[0], kvs[0].CreateRevision
			}
			if kv != nil && r.Fence != 0 && fence != int64(r.Fence) {
				// Another grant of the token (RenewGrant): not this one,
				// which is gone; the other stays tracked.
				other[start+i] = true
				continue
			}
			found[start+i] = kv
		}
	}

	// Group the holds found by lease; one extend per lease.
	type group struct {
		l     *lease // nil for another Backend's lease
		need  time.Time
		items []int
	}
	groups := make(map[clientv3.LeaseID]*group)
	for i, kv := range found {
		if out[i].Err != nil {
			continue
		}
		r := reqs[i]
		if kv == nil {
			if other[i] {
				continue
			}
			b.leases.untrack(b.exclKey(r.Key), r.Token)
			b.leases.untrack(b.sharedKey(r.Key, r.Token), r.Token)
			continue
		}
		id := clientv3.LeaseID(kv.Lease)
		g := groups[id]
		if g == nil {
			g = &group{l: b.leases.mine(id)}
			groups[id] = g
		}
		if g.l != nil {
			count, fence := 1, kv.CreateRevision
			if string(kv.Key) == b.exclKey(r.Key) {
				count, fence = decodeExclusive(kv.Value).holds, fenceOf(kv)
			}
			b.leases.track(g.l, string(kv.Key), r.Token, fence, kv.ModRevision, count, r.TTL, sent.Add(r.TTL))
		}
		g.need = later(g.need, sent.Add(r.TTL))
		g.items = append(g.items, i)
	}

	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			switch {
			case g.l == nil:
				// Another Backend's lease (an owner ID shared with another
				// process): never keep it alive, as its TTL is not ours
				// and it may carry grants its Backend abandoned. Move.
				err = errRetired
			case g.l.entries:
				err = errRetired // a grant handed on a queue entry's lease: move
			case g.l.ttl < g.need.Sub(sent):
				err = errRetired // a longer TTL than the lease's: move
			default:
				err = b.leases.extend(ctx, g.l, g.need)
			}
			for _, i := range g.items {
				switch {
				case err == nil:
					out[i].Held = true
				case err == errRetired:
					out[i].Held, out[i].Err = b.migrate(ctx, found[i], reqs[i], sent)
				case isLeaseNotFound(err):
					// The lease and every key on it are gone.
				default:
					out[i].Err = wrap(err)
				}
			}
		}()
	}
	wg.Wait()
	return out
}

// migrate moves the hold kv of r from a retired lease, or another
// Backend's, to a fresh one of this Backend's, in one transaction that
// checks that kv is unchanged; its fence stays. A grant moved from another Backend's lease
// gets a lease of the longest TTL its holders asked for, so that the other
// Backend's holder keeps it until its next renewal.
func (b *Backend) migrate(ctx context.Context, kv *mvccpb.KeyValue, r driver.RenewRequest, sent time.Time) (bool, error) {
	k := string(kv.Key)
	ttl := r.TTL
	foreign := b.leases.mine(clientv3.LeaseID(kv.Lease)) == nil
	if foreign {
		if k == b.exclKey(r.Key) {
			ttl = max(ttl, decodeExclusive(kv.Value).ttl)
		} else {
			_, held, _ := decodeShared(kv.Value)
			ttl = max(ttl, held)
		}
	}
	l, err := b.leases.forTTL(ctx, ttl)
	if err != nil {
		return false, wrap(err)
	}
	var resp *clientv3.TxnResponse
	for attempt := 0; ; attempt++ {
		// The value stays, but for a fence that the move must write out
		// (see exclusive.rewritten).
		put := clientv3.OpPut(k, "", clientv3.WithIgnoreValue(), clientv3.WithLease(l.id))
		if k == b.exclKey(r.Key) {
			if e := decodeExclusive(kv.Value); e.fence == fencePending {
				put = clientv3.OpPut(k, e.rewritten(kv).encode(), clientv3.WithLease(l.id))
			}
		}
		// A move of unknown outcome may leave the key on l: see pend.
		p := b.leases.pend(l, k, r.Token, sent.Add(r.TTL))
		// The key's mod revision stands for the grant and its lease (any
		// write changes it; a handoff keeps the create revision).
		resp, err = b.txnFull(ctx,
			[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k), "=", kv.ModRevision)},
			[]clientv3.Op{put},
			[]clientv3.Op{clientv3.OpGet(k)})
		if err != nil {
			if isLeaseNotFound(err) {
				b.leases.forget(l)
			}
			return false, wrap(err)
		}
		b.leases.resolve(p)
		b.leases.untrack(k, r.Token)
		if resp.Succeeded {
			break
		}
		// A write that kept the grant on its lease (a proclaim, which
		// changes only the owner) is moved again; anything else (gone,
		// or moved by another Backend that shares the owner ID, to a
		// lease this one cannot vouch for) is not held, as far as we know.
		now := rangeKVs(resp, 0)
		if attempt+1 >= maxAttempts || len(now) != 1 || !sameGrant(b, r.Key, r.Token, kv, now[0]) {
			return false, nil
		}
		kv = now[0]
	}
	count, fence := 1, kv.CreateRevision
	if k == b.exclKey(r.Key) {
		count, fence = decodeExclusive(kv.Value).holds, fenceOf(kv)
	}
	deadline := sent.Add(r.TTL)
	if foreign {
		// The other Backend's holder may have renewed the grant on its
		// own lease until the move applied, after l was chosen: it counts
		// on it until then + its TTL. So l must live ttl past the answer,
		// and the hold counts as wanted until then (neither retired as
		// abandoned nor revoked before).
		b.leases.coverMoved(ctx, l, k, r.Token, fence, resp.Header.Revision, count, ttl, deadline)
		return true, nil
	}
	b.leases.track(l, k, r.Token, fence, resp.Header.Revision, count, r.TTL, deadline)
	return true, nil
}

// sameGrant reports whether now, a read of the key of kv, is still the
// grant that kv was, on the same lease: the same token and fence, with
// only its value rewritten since (a proclaim's new owner, a re-entry).
func sameGrant(b *Backend, key, token string, kv, now *mvccpb.KeyValue) bool {
	if now.Lease != kv.Lease || now.CreateRevision != kv.CreateRevision {
		return false
	}
	if string(now.Key) != b.exclKey(key) {
		return true // a shared hold: its key is the token's own
	}
	return decodeExclusive(now.Value).token == token && fenceOf(now) == fenceOf(kv)
}

// coverMoved tracks a grant that was just moved onto l from another
// Backend's lease (an owner ID shared by processes) as wanted until ttl
// from now at least, and keeps l alive until then: the other Backend's
// holder may have renewed the grant on its own lease until the move
// applied, after l was chosen, and counts on it until then + its TTL (ttl
// covers the longest its holders asked for). Best effort: this Backend's
// own holder is covered by l already (see forTTL).
func (t *leaseTable) coverMoved(ctx context.Context, l *lease, key, token string, fence, modRev int64, count int, ttl time.Duration, deadline time.Time) {
	until := time.Now().Add(ttl)
	t.track(l, key, token, fence, modRev, count, ttl, later(deadline, until))
	_ = t.extend(ctx, l, until)
}
