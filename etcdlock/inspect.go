package etcdlock

import (
	"context"
	"math"
	"sort"
	"time"

	"github.com/dlock-go/dlock/driver"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Inspect implements driver.Inspector. TTLs come from the holds' leases
// (one LeaseTimeToLive per lease); HeldFor is 0, as etcd keeps no time of
// its own with a key.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	ctx, cancel := b.bound(ctx)
	defer cancel()
	resp, err := b.get(ctx, b.dir(key), clientv3.WithPrefix())
	if err != nil {
		return driver.LockInfo{}, false, wrap(err)
	}
	infos, err := b.describe(ctx, resp.Kvs)
	if err != nil {
		return driver.LockInfo{}, false, wrap(err)
	}
	for _, info := range infos {
		if info.Key == key {
			return info, true, nil
		}
	}
	return driver.LockInfo{}, false, nil
}

// List implements driver.Inspector.
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	ctx, cancel := b.bound(ctx)
	defer cancel()
	start := b.ns + prefix
	resp, err := b.get(ctx, start, clientv3.WithRange(prefixEnd(start)))
	if err != nil {
		return nil, wrap(err)
	}
	infos, err := b.describe(ctx, resp.Kvs)
	if err != nil {
		return nil, wrap(err)
	}
	return infos, nil
}

// describe turns the keys of some locks' directories into LockInfos of the
// held ones, in key order.
func (b *Backend) describe(ctx context.Context, kvs []*mvccpb.KeyValue) ([]driver.LockInfo, error) {
	byKey := make(map[string]*driver.LockInfo)
	var keys []string
	info := func(key string) *driver.LockInfo {
		i := byKey[key]
		if i == nil {
			i = &driver.LockInfo{Key: key}
			byKey[key] = i
			keys = append(keys, key)
		}
		return i
	}
	ttls := make(map[int64]time.Duration)
	ttl := func(id int64) (time.Duration, error) {
		if d, ok := ttls[id]; ok {
			return d, nil
		}
		resp, err := b.c.TimeToLive(ctx, clientv3.LeaseID(id))
		if err != nil {
			return 0, err
		}
		d := time.Duration(max(resp.TTL, 0)) * time.Second
		ttls[id] = d
		return d, nil
	}
	type shared struct {
		hold  driver.SharedHold
		limit int
	}
	sharedOf := make(map[string][]shared)
	for _, kv := range kvs {
		key, kind, _, ok := b.parseKey(string(kv.Key))
		if !ok {
			continue
		}
		switch kind {
		case exclSuffix:
			e := decodeExclusive(kv.Value)
			d, err := ttl(kv.Lease)
			if err != nil {
				return nil, err
			}
			i := info(key)
			if e.ttl > 0 {
				d = min(d, e.ttl)
			}
			i.Owner, i.Fence, i.Holds, i.TTL = e.owner, uint64(fenceOf(kv)), e.holds, d
		case sharedInfix[:1]:
			limit, _, owner := decodeShared(kv.Value)
			d, err := ttl(kv.Lease)
			if err != nil {
				return nil, err
			}
			info(key)
			sharedOf[key] = append(sharedOf[key], shared{driver.SharedHold{Owner: owner, Fence: uint64(kv.CreateRevision), TTL: d}, limit})
		case intentInfix[:1]:
			info(key).WriterWaiting = true
		case queueInfix[:1]:
			info(key).Queued++
		}
	}
	var out []driver.LockInfo
	sort.Strings(keys)
	for _, key := range keys {
		i := byKey[key]
		hs := sharedOf[key]
		sort.Slice(hs, func(a, c int) bool { return hs[a].hold.Fence < hs[c].hold.Fence })
		for _, h := range hs {
			i.Shared = append(i.Shared, h.hold)
		}
		if len(hs) > 0 {
			i.Limit = hs[len(hs)-1].limit
		}
		if i.Owner == "" && len(i.Shared) == 0 {
			continue // only a writer intent: not held
		}
		out = append(out, *i)
	}
	return out, nil
}

// ForceRelease implements driver.Inspector: one transaction reads and
// deletes the exclusive holder and every shared hold, and wakes every
// waiter (see forcedMark); writer intents stay. A lock that nobody holds
// costs one read-only transaction, and no record is written: there is
// nobody to wake.
func (b *Backend) ForceRelease(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	ctx, cancel := b.bound(ctx)
	defer cancel()
	ek, sp := b.exclKey(key), b.sharedPrefix(key)
	free, err := b.txn(ctx, []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(ek), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(sp), "=", 0).WithPrefix(),
	}, nil, nil)
	if err != nil {
		return driver.LockInfo{}, false, wrap(err)
	}
	if free.Succeeded {
		return driver.LockInfo{Key: key}, false, nil
	}
	// Held a moment ago: should its holds be gone by the time of the
	// delete, the record only wakes waiters for nothing.
	mark, err := b.forcedMark(ctx, key)
	if err != nil {
		return driver.LockInfo{}, false, wrap(err)
	}
	resp, err := b.txn(ctx, nil, []clientv3.Op{
		clientv3.OpDelete(ek, clientv3.WithPrevKV()),
		clientv3.OpDelete(sp, clientv3.WithPrefix(), clientv3.WithPrevKV()),
		mark,
	}, nil)
	if err != nil {
		return driver.LockInfo{}, false, wrap(err)
	}
	var kvs []*mvccpb.KeyValue
	kvs = append(kvs, resp.Responses[0].GetResponseDeleteRange().GetPrevKvs()...)
	kvs = append(kvs, resp.Responses[1].GetResponseDeleteRange().GetPrevKvs()...)
	infos, err := b.describe(ctx, kvs)
	if err != nil || len(infos) == 0 {
		// Deleted; the description is what could not be told.
		return driver.LockInfo{Key: key}, len(kvs) > 0, nil
	}
	return infos[0], true, nil
}

// BreakIf implements driver.Breaker: it deletes the exclusive holder's key
// when its grant's fence (see fenceOf) is fence, and wakes every waiter
// (see forcedMark).
func (b *Backend) BreakIf(ctx context.Context, key string, fence uint64) (bool, error) {
	ctx, cancel := b.bound(ctx)
	defer cancel()
	if fence == 0 || fence > math.MaxInt64 {
		return false, nil // no grant has it
	}
	ek := b.exclKey(key)
	mark, err := b.forcedMark(ctx, key)
	if err != nil {
		return false, wrap(err)
	}
	// The first try compares the key's create revision, the fence of a
	// grant whose key was never written since it was created (version 1).
	// A handed grant's key keeps the create revision of whoever created
	// it, some earlier holder's fence, and always has a version of 2 or
	// more (the handoff overwrote it): it, and every key rewritten since
	// (a re-entry, a renewal that moved it, a handoff chain), is compared
	// as read (see fenceOf), and deleted only if unchanged since.
	resp, err := b.txn(ctx,
		[]clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(ek), "=", int64(fence)),
			clientv3.Compare(clientv3.Version(ek), "=", 1),
		},
		[]clientv3.Op{clientv3.OpDelete(ek), mark}, []clientv3.Op{clientv3.OpGet(ek)})
	for range maxAttempts {
		if err != nil {
			return false, wrap(err)
		}
		if resp.Succeeded {
			return true, nil
		}
		// Compare the grant's fence as read (see exclusive).
		kvs := rangeKVs(resp, 0)
		if len(kvs) != 1 || fenceOf(kvs[0]) != int64(fence) {
			return false, nil
		}
		resp, err = b.txn(ctx,
			[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(ek), "=", kvs[0].ModRevision)},
			[]clientv3.Op{clientv3.OpDelete(ek), mark}, []clientv3.Op{clientv3.OpGet(ek)})
	}
	return false, nil
}

// forcedToken is the token of the record that a forced release writes
// (r\x00forcedToken, see forcedMark): no real token holds a control
// character.
const forcedToken = "\x01forced"

// forcedMark returns the write that tells every Listener of key that its
// holder was removed by force: a release record of forcedToken (which
// expires by itself, as every release record does), whose put wakes every
// waiter, not only the queue's head. A forced release may have removed a
// grant that no release hands on (the head's, or a holder's whose waiters
// only the holder's release would have woken), and the head may be gone.
func (b *Backend) forcedMark(ctx context.Context, key string) (clientv3.Op, error) {
	id, err := b.leases.forQueue(ctx, b.releasedFor())
	if err != nil {
		return clientv3.Op{}, err
	}
	return clientv3.OpPut(b.releasedKey(key, forcedToken), "", clientv3.WithLease(id)), nil
}
