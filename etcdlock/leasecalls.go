// The calls of a lease table that several callers share: a grant or a
// keep-alive in flight, which the others wait for.

package etcdlock

import (
	"context"
	"errors"
	"time"
)

// grantKey names a lease grant in flight: its bucket, and whether it is
// bounded by its caller's ctx alone (see leaseFor).
type grantKey struct {
	b       int64
	patient bool
}

// call is one request in flight that others wait for.
type call struct {
	done chan struct{}
	err  error
	// callerGone says that err came with the end of the ctx of the caller
	// that made the call: it says nothing of the store, and a waiter whose
	// own ctx is alive makes the call again itself.
	callerGone bool
}

// wait waits for c or ctx. It returns nil, for the waiter to make the
// call itself, when c failed only because the ctx of its caller ended: one
// caller's cancellation is no store failure for the others.
func wait(ctx context.Context, c *call) error {
	select {
	case <-c.done:
		if c.callerGone && ctx.Err() == nil {
			return nil
		}
		return c.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// errWaitedEnough: waitFor's bound passed before the call ended.
var errWaitedEnough = errors.New("waited long enough")

// waitFor is wait bounded by d (by ctx alone when d is 0); it returns
// errWaitedEnough when d passed first.
func waitFor(ctx context.Context, c *call, d time.Duration) error {
	if d <= 0 {
		return wait(ctx, c)
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-c.done:
		return wait(ctx, c)
	case <-timer.C:
		return errWaitedEnough
	case <-ctx.Done():
		return ctx.Err()
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
