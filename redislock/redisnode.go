// The operations only package redlock uses, handed to it through the hooks
// of internal/redisnode rather than exported.

package redislock

import (
	"context"
	"strconv"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/redisnode"
)

// init sets the hooks through which package redlock reaches the two
// methods below.
func init() {
	redisnode.ReleaseQuietly = func(b driver.Backend, ctx context.Context, key, token string) (driver.ReleaseResult, error) {
		return b.(*Backend).releaseQuietly(ctx, key, token)
	}
	redisnode.RaiseFence = func(b driver.Backend, ctx context.Context, key, token string, fence uint64) (bool, error) {
		return b.(*Backend).raiseFence(ctx, key, token, fence)
	}
}

// releaseQuietly is Release without waking waiters: the release is not
// announced on the release channel. Package redlock undoes with it the
// grants of an attempt that lost: those nodes were free and blocked nobody,
// and announcing them would wake the other waiters, whose failed attempts
// would announce theirs, for as long as the holder keeps a quorum.
func (b *Backend) releaseQuietly(ctx context.Context, key, token string) (driver.ReleaseResult, error) {
	return b.release(ctx, key, token, "", "")
}

// raiseFence gives the grant that token holds on key, exclusive or shared,
// the fence fence, and raises the key's fence counter to at least fence so
// that the next grant on this node draws a larger one, in one script. It
// reports false, changing nothing, when token does not hold the lock.
// Package redlock uses it to give a grant one fence on all its nodes; a
// single-node lock never needs it.
func (b *Backend) raiseFence(ctx context.Context, key, token string, fence uint64) (bool, error) {
	n, err := raiseFenceScript.Run(ctx, b.rdb, b.raiseKeys(key), token, strconv.FormatUint(fence, 10)).Int64()
	if err != nil {
		return false, b.storeError(ctx, "raise fence", key, err)
	}
	return n == 1, nil
}
