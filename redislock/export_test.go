package redislock

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
)

// AcquireWithoutHandoffID runs the acquire script as a client before the
// handoff channel did: a fair waiting request that accepts a handoff, with
// twelve arguments (no ARGV[13]).
func AcquireWithoutHandoffID(ctx context.Context, rdb redis.UniversalClient, key, token, owner string, ttl, queueTTL time.Duration) error {
	b := New(rdb)
	args, err := b.acquireCall(driver.AcquireRequest{Key: key, Token: token, Owner: owner, TTL: ttl,
		Fair: true, Wait: true, QueueTTL: queueTTL, Handoff: true})
	if err != nil {
		return err
	}
	return runEvalSha(ctx, rdb, acquireScript, args[:len(args)-1]).Err()
}

// HandoffChannel returns b's handoff channel of key.
func HandoffChannel(b *Backend, key string) string { return b.handoffChannel(key) }
