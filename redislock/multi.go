// AcquireAll: the exclusive locks of several keys in one script
// (driver.MultiAcquirer), and the hash-slot check it needs on a Cluster.

package redislock

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
)

var _ driver.MultiAcquirer = (*Backend)(nil)

var (
	//go:embed acquire_all.lua
	acquireAllLua    string
	acquireAllScript = redis.NewScript(withCommon(acquireAllLua))
)

// AcquireAll implements driver.MultiAcquirer: one script grants every
// lock of reqs to their token, or none. On a Cluster every key must hash
// to one slot: names that share a hash tag ("{order42}:stock" and
// "{order42}:payment") do; others are refused with an error wrapping
// driver.ErrInvalid, before anything is sent. A copy of the request that
// lands after its grants were released, or after a clean-up released its
// token, grants nothing, as for Acquire (docs/REDIS.md).
func (b *Backend) AcquireAll(ctx context.Context, reqs []driver.AcquireRequest) ([]driver.AcquireResult, error) {
	if b.err != nil {
		return nil, b.err
	}
	if len(reqs) == 0 {
		return nil, nil
	}
	first := reqs[0].Key
	if err := b.checkAll(reqs); err != nil {
		return nil, err
	}
	if !b.allowEviction && !b.eviction.ok.Load() {
		if err := b.checkEviction(ctx, first); err != nil {
			return nil, b.storeError(ctx, "acquire", first, err)
		}
	}
	const per = 5
	keys := make([]string, 0, per*len(reqs))
	for _, r := range reqs {
		l := b.lockKey(r.Key)
		keys = append(keys, l, l+":fence", l+sharedSuffix, l+":si", l+lateSuffix)
	}
	rid := b.request()
	args := []any{reqs[0].Token, reqs[0].Owner, millis(reqs[0].TTL), rid}
	var reply []any
	var err error
	if b.acking() {
		reply, err = b.acquireAllAcked(ctx, reqs, scriptCall{keys: keys, args: args})
	} else {
		reply, err = acquireAllScript.Run(ctx, b.rdb, keys, args...).Slice()
	}
	if err != nil {
		b.movedOn(ctx, err)
		return nil, b.storeError(ctx, "acquire", first, err)
	}
	if len(reply) > 0 && reply[0] == int64(0) {
		// Refused: a first copy that lands after the holder's release must
		// grant nothing (acquire_all.lua reads the first key's record too).
		// A NOSCRIPT answer counts as a write here: a record too many.
		b.refused(ctx, first, reqs[0].Token, rid, false)
	}
	out, err := parseAcquireAll(reply, len(reqs))
	if err != nil {
		return nil, b.storeError(ctx, "acquire", first, err)
	}
	return out, nil
}

// checkAll refuses requests AcquireAll does not take, and, on a Cluster,
// keys of several hash slots.
func (b *Backend) checkAll(reqs []driver.AcquireRequest) error {
	for _, r := range reqs {
		if r.Mode != driver.Exclusive || r.Reentrant || r.Fair || r.Wait || r.LockDelay > 0 || r.Token != reqs[0].Token {
			return fmt.Errorf("%w: AcquireAll takes plain exclusive requests of one token", driver.ErrInvalid)
		}
	}
	if !b.sharded {
		return nil
	}
	slot := keySlot(b.lockKey(reqs[0].Key))
	for _, r := range reqs[1:] {
		if keySlot(b.lockKey(r.Key)) != slot {
			return fmt.Errorf("%w: on Redis Cluster the names of an all-at-once multi-lock must hash to one slot, and %q and %q do not: give them one hash tag, the same text in braces at the start of each name, such as {order42}:stock and {order42}:payment",
				driver.ErrInvalid, reqs[0].Key, r.Key)
		}
	}
	return nil
}

// acquireAllAcked runs AcquireAll's script and waits for WithReplicaAck's
// replicas; a grant they did not acknowledge is released again, and the
// outcome reported as unknown (an error).
func (b *Backend) acquireAllAcked(ctx context.Context, reqs []driver.AcquireRequest, call scriptCall) ([]any, error) {
	conn, err := b.connFor(ctx, call.keys[0])
	if err != nil {
		return nil, err
	}
	cmds, acked, ackErr := b.runAckedAt(ctx, conn, acquireAllScript, []scriptCall{call})
	reply, err := cmds[0].Slice()
	if err != nil || len(reply) == 0 || reply[0] != int64(1) {
		return reply, err
	}
	if ackErr == nil && acked >= b.ackReplicas {
		return reply, nil
	}
	err = ackErr
	if err == nil {
		err = &ReplicaAckError{Op: "acquire", Key: reqs[0].Key, Want: b.ackReplicas, Got: acked}
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
	defer cancel()
	for _, r := range reqs {
		if _, uerr := b.Release(uctx, r.Key, r.Token); uerr != nil {
			err = errors.Join(err, fmt.Errorf("undo: %w", uerr))
		}
	}
	return nil, err
}

// parseAcquireAll reads acquire_all.lua's reply for n requests.
func parseAcquireAll(reply []any, n int) ([]driver.AcquireResult, error) {
	out := make([]driver.AcquireResult, n)
	if len(reply) == n+1 && reply[0] == int64(1) {
		for i := range out {
			f, err := asInt64(reply[i+1])
			if err != nil || f <= 0 {
				return nil, fmt.Errorf("unexpected reply %v", reply)
			}
			out[i] = driver.AcquireResult{Acquired: true, Fence: uint64(f), Holds: 1}
		}
		return out, nil
	}
	if len(reply) != 4 || reply[0] != int64(0) {
		return nil, fmt.Errorf("unexpected reply %v", reply)
	}
	i, err1 := asInt64(reply[1])
	owner, _ := reply[2].(string)
	pttl, err2 := asInt64(reply[3])
	if err1 != nil || err2 != nil || i < 1 || int(i) > n {
		return nil, fmt.Errorf("unexpected reply %v", reply)
	}
	out[i-1].Holder, out[i-1].HolderTTL = owner, ttlOf(pttl)
	return out, nil
}

// keySlot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of its
// hash tag, or of the whole key when it has none, modulo 16384.
func keySlot(key string) uint16 {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}
