package redlock

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// lookup is one node's description of a lock.
type lookup struct {
	info driver.LockInfo
	held bool
}

// Inspect describes the lock named key by asking every node at once, each
// bounded by min(4 × node timeout, 1s) but at least one node timeout. The
// lock's exclusive holder counts when a quorum of nodes hold it with the
// same owner; then Fence is the highest fence among them, Holds and TTL the
// Q-th highest (what the quorum still has: the lock loses its quorum after
// that many releases, or that long without renewal), HeldFor the longest,
// and Delayed is set when fewer than a quorum of them are still inside
// their lease (the lock only sits out its lock-delay). A shared hold counts
// when a quorum of nodes have it (one hold is known on every node by its
// owner and fence, which the grant made the same on its quorum); Shared
// lists those, oldest grant first, each with the Q-th highest TTL.
// WriterWaiting is set when a quorum of nodes report a live writer intent,
// and Queued and Limit are the Q-th highest of the nodes' values. ok is
// false, with a nil error, when neither an exclusive holder nor a shared
// hold counts. The error is a *QuorumError (Op "inspect") when fewer than a
// quorum of nodes answered.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	found, err := b.lookupAll(ctx, "inspect", key, func(ctx context.Context, n *node) (lookup, error) {
		info, held, err := n.b.Inspect(ctx, key)
		return lookup{info, held}, err
	})
	if err != nil {
		return driver.LockInfo{}, false, err
	}
	info, held := merge(found, b.Quorum(), b.Quorum())
	if !held {
		return driver.LockInfo{}, false, nil
	}
	return info, true, nil
}

// ForceRelease deletes the lock named key on every node, whoever holds it
// (the exclusive holder and every shared hold; writer intents stay), and
// wakes waiters on each; the fence counters stay. ok is true when any node
// held it; info then describes what was removed: the exclusive owner found
// on the most nodes, merged as in Inspect over at most a quorum of them,
// and every shared hold found on any node. The error is a *QuorumError (Op
// "force release") when fewer than a quorum of nodes answered, since the
// lock may then still be held on a quorum.
func (b *Backend) ForceRelease(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	found, err := b.lookupAll(ctx, "force release", key, func(ctx context.Context, n *node) (lookup, error) {
		info, held, err := n.b.ForceRelease(ctx, key)
		return lookup{info, held}, err
	})
	if err != nil {
		return driver.LockInfo{}, false, err
	}
	info, held := merge(found, b.Quorum(), 1)
	return info, held, nil
}

// lookupAll runs call on every node and waits for all; it returns what the
// nodes that hold the lock said, or a QuorumError when fewer than a quorum
// answered.
func (b *Backend) lookupAll(ctx context.Context, op, key string, call func(ctx context.Context, n *node) (lookup, error)) ([]driver.LockInfo, error) {
	limit := b.callLimit()
	g := newGather(b, fanOut(b, ctx, limit, call), limit)
	defer g.stop()
	var found []driver.LockInfo
	answered, errs := g.collect(ctx, b, func(ans answer[lookup], answered int) {
		if ans.val.held {
			found = append(found, ans.val.info)
		}
	})
	if answered < b.Quorum() {
		return nil, b.quorumError(ctx, op, key, answered, errs)
	}
	return found, nil
}

// List describes every lock whose key starts with prefix that has an
// exclusive holder or shared holds on a quorum of nodes, merged as in
// Inspect, sorted by key. Each
// node walks its keys (see redislock.Backend.List) at the same time, bounded
// by ctx and 10 seconds. The error is a *QuorumError (Op "list") when fewer
// than a quorum of nodes answered.
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	limit := max(listTimeout, b.callLimit())
	g := newGather(b, fanOut(b, ctx, limit, func(ctx context.Context, n *node) ([]driver.LockInfo, error) {
		return n.b.List(ctx, prefix)
	}), limit)
	defer g.stop()
	byKey := make(map[string][]driver.LockInfo)
	answered, errs := g.collect(ctx, b, func(ans answer[[]driver.LockInfo], answered int) {
		for _, info := range ans.val {
			byKey[info.Key] = append(byKey[info.Key], info)
		}
	})
	if answered < b.Quorum() {
		return nil, b.quorumError(ctx, "list", prefix, answered, errs)
	}
	var infos []driver.LockInfo
	for _, found := range byKey {
		if info, held := merge(found, b.Quorum(), b.Quorum()); held {
			infos = append(infos, info)
		}
	}
	slices.SortFunc(infos, func(x, y driver.LockInfo) int { return strings.Compare(x.Key, y.Key) })
	return infos, nil
}

// merge combines the descriptions of one lock from the nodes that hold it
// and reports whether anything in it is found on need nodes or more (a
// quorum, or 1 for what ForceRelease removed). A value found on c nodes
// takes the min(q, c)-th highest of their values: what that many nodes
// still have.
//
// The exclusive holder is the owner held on the most nodes (the higher
// fence on a tie): Fence the highest, HeldFor the longest, Holds and TTL
// merged as above, Delayed when fewer than min(q, c) of them are inside
// their lease; it is left out (Owner "") when on fewer than need nodes.
// Shared holds: see mergeShared. WriterWaiting needs a quorum of nodes;
// Queued and Limit are merged over the nodes that hold the lock.
func merge(found []driver.LockInfo, q, need int) (driver.LockInfo, bool) {
	if len(found) == 0 {
		return driver.LockInfo{}, false
	}
	merged := driver.LockInfo{Key: found[0].Key}
	byOwner := make(map[string][]driver.LockInfo)
	for _, info := range found {
		if info.Owner != "" {
			byOwner[info.Owner] = append(byOwner[info.Owner], info)
		}
	}
	var best []driver.LockInfo
	var bestFence uint64
	for _, group := range byOwner {
		var fence uint64
		for _, info := range group {
			fence = max(fence, info.Fence)
		}
		if len(group) > len(best) || (len(group) == len(best) && fence > bestFence) {
			best, bestFence = group, fence
		}
	}
	if len(best) >= need {
		k := min(q, len(best))
		merged.Owner, merged.Fence = best[0].Owner, bestFence
		live := 0
		holds := make([]int, 0, len(best))
		ttls := make([]time.Duration, 0, len(best))
		for _, info := range best {
			merged.HeldFor = max(merged.HeldFor, info.HeldFor)
			holds = append(holds, info.Holds)
			ttls = append(ttls, info.TTL)
			if !info.Delayed {
				live++
			}
		}
		merged.Holds = kthHighest(holds, k)
		merged.TTL = kthHighest(ttls, k)
		merged.Delayed = live < k
	}
	merged.Shared = mergeShared(found, q, need)

	waiting := 0
	queued := make([]int, 0, len(found))
	limits := make([]int, 0, len(found))
	for _, info := range found {
		if info.WriterWaiting {
			waiting++
		}
		queued = append(queued, info.Queued)
		limits = append(limits, info.Limit)
	}
	k := min(q, len(found))
	merged.WriterWaiting = waiting >= q
	merged.Queued = kthHighest(queued, k)
	if len(merged.Shared) > 0 {
		merged.Limit = kthHighest(limits, k)
	}
	return merged, merged.Owner != "" || len(merged.Shared) > 0
}

// mergeShared returns the shared holds found on need nodes or more, oldest
// grant first (by fence), each with the min(q, c)-th highest TTL of the c
// nodes that have it. A hold is known by its owner and fence, which are
// the same on every node of the quorum that granted it (the grant's fence
// is raised to one value there); a copy with another fence, on a node that
// has not been raised yet, counts apart. Holds that share owner and fence
// (readers of one process, granted at once) are told apart by count: each
// node's copies are matched in order of TTL.
func mergeShared(found []driver.LockInfo, q, need int) []driver.SharedHold {
	type id struct {
		owner string
		fence uint64
	}
	// copies[id][j] is the TTLs of the j-th hold with that id, one per node
	// that has at least j+1 of them.
	copies := make(map[id][][]time.Duration)
	for _, info := range found {
		mine := make(map[id][]time.Duration)
		for _, h := range info.Shared {
			k := id{h.Owner, h.Fence}
			mine[k] = append(mine[k], h.TTL)
		}
		for k, ttls := range mine {
			slices.SortFunc(ttls, func(x, y time.Duration) int { return cmp.Compare(y, x) })
			for j, ttl := range ttls {
				if j == len(copies[k]) {
					copies[k] = append(copies[k], nil)
				}
				copies[k][j] = append(copies[k][j], ttl)
			}
		}
	}
	var holds []driver.SharedHold
	for k, byCopy := range copies {
		for _, ttls := range byCopy {
			if len(ttls) >= need {
				holds = append(holds, driver.SharedHold{Owner: k.owner, Fence: k.fence, TTL: kthHighest(ttls, min(q, len(ttls)))})
			}
		}
	}
	slices.SortFunc(holds, func(x, y driver.SharedHold) int {
		return cmp.Or(cmp.Compare(x.Fence, y.Fence), strings.Compare(x.Owner, y.Owner), cmp.Compare(y.TTL, x.TTL))
	})
	return holds
}

// kthHighest returns the k-th highest of vals (1 is the highest); vals is
// not empty and k is in [1, len(vals)].
func kthHighest[T cmp.Ordered](vals []T, k int) T {
	sorted := slices.Clone(vals)
	slices.SortFunc(sorted, func(x, y T) int { return cmp.Compare(y, x) })
	return sorted[k-1]
}
