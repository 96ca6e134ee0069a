// Inspection: Inspect, ForceRelease, and List, which scans every master or
// shard for the held locks under a prefix.

package redislock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
)

// scanCount is the COUNT hint of each SCAN call in List.
const scanCount = 500

// Inspect describes the lock named key in one script: its exclusive
// holder's owner, the fence of the grant, the total hold count and the
// remaining TTL; its live shared holds, oldest grant first, and the Limit
// of the newest; the live entries of its fair queue and whether a writer
// intent is live. ok is false, with a nil error, when the lock has neither
// an exclusive holder nor a live shared hold.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	if b.err != nil {
		return driver.LockInfo{}, false, b.err
	}
	info, ok, err := parseInfo(key, inspectScript.Run(ctx, b.rdb, b.stateKeys(key)))
	if err != nil {
		return driver.LockInfo{}, false, b.storeError(ctx, "inspect", key, err)
	}
	return info, ok, nil
}

// ForceRelease deletes the lock named key whoever holds it, the exclusive
// holder and every shared hold, publishes on its release channel for every
// waiter and returns what it removed, all in one script. The fence counter
// stays, so the next grant still gets a larger fence; so do the fair queue
// and a writer intent, which belong to waiters. ok is false, with a nil
// error, when the lock was not held.
func (b *Backend) ForceRelease(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	if b.err != nil {
		return driver.LockInfo{}, false, b.err
	}
	cmd := forceReleaseScript.Run(ctx, b.rdb, b.stateKeys(key), b.channel(key), b.publish)
	info, ok, err := parseInfo(key, cmd)
	if err != nil {
		return driver.LockInfo{}, false, b.storeError(ctx, "force release", key, err)
	}
	return info, ok, nil
}

// BreakIf deletes the exclusive hold of key when its grant's fence is fence
// and it has no lock-delay, and publishes on the release channel for every
// waiter, in one script (driver.Breaker). Shared holds, the fair queue, a
// writer intent and the fence counter stay.
func (b *Backend) BreakIf(ctx context.Context, key string, fence uint64) (bool, error) {
	if b.err != nil {
		return false, b.err
	}
	n, err := breakIfScript.Run(ctx, b.rdb, []string{b.lockKey(key)}, strconv.FormatUint(fence, 10), b.channel(key), b.publish).Int()
	if err != nil {
		return false, b.storeError(ctx, "break", key, err)
	}
	return n == 1, nil
}

// List describes every held lock whose key starts with prefix, sorted by
// key: those with an exclusive holder or live shared holds. It walks the
// namespace with SCAN (on every master of a Cluster, on every shard of a
// Ring), finds the locks by their hash or their set of shared holds, and
// inspects each page of locks in one pipeline, so it costs one round trip
// per page; a lock taken or released during the walk may or may not be
// listed.
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	if b.err != nil {
		return nil, b.err
	}
	pattern := globEscape(b.ns) + ":{" + globEscape(prefix) + "*"
	var (
		mu    sync.Mutex
		infos []driver.LockInfo
	)
	scan := func(ctx context.Context, node redis.Cmdable) error {
		found, err := b.listNode(ctx, node, pattern)
		mu.Lock()
		infos = append(infos, found...)
		mu.Unlock()
		return err
	}
	var err error
	switch c := b.rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error { return scan(ctx, node) })
	case *redis.Ring:
		err = c.ForEachShard(ctx, func(ctx context.Context, node *redis.Client) error { return scan(ctx, node) })
	default:
		err = scan(ctx, b.rdb)
	}
	if err != nil {
		return nil, b.storeError(ctx, "list", prefix, err)
	}
	slices.SortFunc(infos, func(a, b driver.LockInfo) int { return strings.Compare(a.Key, b.Key) })
	// SCAN may return a key twice; keep the first.
	infos = slices.CompactFunc(infos, func(a, b driver.LockInfo) bool { return a.Key == b.Key })
	return infos, nil
}

// listNode scans one node for lock hashes and sets of shared holds matching
// pattern and inspects each lock once.
func (b *Backend) listNode(ctx context.Context, node redis.Cmdable, pattern string) ([]driver.LockInfo, error) {
	var infos []driver.LockInfo
	var cursor uint64
	seen := make(map[string]bool)
	for {
		names, next, err := node.Scan(ctx, cursor, pattern, scanCount).Result()
		if err != nil {
			return infos, err
		}
		var keys []string
		var calls []scriptCall
		for _, name := range names {
			if key, ok := b.keyOfLock(name); ok && !seen[key] {
				seen[key] = true
				keys = append(keys, key)
				calls = append(calls, scriptCall{keys: b.stateKeys(key)})
			}
		}
		if len(calls) > 0 {
			for i, cmd := range runPipelined(ctx, node, inspectScript, calls) {
				info, ok, err := parseInfo(keys[i], cmd)
				if err != nil {
					return infos, fmt.Errorf("inspect %q: %w", keys[i], err)
				}
				if ok { // not released since the SCAN
					infos = append(infos, info)
				}
			}
		}
		if cursor = next; cursor == 0 {
			return infos, nil
		}
	}
}

// parseInfo reads the reply of the inspect and force_release scripts:
// {owner, fence, holds, pttl, held for in ms or -1, 1 when in lock-delay,
// queued, 1 when a writer waits, limit, {{owner, fence, pttl}...}}, or nil
// when the lock is not held.
func parseInfo(key string, cmd *redis.Cmd) (driver.LockInfo, bool, error) {
	reply, err := cmd.Slice()
	if errors.Is(err, redis.Nil) {
		return driver.LockInfo{}, false, nil
	}
	if err != nil {
		return driver.LockInfo{}, false, err
	}
	if len(reply) != 10 {
		return driver.LockInfo{}, false, fmt.Errorf("unexpected reply %v", reply)
	}
	owner, _ := reply[0].(string)
	fence, err1 := asUint64(reply[1])
	ints := make([]int64, 9)
	errs := []error{err1}
	for i := 2; i < 9; i++ {
		var err error
		ints[i], err = asInt64(reply[i])
		errs = append(errs, err)
	}
	if err := firstErr(errs...); err != nil {
		return driver.LockInfo{}, false, err
	}
	info := driver.LockInfo{
		Key: key, Owner: owner, Fence: fence, Holds: int(ints[2]), TTL: ttlOf(ints[3]),
		Delayed: ints[5] == 1, Queued: int(ints[6]), WriterWaiting: ints[7] == 1, Limit: int(ints[8]),
	}
	if heldFor := ints[4]; heldFor >= 0 {
		info.HeldFor = time.Duration(heldFor) * time.Millisecond
	}
	holds, ok := reply[9].([]any)
	if !ok {
		return driver.LockInfo{}, false, fmt.Errorf("unexpected shared holds %v", reply[9])
	}
	for _, h := range holds {
		hold, ok := h.([]any)
		if !ok || len(hold) != 3 {
			return driver.LockInfo{}, false, fmt.Errorf("unexpected shared hold %v", h)
		}
		owner, _ := hold[0].(string)
		fence, err1 := asUint64(hold[1])
		pttl, err2 := asInt64(hold[2])
		if err := firstErr(err1, err2); err != nil {
			return driver.LockInfo{}, false, err
		}
		info.Shared = append(info.Shared, driver.SharedHold{Owner: owner, Fence: fence, TTL: ttlOf(pttl)})
	}
	// Oldest grant first: fences grow with every grant.
	slices.SortFunc(info.Shared, func(a, b driver.SharedHold) int { return cmp.Compare(a.Fence, b.Fence) })
	return info, true, nil
}
