package redislock

import (
	"context"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
)

// AcquireWithoutHandoffID runs the acquire script as a client before the
// handoff channel did: a fair waiting request that accepts a handoff, with
// twelve arguments (no ARGV[13]).
func AcquireWithoutHandoffID(ctx context.Context, rdb redis.UniversalClient, key, token, owner string, ttl, queueTTL time.Duration) error {
	b := New(rdb)
	args, _, err := b.acquireCall(driver.AcquireRequest{Key: key, Token: token, Owner: owner, TTL: ttl,
		Fair: true, Wait: true, QueueTTL: queueTTL, Handoff: true})
	if err != nil {
		return err
	}
	return runEvalSha(ctx, rdb, acquireScript, args[:len(args)-1]).Err()
}

// HandoffChannel returns b's handoff channel of key.
func HandoffChannel(b *Backend, key string) string { return b.handoffChannel(key) }

// ReleaseWithScripts runs a release of key by token as b would, with the
// release script made of releaseLua and commonLua (a client's of another
// version), and returns the script's answer.
func ReleaseWithScripts(ctx context.Context, b *Backend, key, token, releaseLua, commonLua string) (int64, error) {
	const nk = len(releaseSuffixes) - 1
	var names [nk + 1]string
	b.keysInto(names[:], key, releaseSuffixes[:])
	keys := make([]string, nk)
	copy(keys, names[:nk])
	src := releaseLua
	if strings.Contains(src, commonMark) {
		src = strings.Replace(src, commonMark, commonLua, 1)
	} else {
		src = commonLua + src
	}
	return redis.NewScript(src).Run(ctx, b.rdb, keys, token, names[nk], b.publishArg, b.requestID(), "").Int64()
}

// LateTTL is how long the late-request record refuses a request (lateTTL).
const LateTTL = lateTTL
