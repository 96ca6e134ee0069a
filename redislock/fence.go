// Fenced writes to a protected resource: FencedSet, FencedGet,
// FencedClaim and ErrStaleFence.

package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/dlock-go/dlock/driver"
	"github.com/redis/go-redis/v9"
)

// ErrStaleFence is returned when a write carries a fence older than one the
// resource has already accepted.
var ErrStaleFence = errors.New("redislock: stale fence")

// FencedSet sets key to value only if fence is at least the highest fence
// key has accepted, in one script. It is the resource side of fencing: a
// lease can outlive its welcome (a paused process, a slow network), so the
// protected resource, not the lock, must refuse the late writer.
//
// Pass the fence of the lease under which the value was computed:
//
//	lease, err := mutex.Lock(ctx)
//	...
//	err = redislock.FencedSet(ctx, rdb, "report:today", lease.Fence(), report)
//	if errors.Is(err, redislock.ErrStaleFence) {
//		// a later holder has written already: drop this result
//	}
//
// Equal fences are accepted, so one grant may write several times; a lower
// fence returns an error wrapping ErrStaleFence and changes nothing, and so
// does fence 0 (wrapping dlock.ErrInvalid as well), which no lease has (it is the fence of a nil lease, or of a
// name a MultiLease does not hold), even on a key never written. key is
// stored as a hash with the fields "value" and "fence", so both live in one
// Cluster slot; read it with FencedGet. Other errors come from Redis.
func FencedSet(ctx context.Context, rdb redis.Scripter, key string, fence uint64, value string) error {
	if fence == 0 {
		return noFence("fenced set", key)
	}
	reply, err := fencedSetScript.Run(ctx, rdb, []string{key}, strconv.FormatUint(fence, 10), value).Slice()
	if err != nil {
		return fmt.Errorf("redislock: fenced set %q: %w", key, err)
	}
	if len(reply) == 0 {
		return fmt.Errorf("redislock: fenced set %q: unexpected reply %v", key, reply)
	}
	if stored, _ := asInt64(reply[0]); stored == 1 {
		return nil
	}
	var accepted any
	if len(reply) > 1 {
		accepted = reply[1]
	}
	return fmt.Errorf("redislock: fenced set %q: fence %d is older than accepted fence %v: %w", key, fence, accepted, ErrStaleFence)
}

// FencedClaim reads the value FencedSet stored at key, for a
// read-modify-write under the lease of fence, and makes the read count as
// a write of fence: key's accepted fence is raised to fence in the same
// script, so that a FencedSet (or FencedClaim) of an older holder is
// refused from then on. Without it, a holder that read the value before a
// pause can write a value computed from it after the next holder has read
// the same value but not yet written: two decrements, one applied.
//
//	stock, _, err := redislock.FencedClaim(ctx, rdb, "stock:42", lease.Fence())
//	... n := parse(stock) - 1 ...
//	err = redislock.FencedSet(ctx, rdb, "stock:42", lease.Fence(), strconv.Itoa(n))
//
// ok is false when no value is stored yet (the claim is made all the
// same). A fence older than the accepted one returns an error wrapping
// ErrStaleFence and changes nothing, and so does fence 0 (see FencedSet).
// Claiming again with the same fence changes nothing, so a resent claim is
// harmless.
func FencedClaim(ctx context.Context, rdb redis.Scripter, key string, fence uint64) (value string, ok bool, err error) {
	if fence == 0 {
		return "", false, noFence("fenced claim", key)
	}
	reply, err := fencedClaimScript.Run(ctx, rdb, []string{key}, strconv.FormatUint(fence, 10)).Slice()
	if err != nil {
		return "", false, fmt.Errorf("redislock: fenced claim %q: %w", key, err)
	}
	if len(reply) != 2 {
		return "", false, fmt.Errorf("redislock: fenced claim %q: unexpected reply %v", key, reply)
	}
	if claimed, _ := asInt64(reply[0]); claimed != 1 {
		return "", false, fmt.Errorf("redislock: fenced claim %q: fence %d is older than accepted fence %v: %w", key, fence, reply[1], ErrStaleFence)
	}
	value, ok = reply[1].(string)
	return value, ok, nil
}

// FencedGet returns the value FencedSet stored at key and the fence that
// wrote it. When key does not exist the error wraps redis.Nil.
func FencedGet(ctx context.Context, rdb redis.Scripter, key string) (value string, fence uint64, err error) {
	reply, err := fencedGetScript.Run(ctx, rdb, []string{key}).Slice()
	if err != nil {
		return "", 0, fmt.Errorf("redislock: fenced get %q: %w", key, err)
	}
	if len(reply) != 2 || reply[0] == nil {
		return "", 0, fmt.Errorf("redislock: fenced get %q: %w", key, redis.Nil)
	}
	value, _ = reply[0].(string)
	if reply[1] != nil {
		if fence, err = asUint64(reply[1]); err != nil {
			return "", 0, fmt.Errorf("redislock: fenced get %q: %w", key, err)
		}
	}
	return value, fence, nil
}

// noFence is the error of a fenced write with fence 0: no lease has it,
// so the write cannot be one a lock guards.
// It wraps driver.ErrInvalid too: the caller passed what no lease has.
func noFence(op, key string) error {
	return fmt.Errorf("redislock: %s %q: fence 0 is no lease's fence (a nil lease, or a name not held): %w (%w)", op, key, ErrStaleFence, driver.ErrInvalid)
}
