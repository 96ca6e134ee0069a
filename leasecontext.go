// The contexts that carry a hold: finding the lease behind a context, and
// the context whose Err and Done read the safe deadline when called.

package dlock

import "context"

// leaseKey is the context key under which a context carries its holds (a
// *heldLeases): Do's fn, a lease's or MultiLease's own Context, CallContext.
type leaseKey struct{}

// heldLeases is what a context carries under leaseKey: the hold it was made
// for (one lease, or a MultiLease) and the holds of the context it was
// made from (outer), so that nested Do calls each find their own.
type heldLeases struct {
	l     *Lease
	ml    *MultiLease
	outer *heldLeases
}

// withHold returns parent carrying h, on top of the holds parent carries
// when nested is true.
func withHold(parent context.Context, h *heldLeases, nested bool) context.Context {
	if nested {
		h.outer, _ = parent.Value(leaseKey{}).(*heldLeases)
	}
	return context.WithValue(parent, leaseKey{}, h)
}

// lease returns the lease of name in h or the holds around it, the
// innermost first.
func (h *heldLeases) lease(name string) *Lease {
	for ; h != nil; h = h.outer {
		switch {
		case h.l != nil && h.l.Name() == name:
			return h.l
		case h.ml != nil:
			if l := h.ml.Lease(name); l != nil {
				return l
			}
		}
	}
	return nil
}

// only returns the lease of h and the holds around it when they are all of
// one name, and nil when there are none or several names.
func (h *heldLeases) only() *Lease {
	var found *Lease
	for ; h != nil; h = h.outer {
		ls := []*Lease{h.l}
		if h.ml != nil {
			ls = h.ml.leases
		}
		for _, l := range ls {
			switch {
			case l == nil:
			case found == nil:
				found = l
			case l.Name() != found.Name():
				return nil
			}
		}
	}
	return found
}

// LeaseFromContext returns the lease that ctx carries when it carries the
// leases of one name only: fn's context in Client.Do, a lease's own
// Context and CallContext, and the contexts made from them. ok is false
// for a context that carries none, and for one that carries leases of
// several names (a Do inside a Do of another name, a MultiLease of several
// names): a fence is only good for the resource its own name guards, so
// code under several locks asks by name with LeaseFromContextByName.
func LeaseFromContext(ctx context.Context) (l *Lease, ok bool) {
	h, _ := ctx.Value(leaseKey{}).(*heldLeases)
	l = h.only()
	return l, l != nil
}

// LeaseFromContextByName returns the lease of name that ctx carries: the
// innermost Do of that name around the caller, a lease's own Context, a
// MultiLease's Context (for each of its names), CallContext, and the
// contexts made from them. Code under the lock reads the fence for its
// fenced write there. ok is false when ctx carries no lease of that name.
func LeaseFromContextByName(ctx context.Context, name string) (l *Lease, ok bool) {
	h, _ := ctx.Value(leaseKey{}).(*heldLeases)
	l = h.lease(name)
	return l, l != nil
}

// heldContext is a context that ends with a hold. Its Err and Done first
// run sync, which ends the hold when its safe deadline has passed, so that
// a caller who reads them after a pause sees the hold ended even before
// the renewal goroutine has run; so does context.Cause (see Value).
// Contexts made from it learn of the end when it is cancelled.
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

// Value returns the context's value for key, after running sync when key
// is the context package's own (see cancelKey): context.Cause asks for
// it, and before Go 1.25 without calling Err first.
func (c *heldContext) Value(key any) any {
	if key == cancelKey {
		c.sync()
	}
	return c.Context.Value(key)
}
