// The Redis Backend's releases (Release, ReleaseGrant, ReleaseAcquire) and
// Withdraw.

package redislock

import (
	"context"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
)

// Release drops one hold of token in one script: an exclusive hold, whose
// last deletes the lock hash (the fence counter stays), or token's shared
// hold. It also removes token's writer intent and fair queue entry, if any.
// It publishes on the release channel when that lets a waiter in, naming
// the head of the fair queue when the lock is left free with a live queue
// (see Listen). Held is false, with a nil error, when token held nothing.
func (b *Backend) Release(ctx context.Context, key, token string) (driver.ReleaseResult, error) {
	if b.err != nil {
		return driver.ReleaseResult{}, b.err
	}
	return b.release(ctx, key, token, b.publishArg, "")
}

// ReleaseGrant is Release tied to the grant it ends (driver.GrantReleaser):
// when token holds a grant with another fence (its owner ID or reentrant
// handle was granted the lock again since), it changes no hold and answers
// as Release does for a token that held nothing, unless it is a resend of a
// release that ran already, which answers as that run did.
func (b *Backend) ReleaseGrant(ctx context.Context, key, token string, fence uint64) (driver.ReleaseResult, error) {
	if b.err != nil {
		return driver.ReleaseResult{}, b.err
	}
	return b.release(ctx, key, token, b.publishArg, strconv.FormatUint(fence, 10))
}

// release runs the release script; publish is the command that announces
// the release, or "" for none; fence is the grant's, or "".
func (b *Backend) release(ctx context.Context, key, token string, publish any, fence string) (driver.ReleaseResult, error) {
	args := b.releaseCall(key, token, publish, fence)
	return b.releaseAnswer(ctx, key, token, args, runEvalSha(ctx, b.rdb, releaseScript, args))
}

// releaseCall returns the EVALSHA of release.lua, as evalShaArgs lays it
// out. It names the requests of token that were written once each and
// granted (onceGrants), so that the script records none of them, and those
// whose answers were lost, so that it records them.
func (b *Backend) releaseCall(key, token string, publish any, fence string) []any {
	// The keys and the channel are cut from one string.
	const nk = len(releaseSuffixes) - 1
	var names [nk + 1]string
	b.keysInto(names[:], key, releaseSuffixes[:])
	args := evalShaArgs(releaseSHA, nk, 7)
	for i, k := range names[:nk] {
		args[3+i] = k
	}
	once, lost := b.onces.ids(key, token)
	args[3+nk], args[4+nk], args[5+nk], args[6+nk], args[7+nk], args[8+nk], args[9+nk] = token, names[nk], publish, b.requestID(), fence, once, lost
	return args
}

// releaseAnswer reads the answer of a release's script call, made of args
// (releaseCall).
func (b *Backend) releaseAnswer(ctx context.Context, key, token string, args []any, cmd *redis.Cmd) (driver.ReleaseResult, error) {
	n, err := cmd.Int64()
	if err != nil {
		return driver.ReleaseResult{}, b.storeError(ctx, "release", key, err)
	}
	if n <= 0 {
		// Only the ids the release named: a request of token whose answer
		// was lost while the release was on its way is still to record.
		const nk = len(releaseSuffixes) - 1
		b.onces.forget(key, token, args[8+nk].(string), args[9+nk].(string))
	}
	if n < 0 {
		return driver.ReleaseResult{}, nil
	}
	return driver.ReleaseResult{Held: true, Remaining: int(n)}, nil
}

// ReleaseAcquire implements driver.ReleaseAcquirer: the release of token
// (ReleaseGrant when fence is not 0, else Release) and the acquire next go
// out in one pipeline, the release first, and each is answered as its own
// call would be. A script that the server's cache lost is sent again by
// itself, the release before the acquire (the acquire too, as a new
// request, when only the release's script was lost). With WithReplicaAck, and until
// the eviction policy has been read, the two are sent one after the other.
func (b *Backend) ReleaseAcquire(ctx context.Context, key, token string, fence uint64, next driver.AcquireRequest) (driver.ReleaseAcquireResult, error) {
	var out driver.ReleaseAcquireResult
	if b.err != nil {
		out.AcquireErr = b.err
		return out, b.err
	}
	fenced := fenceArg(fence)
	acqArgs, rid, err := b.acquireCall(next)
	if err != nil || b.acking() || (!b.allowEviction && !b.eviction.ok.Load()) {
		out.Release, err = b.release(ctx, key, token, b.publishArg, fenced)
		if err != nil {
			out.AcquireErr = err
			return out, err
		}
		out.Acquire, out.AcquireErr = b.Acquire(ctx, next)
		return out, nil
	}
	relArgs := b.releaseCall(key, token, b.publishArg, fenced)
	rel, acq := redis.NewCmd(ctx, relArgs...), redis.NewCmd(ctx, acqArgs...)
	rel.SetFirstKeyPos(3) // as Script.Run does, for Cluster routing
	acq.SetFirstKeyPos(3)
	pipe := b.rdb.Pipeline()
	_ = pipe.Process(ctx, rel)
	_ = pipe.Process(ctx, acq)
	_, _ = pipe.Exec(ctx)
	again := isNoScript(acq.Err())
	if isNoScript(rel.Err()) {
		rel = runEvalSha(ctx, b.rdb, releaseScript, relArgs)
		if first, err := b.acquireAnswer(ctx, next, rid, acq); !again && err == nil && !first.Acquired {
			// The acquire ran before the release it was to follow, and
			// was refused: it goes again, as a new request, after it.
			// (Its arguments were made once already, without error.)
			acqArgs, rid, _ = b.acquireCall(next)
			again = true
		}
	}
	if again {
		if isNoScript(acq.Err()) {
			unsent(acqArgs)
		}
		acq = runEvalSha(ctx, b.rdb, acquireScript, acqArgs)
	}
	out.Release, err = b.releaseAnswer(ctx, key, token, relArgs, rel)
	out.Acquire, out.AcquireErr = b.acquireAnswer(ctx, next, rid, acq)
	return out, err
}

var _ driver.PlaceReleaser = (*Backend)(nil)

// ReleasePlace implements driver.PlaceReleaser: Release, with the entry of
// driver.Successor(token) taken out of the fair queue by the same script,
// before it hands the lock on.
func (b *Backend) ReleasePlace(ctx context.Context, key, token string) (driver.ReleaseResult, error) {
	if b.err != nil {
		return driver.ReleaseResult{}, b.err
	}
	args := append(b.releaseCall(key, token, b.publishArg, ""), "1")
	return b.releaseAnswer(ctx, key, token, args, runEvalSha(ctx, b.rdb, releaseScript, args))
}

// Withdraw removes token's fair queue entry and writer intent, if any, in
// one script that touches no hold, and publishes on the release channel
// when that lets a waiter in, as Release does.
func (b *Backend) Withdraw(ctx context.Context, key, token string) error {
	if b.err != nil {
		return b.err
	}
	names := b.keysOf(key, releaseSuffixes[:])
	nk := len(names) - 1
	_, lost := b.onces.ids(key, token) // kept for the token's release
	if err := withdrawScript.Run(ctx, b.rdb, names[:nk], token, names[nk], b.publishArg, lost).Err(); err != nil {
		return b.storeError(ctx, "withdraw", key, err)
	}
	return nil
}
