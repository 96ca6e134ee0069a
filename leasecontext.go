// The contexts that carry a hold: finding the lease behind a context, and
// the context whose Err and Done read the safe deadline when called.

package dlock

import "context"

// leaseKey is the context key under which Do's fn and Lease.Context find
// their lease.
type leaseKey struct{}

// LeaseFromContext returns the lease that ctx carries: fn's context in
// Client.Do, a lease's own Context, and the contexts made from them. Code
// under the lock reads its fence there for a fenced write. ok is false for
// a context that carries none.
func LeaseFromContext(ctx context.Context) (l *Lease, ok bool) {
	l, ok = ctx.Value(leaseKey{}).(*Lease)
	return l, ok && l != nil
}

// heldContext is a context that ends with a hold. Its Err and Done first
// run sync, which ends the hold when its safe deadline has passed, so that
// a caller who reads them after a pause sees the hold ended even before
// the renewal goroutine has run. Contexts made from it learn of the end
// when it is cancelled.
type heldContext struct {
	context.Context
	sync func()
}

// Done runs sync and returns the context's Done channel.
func (c *heldContext) Done() <-chan struct{} {
	c.sync()
	return c.Context.Done()
}

// Err runs sync and returns the context's error.
func (c *heldContext) Err() error {
	c.sync()
	return c.Context.Err()
}
