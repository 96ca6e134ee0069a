package dlock

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// Mutex is a handle on one named lock. A handle is an owner: a reentrant
// handle (Reentrant) keeps one owner token for its life and may hold the lock
// several times; any other handle draws a new token for every Lock, so a
// second Lock on it waits like any other owner. A Mutex is safe for concurrent
// use.
type Mutex struct {
	c     *Client
	name  string
	key   string
	opts  options
	err   error  // invalid name or options
	token string // fixed token of a reentrant handle or of WithOwnerID; else ""
	mode  driver.Mode
	limit int // a semaphore's permits; 0 otherwise

	// starve: a plain Mutex on a store with fair queues, whose waits join
	// the queue when they starve (see starveAfter) and whose requests
	// respect a queue the Client has seen (see waitHub.queueLive).
	starve bool

	mu   sync.Mutex
	held *grant // a reentrant handle's current grant
	// uncertain: an acquire with the handle's fixed token failed with an
	// unknown outcome while the handle held nothing, so the store may count
	// a hold that no lease stands for. The handle's next grant inherits it
	// and drains such holds at its last Unlock. Guarded by mu.
	uncertain bool
}

// fairNow reports whether the next request should be a fair one: always for
// a Fair Mutex, and for a plain one while its name has a live queue.
func (m *Mutex) fairNow() bool {
	return m.opts.fair || (m.starve && m.c.hub.queueLive(m.key))
}

// Name returns the lock's name, without the key prefix.
func (m *Mutex) Name() string { return m.name }

// TryLock makes one attempt to obtain the lock. It returns a
// *NotObtainedError (errors.Is(err, ErrNotObtained)) naming the holder when
// another owner holds it, ErrInvalid for a bad name or option, ErrClosed
// after Client.Close, and the store's error, wrapped, when the store fails.
// A grant that the store answers too late to be trusted (after the TTL less
// drift allowance and safety margin) is given back, and the
// *NotObtainedError says how long the store took (Slow).
func (m *Mutex) TryLock(ctx context.Context) (*Lease, error) {
	if err := m.enter(); err != nil {
		return nil, err
	}
	defer m.c.exit()
	if err := ctx.Err(); err != nil {
		return nil, errors.Join(&NotObtainedError{Name: m.name}, err)
	}
	l, res, err := m.try(ctx, m.tokenFor(), false, m.opts.fair)
	if err != nil || l != nil {
		return l, m.tryErr(ctx, err)
	}
	return nil, m.notObtained(res)
}

// Lock obtains the lock, waiting as long as ctx allows and WithWait permits.
// After a first attempt, a waiter subscribes to release notifications before
// each further attempt, and also tries again when the holder's TTL runs out
// and, as a safety net, on the WithRetry schedule. Among the goroutines of one
// Client waiting on one name, only one at a time retries; the others queue
// behind it without touching the store. A grant answered too late to be
// trusted is given back and the wait goes on (a fair waiter then queues
// again, at the back).
//
// Without Fair, an owner that unlocks and locks again at once would win
// nearly every race against waiters that must first hear of the release. As
// in Go's sync.Mutex, a plain wait that has lasted a millisecond therefore
// joins the store's fair queue (on stores with driver.CapFair), and the
// owners that learn of the queue queue too (see Fair), until contention
// ends.
//
// When the wait ends first, Lock returns errors.Join(*NotObtainedError,
// ctx.Err()) (context.DeadlineExceeded when WithWait elapsed), promptly and
// leaving nothing on the store. Its other errors are TryLock's.
func (m *Mutex) Lock(ctx context.Context) (*Lease, error) {
	if err := m.enter(); err != nil {
		return nil, err
	}
	defer m.c.exit()
	if m.opts.wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.opts.wait)
		defer cancel()
	}
	if err := ctx.Err(); err != nil {
		return nil, errors.Join(&NotObtainedError{Name: m.name}, err)
	}
	token := m.tokenFor()
	fair := m.fairNow()
	mk := m.c.hub.mark(m.key)
	// A Client keeps one place per name in the store's queue, for the
	// waiter at the gate of its group (see waitHub.wait): a fair first try
	// joins the queue only when the Client has no waiter on the name yet.
	queue := !fair || !m.c.hub.waiting(m.key)
	l, res, err := m.try(ctx, token, queue, fair)
	if err != nil || l != nil {
		return l, m.tryErr(ctx, err)
	}
	m.busy(res)
	return m.c.hub.wait(ctx, m, token, res, mk)
}

func (m *Mutex) enter() error {
	if m == nil {
		return invalid("mutex: nil")
	}
	if m.err != nil {
		return m.err
	}
	if m.c == nil {
		return invalid("mutex: not made by a Client")
	}
	return m.c.enter()
}

// tokenFor returns the owner token for one Lock call.
func (m *Mutex) tokenFor() string {
	if m.token != "" {
		return m.token
	}
	return newToken()
}

// tryErr turns an acquire error into Lock's error: a wait ended by ctx is
// "not obtained".
func (m *Mutex) tryErr(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return errors.Join(&NotObtainedError{Name: m.name}, context.Cause(ctx))
	}
	return err
}

// busy reports a failed attempt to the WithOnBusy function.
func (m *Mutex) busy(res driver.AcquireResult) {
	if m.opts.onBusy != nil {
		m.opts.onBusy(m.notObtained(res))
	}
}

func (m *Mutex) notObtained(res driver.AcquireResult) *NotObtainedError {
	return &NotObtainedError{
		Name: m.name, Holder: res.Holder, HolderTTL: res.HolderTTL,
		Shared: res.Shared, Permits: m.limit, WriterWaiting: res.WriterWaiting, Position: res.Position,
	}
}

// abandon removes what a wait that ended may have left on the store: a
// queue entry or a writer intent of token (last is the wait's last answer),
// before Lock returns unless the store is slow to answer (see settle). A
// token that outlives the wait (reentrant handle, WithOwnerID) may hold the
// lock meanwhile, which a release would end, so its entry is withdrawn
// without touching holds (driver.Withdrawer); where the backend cannot, or
// shared says that other waiters of this Client use the same entry, it is
// left to lapse after its QueueTTL.
func (m *Mutex) abandon(token string, last driver.AcquireResult, shared bool) {
	switch {
	case !last.Queued:
	case m.token == "":
		m.c.cleanup(m.key, token, m.opts.ttl)
	case shared:
	default:
		m.withdraw(token)
	}
}

// withdraw takes token's queue entry and writer intent off the store
// without touching its holds, where the backend can (driver.Withdrawer),
// before the call returns unless the store is slow to answer (see settle).
func (m *Mutex) withdraw(token string) {
	w, ok := m.c.backend.(driver.Withdrawer)
	if !ok {
		return
	}
	m.c.settle(m.opts.ttl, func(ctx context.Context) {
		if err := w.Withdraw(ctx, m.key, token); err != nil && !errors.Is(err, errors.ErrUnsupported) {
			m.c.log.Warn("dlock: leaving the queue failed; the entry lapses after its time to live", "name", m.name, "err", err)
		}
	})
}

// try makes one acquire attempt with token; wait tells the store that the
// caller waits (it may queue the token or record a writer intent), fair that
// the request respects the name's queue (and, with wait, joins it). It
// returns a lease when the lock was obtained, the store's answer when it was
// not, or an error when the store failed; then what the attempt may have
// written is removed.
func (m *Mutex) try(ctx context.Context, token string, wait, fair bool) (*Lease, driver.AcquireResult, error) {
	var joined *grant
	if m.opts.reentrant {
		m.mu.Lock()
		if m.held != nil {
			m.held.mu.Lock()
			if !m.held.ended {
				joined = m.held
			}
			m.held.mu.Unlock()
		}
		m.mu.Unlock()
	}
	req := driver.AcquireRequest{
		Key:       m.key,
		Token:     token,
		TTL:       m.opts.ttl,
		Reentrant: m.opts.reentrant,
		LockDelay: m.opts.lockDelay,
		Mode:      m.mode,
		Limit:     m.limit,
		Fair:      fair,
		Wait:      wait,
	}
	if wait {
		req.QueueTTL = m.opts.queueTTL()
	}
	sent := time.Now()
	if joined != nil {
		req.Owner = joined.owner
		req.Joining = joined.fence
		// Re-entry is one round trip that never waits. Its outcome must be
		// known, or the hold count could be left wrong, so it is not cut
		// short by ctx, only bounded by the TTL.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), m.opts.ttl)
		defer cancel()
	} else {
		req.Owner = m.c.owners.get(sent, m.opts.metadata)
	}
	res, err := m.c.backend.Acquire(ctx, req)
	if err != nil {
		m.unknownOutcome(token, joined, wait)
		return nil, res, wrapStore("acquire", m.name, err)
	}
	if !res.Acquired {
		return nil, res, nil
	}
	if res.Overtook && m.starve {
		m.c.hub.noteQueue(m.key)
	}
	if joined == nil || res.Fence != joined.fence {
		// A new grant is trusted until sent + validity − margin. An answer
		// that comes later than that brings a lease that is already dead:
		// give it back rather than hand the caller a lock it must not use.
		// The release is made before returning, so that a wait that tries
		// again with the same token cannot have its next grant released.
		if took := time.Since(sent); took >= m.c.validFor(m.opts.ttl)-m.opts.safetyMargin() {
			m.giveBack(ctx, token)
			if wait {
				return nil, driver.AcquireResult{}, nil // not obtained: the wait goes on
			}
			return nil, res, &NotObtainedError{Name: m.name, Slow: took}
		}
	}
	return m.grantLease(joined, token, req.Owner, res, sent), res, nil
}

// unknownOutcome deals with an acquire of token whose outcome is unknown
// (the store failed, or ctx ended, perhaps after the store acted): it may
// have added a hold. A token drawn for this one call holds nothing anyone
// else relies on, so what it may hold is released in the background. A
// handle's fixed token (Reentrant, WithOwnerID) is another matter: another
// goroutine of the handle may hold the lock with it, or be about to, and a
// release would take its hold away — two holders. Such a hold is counted as
// uncertain instead: the last Unlock of the handle's grant drains it, and
// when the handle holds nothing it lapses after its TTL. A queue entry or
// writer intent the acquire may have made (wait) is withdrawn all the same.
func (m *Mutex) unknownOutcome(token string, joined *grant, wait bool) {
	if m.token == "" {
		m.c.cleanup(m.key, token, m.opts.ttl)
		return
	}
	if wait && joined == nil {
		m.withdraw(token)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	g := joined
	if g == nil {
		g = m.held
	}
	if g != nil {
		g.mu.Lock()
		if !g.ended {
			g.uncertain = true
			g.mu.Unlock()
			return
		}
		g.mu.Unlock()
	}
	m.uncertain = true
}

// giveBack releases a grant that came too late to be used, within a TTL.
func (m *Mutex) giveBack(ctx context.Context, token string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.opts.ttl)
	defer cancel()
	m.c.releaseUnused(ctx, m.key, token, "giving back a grant that came too late")
}

// grantLease makes the lease for a successful acquire sent at sent.
func (m *Mutex) grantLease(joined *grant, token, owner string, res driver.AcquireResult, sent time.Time) *Lease {
	if joined != nil {
		var lost *LostError
		joined.mu.Lock()
		if !joined.ended && res.Fence != joined.fence {
			// The store made a fresh grant: the one this handle held was
			// gone (deleted, expired) without the client noticing yet.
			lost = joined.lose(LostMissing, nil)
		}
		if !joined.ended {
			l := newLease(joined)
			joined.leases = append(joined.leases, l)
			if d := sent.Add(m.c.validFor(joined.ttl)); d.After(joined.deadline) {
				joined.deadline = d
				joined.renewAt = sent.Add(joined.ttl / 3)
				m.c.renewer.reschedule(joined)
			}
			joined.mu.Unlock()
			return l
		}
		joined.mu.Unlock() // lost meanwhile: start a grant of its own
		m.c.logLoss(joined.name, lost, nil)
	}
	g, l := newGrant(m.c, m, token, owner, res.Fence, sent)
	if m.token != "" {
		m.mu.Lock()
		g.uncertain, m.uncertain = m.uncertain, false
		if m.opts.reentrant {
			m.held = g
		}
		m.mu.Unlock()
	}
	g.mu.Lock()
	m.c.renewer.reschedule(g)
	g.mu.Unlock()
	return l
}
