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
	return runEvalSha(ctx, rdb, acquireScript, args[:len(args)-4]).Err() // without ARGV[13..16]
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
	return redis.NewScript(joinCommon(releaseLua, commonLua)).Run(ctx, b.rdb, keys, token, names[nk], b.publishArg, b.requestID(), "").Int64()
}

// joinCommon returns script with commonLua in place of its line
// "--#common", or in front of it, as withCommon does with this version's.
func joinCommon(script, commonLua string) string {
	if strings.Contains(script, commonMark) {
		return strings.Replace(script, commonMark, commonLua, 1)
	}
	return commonLua + script
}

// Scripts is another version's acquire.lua, release.lua, common.lua and
// late.lua, as text.
type Scripts struct{ Acquire, Release, Common, Late string }

// AcquireWithScripts runs the acquire req as b would, with the acquire
// script made of s (a client's of another version), and reads its answer.
func AcquireWithScripts(ctx context.Context, b *Backend, req driver.AcquireRequest, s Scripts) (driver.AcquireResult, error) {
	args, _, err := b.acquireCall(req)
	if err != nil {
		return driver.AcquireResult{}, err
	}
	c := splitEvalSha(args)
	reply, err := redis.NewScript(joinCommon(s.Acquire, s.Common)).Run(ctx, b.rdb, c.keys, c.args...).Slice()
	if err != nil {
		return driver.AcquireResult{}, err
	}
	return parseAcquire(reply)
}

// ReleaseGrantWithScripts runs b.ReleaseGrant(key, token, fence) with the
// release script made of s, and returns the script's answer.
func ReleaseGrantWithScripts(ctx context.Context, b *Backend, key, token string, fence uint64, s Scripts) (int64, error) {
	c := splitEvalSha(b.releaseCall(key, token, b.publishArg, fenceArg(fence)))
	return redis.NewScript(s.Late+joinCommon(s.Release, s.Common)).Run(ctx, b.rdb, c.keys, c.args...).Int64()
}

// LateTTL is how long the late-request record refuses a request (lateTTL).
const LateTTL = lateTTL

// AcquireScriptHash is the SHA1 of the acquire script, as EVALSHA names it.
func AcquireScriptHash() string { return acquireScript.Hash() }
