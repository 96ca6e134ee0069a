// Package redisnode gives package redlock the operations of a
// redislock.Backend that only Redlock needs, a release that wakes nobody and
// the raising of a grant's fence, without making them part of redislock's
// public API.
//
// The operations are hooks: function variables that package redislock sets,
// in an init function, to its unexported methods. The imports run one way,
// so there is no cycle:
//
//	redisnode  imports only driver (and the standard library)
//	redislock  imports redisnode, to set the hooks
//	redlock    imports redislock (to make its nodes) and redisnode (to call the hooks)
//
// redisnode cannot import redislock (redislock imports it), so a hook takes
// its node as a driver.Backend; it panics unless that is a
// *redislock.Backend. The hooks are set before any code can call them: a
// program that has a *redislock.Backend to pass links package redislock,
// whose init runs before main and before the init of every package that
// imports it, redlock included. Nothing else may assign them.
package redisnode

import (
	"context"

	"github.com/dlock-go/dlock/driver"
)

// ReleaseQuietly is Release on the redislock.Backend b without waking
// waiters: the release is not announced on the release channel. Package
// redlock undoes with it the grants of an attempt that lost: those nodes
// were free and blocked nobody, and announcing them would wake the other
// waiters, whose failed attempts would announce theirs, for as long as the
// holder keeps a quorum. Set by package redislock.
var ReleaseQuietly func(b driver.Backend, ctx context.Context, key, token string) (driver.ReleaseResult, error)

// RaiseFence gives the grant that token holds on key on the
// redislock.Backend b, exclusive or shared, the fence fence, and raises the
// key's fence counter there to at least fence so that the node's next grant
// draws a larger one, in one script. It reports false, changing nothing,
// when token does not hold the lock there. Package redlock uses it to give a
// grant one fence on all its nodes; a single-node lock never needs it. Set
// by package redislock.
var RaiseFence func(b driver.Backend, ctx context.Context, key, token string, fence uint64) (bool, error)
