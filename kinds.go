// RWMutex and Semaphore, the lock kinds beside Mutex, and the capability
// check they share.

package dlock

import (
	"context"
	"fmt"

	"github.com/dlock-go/dlock/driver"
)

// MaxPermits is the largest permit count of a Semaphore.
const MaxPermits = 1 << 20

// RWMutex is a read-write lock: many readers or one writer. Each reader
// holds a lease of its own (TTL, renewal, fence, loss signal). The write
// side is the plain lock of the same name, so a Mutex of that name excludes
// readers too. A waiting writer keeps new readers out
// (NotObtainedError.WriterWaiting) until it has had its turn. A reader
// on a name that a Semaphore's permits hold is refused with a
// *ConflictError (ErrConflict). It is not reentrant. Reentrant and
// WithOwnerID are refused (ErrInvalid), also as Client defaults;
// WithLockDelay applies to the write side only; Fair needs
// driver.CapFairShared. It needs a backend with driver.CapShared. See
// docs/LOCK-KINDS.md.
type RWMutex struct {
	name string
	w, r handle
}

// RWMutex returns a handle on the read-write lock named name. Making it
// touches no store; bad names and options are reported by its methods.
func (c *Client) RWMutex(name string, opts ...Option) *RWMutex {
	rw := &RWMutex{name: name}
	rw.w.init(c, "RWMutex", name, driver.Exclusive, 0, opts)
	rw.r.init(c, "RWMutex", name, driver.Shared, 0, opts)
	if rw.r.err == nil && rw.r.opts.lockDelay > 0 {
		rw.r.err = invalid("WithLockDelay: not supported for readers of %q (it applies to the write side)", name)
	}
	return rw
}

// Name returns the lock's name, without the key prefix.
func (rw *RWMutex) Name() string { return rw.name }

// RLock obtains a read lease, waiting as Mutex.Lock does while a writer
// holds the lock or waits for it. Its errors are Mutex.Lock's.
func (rw *RWMutex) RLock(ctx context.Context) (*Lease, error) { return rw.r.lock(ctx) }

// TryRLock makes one attempt to obtain a read lease. It fails with a
// *NotObtainedError when a writer holds the lock or waits for it
// (WriterWaiting). Its other errors are Mutex.TryLock's.
func (rw *RWMutex) TryRLock(ctx context.Context) (*Lease, error) { return rw.r.tryLock(ctx) }

// Lock obtains the write lease, waiting as Mutex.Lock does until no reader
// and no other writer holds the lock. While it waits for readers, new
// readers are kept out. The lease carries a fence like every grant.
func (rw *RWMutex) Lock(ctx context.Context) (*Lease, error) { return rw.w.lock(ctx) }

// TryLock makes one attempt to obtain the write lease. It leaves no claim
// behind: readers are not held back by it.
func (rw *RWMutex) TryLock(ctx context.Context) (*Lease, error) { return rw.w.tryLock(ctx) }

// Semaphore is a counting semaphore: at most Permits holders at once, each
// permit a lease of its own (TTL, renewal, fence, loss signal), so the
// permit of a holder that crashed comes back when its lease expires. The
// count is the handle's and is checked against the holds on the store at
// each Acquire. While permits of a name are held, their count binds it: an
// Acquire with another count, or a reader of the name, is refused at once
// with a *ConflictError (ErrConflict); so is a permit on a name that
// readers hold. A writer on the same name excludes permit holders, which
// count as readers. Reentrant, WithOwnerID and WithLockDelay are refused
// (ErrInvalid), also as Client defaults; Fair needs driver.CapFairShared.
// It needs a backend with driver.CapSemaphore. See docs/LOCK-KINDS.md.
type Semaphore struct {
	h       handle
	permits int
}

// Semaphore returns a handle on the counting semaphore named name with the
// given number of permits, between 1 and MaxPermits. Making it touches no
// store; bad names, counts and options are reported by its methods.
func (c *Client) Semaphore(name string, permits int, opts ...Option) *Semaphore {
	s := &Semaphore{permits: permits}
	s.h.init(c, "Semaphore", name, driver.Shared, permits, opts)
	switch {
	case s.h.err != nil:
	case permits < 1 || permits > MaxPermits:
		s.h.err = invalid("permits: %d is not between 1 and MaxPermits (%d)", permits, MaxPermits)
	case s.h.opts.lockDelay > 0:
		s.h.err = invalid("WithLockDelay: not supported by semaphores")
	}
	return s
}

// Name returns the semaphore's name, without the key prefix.
func (s *Semaphore) Name() string { return s.h.name }

// Permits returns the handle's permit count.
func (s *Semaphore) Permits() int { return s.permits }

// Acquire obtains a permit, waiting as Mutex.Lock does while all permits are
// held. The lease is the permit: Unlock gives it back. Its errors are
// Mutex.Lock's; a *NotObtainedError tells how many permits are in use. It
// returns a *ConflictError at once, without waiting, when the name is held
// by permits of another count or by readers.
func (s *Semaphore) Acquire(ctx context.Context) (*Lease, error) { return s.h.lock(ctx) }

// TryAcquire makes one attempt to obtain a permit.
func (s *Semaphore) TryAcquire(ctx context.Context) (*Lease, error) { return s.h.tryLock(ctx) }

// need returns an error matching ErrInvalid and ErrUnsupported when the
// backend lacks capability cp.
func (c *Client) need(cp driver.Capability) error {
	if cb, ok := c.backend.(driver.Capabler); ok && cb.Supports(cp) {
		return nil
	}
	return &unsupportedError{what: cp.String(), backend: fmt.Sprintf("%T", c.backend)}
}

// needFor is need for what (an option of a kind), which needs cp: its
// error names what.
func (c *Client) needFor(what string, cp driver.Capability) error {
	if err := c.need(cp); err != nil {
		return &unsupportedError{what: what + " (" + cp.String() + ")", backend: fmt.Sprintf("%T", c.backend)}
	}
	return nil
}

// unsupportedError is the error for a lock kind or option the backend does
// not have: ErrInvalid and ErrUnsupported both match it.
type unsupportedError struct{ what, backend string }

func (e *unsupportedError) Error() string {
	return fmt.Sprintf("dlock: invalid argument: %s: not supported by the backend (%s)", e.what, e.backend)
}

func (e *unsupportedError) Unwrap() []error { return []error{ErrInvalid, ErrUnsupported} }
