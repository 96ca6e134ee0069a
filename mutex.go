// Mutex, the exclusive lock, and Client.Do.

package dlock

import (
	"context"
	"errors"

	"github.com/dlock-go/dlock/driver"
)

// Mutex is a handle on one named lock. A handle is an owner: a reentrant
// handle (Reentrant) keeps one owner token for its life and may hold the lock
// several times; any other handle draws a new token for every Lock, so a
// second Lock on it waits like any other owner. A Mutex is safe for concurrent
// use.
type Mutex struct{ h handle }

// Mutex returns a handle on the lock named name. Making a handle touches no
// store; bad names and options are reported by its methods as ErrInvalid.
func (c *Client) Mutex(name string, opts ...Option) *Mutex {
	m := &Mutex{}
	m.h.init(c, "Mutex", name, driver.Exclusive, 0, opts)
	return m
}

// Name returns the lock's name, without the key prefix.
func (m *Mutex) Name() string {
	if m == nil {
		return ""
	}
	return m.h.name
}

// TryLock makes one attempt to obtain the lock. It returns a
// *NotObtainedError (errors.Is(err, ErrNotObtained)) naming the holder when
// another owner holds it, ErrInvalid for a bad name or option, ErrClosed
// after Client.Close, and the store's error, wrapped, when the store fails.
// A grant that comes too late to be trusted is given back, and the
// *NotObtainedError says how long the store took (Slow).
func (m *Mutex) TryLock(ctx context.Context) (*Lease, error) {
	if m == nil {
		return nil, invalid("mutex: nil")
	}
	return m.h.tryLock(ctx)
}

// Lock obtains the lock, waiting as long as ctx allows and WithWait permits.
// A waiter is woken by the release (on stores with notifications), when the
// holder's TTL runs out, and on the WithRetry schedule. Without Fair, a wait
// that lasts joins the store's fair queue where it has one, so that no owner
// starves (see Fair and the package documentation).
//
// A store error that may heal (driver.ErrTransient) does not end the wait:
// Lock tries again, with backoff and jitter, until the wait ends.
//
// When the wait ends first, Lock returns errors.Join(*NotObtainedError,
// ctx.Err()) (context.DeadlineExceeded when WithWait elapsed), promptly and
// leaving nothing on the store; when the store's last answer was a
// transient error, that error is joined too. Its other errors are
// TryLock's.
func (m *Mutex) Lock(ctx context.Context) (*Lease, error) {
	if m == nil {
		return nil, invalid("mutex: nil")
	}
	return m.h.lock(ctx)
}

// Do locks name, runs fn with a context that is cancelled when the lease is
// lost (or ctx is done), and unlocks. fn's context carries the lease, on
// top of those ctx carries: LeaseFromContextByName(ctx, name) gives it to
// fn, for its fence (the fenced write); with
// a ContextObserver it has the values of the context the observer returned
// for the grant (see ContextObserver), so that a span there is fn's parent.
// When fn panics, the lock is released before the panic goes on. It
// returns fn's error, joined with the *LostError when the lease was lost
// while fn ran and with the Unlock error when unlocking failed. The lock
// options are as for Mutex; Lock's errors are returned as they are, without
// running fn.
//
// An observer (WithObserver) is told of the call with EventDoStarted and
// EventDoEnded, around the events of its Lock and Unlock.
func (c *Client) Do(ctx context.Context, name string, fn func(ctx context.Context) error, opts ...Option) error {
	if fn == nil {
		return invalid("fn: nil")
	}
	if c.obs == nil {
		var fence uint64
		return c.do(ctx, name, fn, &fence, opts...)
	}
	dctx, start := c.obs.doStarted(ctx, name)
	var fence uint64
	ended := false
	defer func() {
		if !ended { // fn panicked: the panic goes on, reported ended
			c.obs.doEnded(dctx, name, start, fence, errFnPanicked)
		}
	}()
	err := c.do(dctx, name, fn, &fence, opts...)
	ended = true
	c.obs.doEnded(dctx, name, start, fence, err)
	return err
}

// errFnPanicked is the error of the EventDoEnded of a Do whose fn panicked.
var errFnPanicked = errors.New("dlock: Do: fn panicked")

// do is Do, unobserved but through ctx; it sets *fence to the grant's
// fence once Lock returned. When fn panics, the lock is released before the
// panic goes on (a caller that recovers, as net/http does for a handler,
// would otherwise leave it held and renewed for the rest of the process).
func (c *Client) do(ctx context.Context, name string, fn func(ctx context.Context) error, fence *uint64, opts ...Option) error {
	lctx, granted := c.obs.forDo(ctx)
	lease, err := c.Mutex(name, opts...).Lock(lctx)
	if err != nil {
		return err
	}
	*fence = lease.Fence()
	vctx, cancel := context.WithCancelCause(withHold(granted.from(ctx), &heldLeases{l: lease}, true))
	stop := context.AfterFunc(lease.Context(), func() { cancel(context.Cause(lease.Context())) })
	// fn's context reads the lease's safe deadline when asked, as the
	// lease's own Context does.
	fnCtx := &heldContext{Context: vctx, sync: func() {
		if err := lease.Err(); err != nil {
			cancel(err)
		}
	}}
	// Release even when the caller's context is done, within one TTL.
	unlock := func() error {
		uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), lease.g.ttl)
		defer ucancel()
		return lease.Unlock(uctx)
	}
	returned := false
	defer func() {
		if !returned {
			stop()
			cancel(errFnPanicked)
			_ = unlock()
		}
	}()
	fnErr := fn(fnCtx)
	returned = true
	stop()
	cancel(nil)

	uerr := unlock()
	if lost := lease.Err(); errors.Is(lost, ErrLost) {
		return errors.Join(fnErr, lost)
	}
	return errors.Join(fnErr, uerr)
}
