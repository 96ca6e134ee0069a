package dlock

import (
	"context"

	"github.com/dlock-go/dlock/driver"
)

// MaxPermits is the largest permit count of a Semaphore.
const MaxPermits = 1 << 20

// RWMutex is a read-write lock: many readers or one writer. Each reader holds
// a lease of its own, with its own TTL, renewal, fence and loss signal, so a
// reader that crashes gives up its share when its lease expires. The write
// side is the plain lock of the same name: a Mutex of that name and
// RWMutex.Lock exclude each other and every reader.
//
// Writers are not starved by a stream of readers: once a writer waits in
// Lock, new readers are refused (NotObtainedError.WriterWaiting) and wait
// until the writer has had its turn. The waiting writer keeps that claim
// alive on the store by trying again every third of min(TTL, 5s); when it
// gives up, its claim has been removed when Lock returns (a writer that is a
// reentrant Mutex or uses WithOwnerID withdraws it without touching the
// holds of its token), and when it dies the claim lapses within that time.
//
// An RWMutex is not reentrant: a goroutine that holds a read lease and asks
// for another may wait behind a waiting writer that waits for it (as with
// sync.RWMutex). Reentrant, Fair and WithOwnerID are refused (ErrInvalid);
// given to the Client as defaults, they do not apply. WithLockDelay applies to
// the write side; RLock refuses it. An RWMutex needs a backend with
// driver.CapShared.
type RWMutex struct {
	name string
	w, r *Mutex
}

// RWMutex returns a handle on the read-write lock named name. Making it
// touches no store; bad names and options are reported by its methods.
func (c *Client) RWMutex(name string, opts ...Option) *RWMutex {
	rw := &RWMutex{name: name}
	if c == nil {
		err := invalid("client: nil")
		rw.w = &Mutex{name: name, err: err}
		rw.r = &Mutex{name: name, err: err}
		return rw
	}
	refused := checkKindOptions("RWMutex", opts)
	rw.w = c.kindMutex(name, driver.Exclusive, 0, refused, opts)
	rw.r = c.kindMutex(name, driver.Shared, 0, refused, opts)
	if rw.r.err == nil && rw.r.opts.lockDelay > 0 {
		rw.r.err = invalid("lock delay: not supported for readers of %q (it applies to the write side)", name)
	}
	return rw
}

// Name returns the lock's name, without the key prefix.
func (rw *RWMutex) Name() string { return rw.name }

// RLock obtains a read lease, waiting as Mutex.Lock does while a writer
// holds the lock or waits for it. Its errors are Mutex.Lock's.
func (rw *RWMutex) RLock(ctx context.Context) (*Lease, error) { return rw.r.Lock(ctx) }

// TryRLock makes one attempt to obtain a read lease. It fails with a
// *NotObtainedError when a writer holds the lock or waits for it
// (WriterWaiting). Its other errors are Mutex.TryLock's.
func (rw *RWMutex) TryRLock(ctx context.Context) (*Lease, error) { return rw.r.TryLock(ctx) }

// Lock obtains the write lease, waiting as Mutex.Lock does until no reader
// and no other writer holds the lock. While it waits for readers, new
// readers are kept out. The lease carries a fence like every grant.
func (rw *RWMutex) Lock(ctx context.Context) (*Lease, error) { return rw.w.Lock(ctx) }

// TryLock makes one attempt to obtain the write lease. It leaves no claim
// behind: readers are not held back by it.
func (rw *RWMutex) TryLock(ctx context.Context) (*Lease, error) { return rw.w.TryLock(ctx) }

// Semaphore is a counting semaphore: at most Permits holders at once. Every
// permit is a lease of its own (like Redisson's expirable permits), with its
// own TTL, automatic renewal, fence and loss signal; the permit of a holder
// that crashed comes back when its lease expires.
//
// The permit count is the handle's, given to Client.Semaphore: an Acquire is
// granted while fewer than Permits leases of that name are held, counted on
// the store at that moment. Nothing else stores the count, so changing it
// means making handles with the new number. Raising it lets waiters in at
// once. Lowering it never takes a permit away: holders above the new count
// keep their leases until they release them or they expire, and new Acquires
// with the lower count wait until the number held is below it. Handles with
// different counts on one name each enforce their own (the store shows the
// count of the newest grant).
//
// A name is one lock: a writer (Mutex or RWMutex.Lock) on a semaphore's name
// excludes its permit holders, whose leases count as readers. Reentrant, Fair,
// WithOwnerID and WithLockDelay are refused (ErrInvalid); given to the Client
// as defaults, the first three do not apply. A Semaphore needs a backend with
// driver.CapSemaphore.
type Semaphore struct {
	m       *Mutex
	permits int
}

// Semaphore returns a handle on the counting semaphore named name with the
// given number of permits, between 1 and MaxPermits. Making it touches no
// store; bad names, counts and options are reported by its methods.
func (c *Client) Semaphore(name string, permits int, opts ...Option) *Semaphore {
	s := &Semaphore{permits: permits}
	if c == nil {
		s.m = &Mutex{name: name, err: invalid("client: nil")}
		return s
	}
	s.m = c.kindMutex(name, driver.Shared, permits, checkKindOptions("Semaphore", opts), opts)
	switch {
	case s.m.err != nil:
	case permits < 1 || permits > MaxPermits:
		s.m.err = invalid("permits: %d is not between 1 and MaxPermits (%d)", permits, MaxPermits)
	case s.m.opts.lockDelay > 0:
		s.m.err = invalid("lock delay: not supported by semaphores")
	}
	return s
}

// Name returns the semaphore's name, without the key prefix.
func (s *Semaphore) Name() string { return s.m.name }

// Permits returns the handle's permit count.
func (s *Semaphore) Permits() int { return s.permits }

// Acquire obtains a permit, waiting as Mutex.Lock does while all permits are
// held. The lease is the permit: Unlock gives it back. Its errors are
// Mutex.Lock's; a *NotObtainedError tells how many permits are in use.
func (s *Semaphore) Acquire(ctx context.Context) (*Lease, error) { return s.m.Lock(ctx) }

// TryAcquire makes one attempt to obtain a permit.
func (s *Semaphore) TryAcquire(ctx context.Context) (*Lease, error) { return s.m.TryLock(ctx) }

// checkKindOptions returns the error for the options an RWMutex or a
// Semaphore refuses when they are given to the handle.
func checkKindOptions(kind string, opts []Option) error {
	var o options
	for _, opt := range opts {
		if opt != nil {
			opt.apply(&o)
		}
	}
	switch {
	case o.reentrant:
		return invalid("reentrant: not supported by %s", kind)
	case o.fair:
		return invalid("fair: not supported by %s (only Mutex)", kind)
	case o.ownerID != "":
		return invalid("owner ID: not supported by %s (every hold has a token of its own)", kind)
	}
	return nil
}

// kindMutex makes the Mutex behind an RWMutex side or a Semaphore: the
// Client's defaults without reentrancy, fairness and owner IDs, then opts.
func (c *Client) kindMutex(name string, mode driver.Mode, limit int, refused error, opts []Option) *Mutex {
	m := &Mutex{c: c, name: name, opts: c.opts, mode: mode, limit: limit}
	m.opts.reentrant, m.opts.fair, m.opts.ownerID = false, false, ""
	for _, o := range opts {
		if o != nil {
			o.apply(&m.opts)
		}
	}
	m.key = m.opts.keyPrefix + name
	m.err = refused
	if m.err == nil {
		m.err = m.opts.validate(name)
	}
	if m.err == nil && c.backend != nil {
		m.err = c.checkBackend(&m.opts)
	}
	if m.err == nil && c.backend != nil {
		switch {
		case mode == driver.Shared && limit > 0:
			m.err = c.need(driver.CapSemaphore)
		case mode == driver.Shared:
			m.err = c.need(driver.CapShared)
		}
	}
	return m
}

// need returns ErrInvalid when the backend lacks capability cp.
func (c *Client) need(cp driver.Capability) error {
	if cb, ok := c.backend.(driver.Capabler); ok && cb.Supports(cp) {
		return nil
	}
	return invalid("%s: not supported by the backend (%T)", cp, c.backend)
}
