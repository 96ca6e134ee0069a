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
// lock counts as held when a quorum of nodes hold it with the same owner;
// then Fence is the highest fence among them, Holds and TTL the Q-th highest
// (what the quorum still has: the lock loses its quorum after that many
// releases, or that long without renewal), HeldFor the longest, and Delayed
// is set when fewer than a quorum of them are still inside their lease (the
// lock only sits out its lock-delay). ok is false, with a nil error, when no
// owner holds it on a quorum. The error is a *QuorumError (Op "inspect")
// when fewer than a quorum of nodes answered.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	found, err := b.lookupAll(ctx, "inspect", key, func(ctx context.Context, n *node) (lookup, error) {
		info, held, err := n.b.Inspect(ctx, key)
		return lookup{info, held}, err
	})
	if err != nil {
		return driver.LockInfo{}, false, err
	}
	info, count := merge(found, b.Quorum())
	if count < b.Quorum() {
		return driver.LockInfo{}, false, nil
	}
	return info, true, nil
}

// ForceRelease deletes the lock named key on every node, whoever holds it,
// and wakes waiters on each; the fence counters stay. ok is true when any
// node held it; info then describes the owner found on the most nodes,
// merged as in Inspect over at most a quorum of them. The error is a
// *QuorumError (Op "force release") when fewer than a quorum of nodes
// answered, since the lock may then still be held on a quorum.
func (b *Backend) ForceRelease(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	found, err := b.lookupAll(ctx, "force release", key, func(ctx context.Context, n *node) (lookup, error) {
		info, held, err := n.b.ForceRelease(ctx, key)
		return lookup{info, held}, err
	})
	if err != nil {
		return driver.LockInfo{}, false, err
	}
	info, count := merge(found, b.Quorum())
	return info, count > 0, nil
}

// lookupAll runs call on every node and waits for all; it returns what the
// nodes that hold the lock said, or a QuorumError when fewer than a quorum
// answered.
func (b *Backend) lookupAll(ctx context.Context, op, key string, call func(ctx context.Context, n *node) (lookup, error)) ([]driver.LockInfo, error) {
	timeout := b.slowTimeout()
	g := newGather(b, fanOut(b, ctx, timeout, call), timeout)
	defer g.stop()
	var found []driver.LockInfo
	answered, errs := g.collect(ctx, b, func(ans answer[lookup], answered int) {
		if ans.val.held {
			found = append(found, ans.val.info)
		}
	})
	if answered < b.Quorum() {
		return nil, b.quorumError(op, key, answered, errs)
	}
	return found, nil
}

// List describes every lock whose key starts with prefix that a quorum of
// nodes hold with the same owner, merged as in Inspect, sorted by key. Each
// node walks its keys (see redislock.Backend.List) at the same time, bounded
// by ctx and 10 seconds. The error is a *QuorumError (Op "list") when fewer
// than a quorum of nodes answered.
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	timeout := max(listTimeout, b.slowTimeout())
	g := newGather(b, fanOut(b, ctx, timeout, func(ctx context.Context, n *node) ([]driver.LockInfo, error) {
		return n.b.List(ctx, prefix)
	}), timeout)
	defer g.stop()
	byKey := make(map[string][]driver.LockInfo)
	answered, errs := g.collect(ctx, b, func(ans answer[[]driver.LockInfo], answered int) {
		for _, info := range ans.val {
			byKey[info.Key] = append(byKey[info.Key], info)
		}
	})
	if answered < b.Quorum() {
		return nil, b.quorumError("list", prefix, answered, errs)
	}
	var infos []driver.LockInfo
	for _, found := range byKey {
		if info, count := merge(found, b.Quorum()); count >= b.Quorum() {
			infos = append(infos, info)
		}
	}
	slices.SortFunc(infos, func(x, y driver.LockInfo) int { return strings.Compare(x.Key, y.Key) })
	return infos, nil
}

// merge combines the descriptions of one lock from the nodes that hold it.
// It picks the owner held on the most nodes (the higher fence on a tie) and
// returns their merged description and how many nodes that is: Fence the
// highest, HeldFor the longest, Holds and TTL the q-th highest (or the
// lowest, with fewer than q nodes), Delayed when fewer than q of them are
// inside their lease.
func merge(found []driver.LockInfo, q int) (driver.LockInfo, int) {
	if len(found) == 0 {
		return driver.LockInfo{}, 0
	}
	byOwner := make(map[string][]driver.LockInfo)
	for _, info := range found {
		byOwner[info.Owner] = append(byOwner[info.Owner], info)
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
	k := min(q, len(best)) // the k-th highest is what k nodes still have
	merged := driver.LockInfo{Key: best[0].Key, Owner: best[0].Owner, Fence: bestFence}
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
	slices.SortFunc(holds, func(x, y int) int { return cmp.Compare(y, x) })
	slices.SortFunc(ttls, func(x, y time.Duration) int { return cmp.Compare(y, x) })
	merged.Holds = holds[k-1]
	merged.TTL = ttls[k-1]
	merged.Delayed = live < k
	return merged, len(best)
}
