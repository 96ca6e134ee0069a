// Lease, one holder's view of a grant: its loss signal (Done, Err, Context,
// Deadline), Refresh and Unlock.

package dlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Lease is one hold of a lock. It tells its holder, like a context.Context,
// when the hold ends: Done is closed and Err set when it is unlocked or lost,
// and Context is cancelled at the same moment. A lease that could not be
// renewed is treated as lost at Deadline minus the safety margin, before the
// store could give the lock to anyone else.
//
// A Lease is safe for concurrent use. The zero Lease is not valid: its methods
// return ErrInvalid or act as if it were released.
type Lease struct {
	g *grant
	// done holds the chan struct{} that Done returns, made on first use:
	// most holders never ask for it. It is stored under mu and closed by
	// finish; once the lease has ended, a first Done gets closedChan.
	done atomic.Value

	// at is when the store granted the lease (its answer came back), as
	// the observer's clock reads it (observer.at), for Event.Held and
	// Event.Wait; zero on a Client without an observer, and until set.
	at time.Duration

	mu        sync.Mutex
	err       error // nil while held
	ctx       context.Context
	cancel    context.CancelCauseFunc
	held      *heldContext // ctx as Context returns it
	unlocking bool
}

// newLease makes a further lease on g (a re-entry); newGrant makes the
// first.
func newLease(g *grant) *Lease {
	return &Lease{g: g}
}

// Name returns the lock's name, without the key prefix.
func (l *Lease) Name() string {
	if l == nil || l.g == nil {
		return ""
	}
	return l.g.name
}

// Fence returns the grant's fencing token: larger than the fence of every
// earlier grant of this lock on this store. Pass it to the resource the lock
// protects so that it can refuse writes from a holder whose lease has already
// run out (see the package documentation).
func (l *Lease) Fence() uint64 {
	if l == nil || l.g == nil {
		return 0
	}
	return l.g.fence
}

// Owner returns the owner string stored with the lock:
// "host|pid N|acquired-at", followed by "|metadata" when WithMetadata was
// given (or, for a leadership, by the value of its last Proclaim).
func (l *Lease) Owner() string {
	if l == nil || l.g == nil {
		return ""
	}
	return l.g.ownerNow()
}

// Done returns a channel that is closed when the lease ends: at Unlock, or
// when it is lost. Like Err, it reads the safe deadline when called.
func (l *Lease) Done() <-chan struct{} {
	if l == nil || l.g == nil {
		return closedChan
	}
	l.g.expireDue()
	if d, ok := l.done.Load().(chan struct{}); ok {
		return d
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if d, ok := l.done.Load().(chan struct{}); ok {
		return d
	}
	d := closedChan
	if l.err == nil {
		d = make(chan struct{})
	}
	l.done.Store(d)
	return d
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Err returns nil while the lease is held, ErrReleased after Unlock, and a
// *LostError (errors.Is(err, ErrLost)) when it was lost: its Reason tells
// whether it expired, went missing on the store, could not be renewed because
// the store was unreachable, or the Client was closed.
//
// Err reads the monotonic clock when called: past the safe deadline
// (Deadline minus the safety margin) it reports the lease lost even when
// the renewal goroutine has not run yet, as after the process was paused.
func (l *Lease) Err() error {
	if l == nil || l.g == nil {
		return invalid("lease: nil or not made by a Client")
	}
	l.g.expireDue()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Context returns a context that is cancelled when the lease ends; its
// context.Cause is the lease's Err. Run the work the lock protects under it.
// Its Err and Done read the safe deadline when called, as Lease.Err does.
// A context made from it (context.WithTimeout, say) learns of the end only
// once this one is cancelled, by the renewal goroutine or by such a read,
// so check this context or the lease itself right before a write.
func (l *Lease) Context() context.Context {
	if l == nil || l.g == nil {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(invalid("lease: nil or not made by a Client"))
		return ctx
	}
	l.g.expireDue()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx == nil {
		l.ctx, l.cancel = context.WithCancelCause(withHold(context.Background(), &heldLeases{l: l}, false))
		if l.err != nil {
			l.cancel(l.err)
		}
	}
	if l.held == nil {
		l.held = &heldContext{Context: l.ctx, sync: l.g.expireDue}
	}
	return l.held
}

// observedContext makes the lease's Context now, with the values of octx
// (a ContextObserver's, such as a span) and without its cancellation.
func (l *Lease) observedContext(octx context.Context) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx != nil {
		return
	}
	l.ctx, l.cancel = context.WithCancelCause(withHold(context.WithoutCancel(octx), &heldLeases{l: l}, false))
	if l.err != nil {
		l.cancel(l.err)
	}
	l.held = &heldContext{Context: l.ctx, sync: l.g.expireDue}
}

// Deadline returns the local validity deadline: the moment the last
// successful acquire or renewal was sent plus the TTL (less the backend's
// drift allowance), on this process's monotonic clock. The store cannot have
// let the lease go before then, give or take its clock's granularity
// (stores count expiry in milliseconds on their wall clock, so a lease can
// end a millisecond or two early); the lease is treated as lost at Deadline
// minus the safety margin if it could not be renewed, which keeps the holder
// clear of that.
func (l *Lease) Deadline() time.Time {
	if l == nil || l.g == nil {
		return time.Time{}
	}
	l.g.mu.Lock()
	defer l.g.mu.Unlock()
	return l.g.deadline
}

// CallContext returns a context for one call to the resource the lease
// protects: it ends when parent does, when the lease ends (cancelled with
// its Err), and at the lease's safe deadline as it stands now (Deadline
// minus the safety margin), so that a driver that honours deadlines stops
// a call, or refuses to start it, before the store can have given the lock
// to someone else. Lease.Context has no deadline, since renewals move it.
// A call already on the wire can still land late: the fence is what makes
// the resource refuse it (see docs/FENCING.md). The context carries the
// lease, on top of those parent carries (LeaseFromContextByName). Call cancel when the call is done.
func (l *Lease) CallContext(parent context.Context) (ctx context.Context, cancel context.CancelFunc) {
	if l == nil || l.g == nil {
		ctx, cancel := context.WithCancelCause(parent)
		cancel(invalid("lease: nil or not made by a Client"))
		return ctx, func() {}
	}
	ctx, cancelCause := context.WithCancelCause(withHold(parent, &heldLeases{l: l}, true))
	ctx, cancelDeadline := context.WithDeadline(ctx, l.g.safeDeadline())
	stop := context.AfterFunc(l.Context(), func() { cancelCause(l.Err()) })
	return ctx, func() {
		stop()
		cancelDeadline()
		cancelCause(context.Canceled)
	}
}

// finish ends the lease with err, once.
func (l *Lease) finish(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return
	}
	l.err = err
	if d, ok := l.done.Load().(chan struct{}); ok {
		close(d) // not closedChan: that is stored only once err is set
	}
	if l.cancel != nil {
		l.cancel(err)
	}
	l.g.c.rides.unhold(l.g.key, l) // parked attempts go out (see rides)
}

// Refresh renews the lease now, for leases without automatic renewal or to
// renew early. It returns ErrNotHeld (and the lease is lost) when the store
// no longer has it or the lease was lost while the renewal was on its way,
// ErrReleased after or during Unlock, and the store's error, wrapped, when
// the store fails.
func (l *Lease) Refresh(ctx context.Context) error {
	if l == nil || l.g == nil {
		return invalid("lease: nil or not made by a Client")
	}
	g := l.g
	for {
		l.mu.Lock()
		err, unlocking := l.err, l.unlocking
		l.mu.Unlock()
		switch {
		case err != nil:
			return heldErr("refresh", g.name, err)
		case unlocking:
			return heldErr("refresh", g.name, ErrReleased)
		}
		wait, ended := g.beginRefresh()
		if ended {
			wait = l.Done() // ending right now; l.err is set in a moment
		}
		if wait == nil {
			break
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return fmt.Errorf("dlock: refresh %q: %w", g.name, ctx.Err())
		}
	}
	sent := time.Now()
	held, err := g.r.renewOne(ctx, g)
	lost, failed := g.finishRenewal(sent, held, err)
	g.c.logLoss(g, lost, failed)
	g.c.obs.renewed(1, boolInt(err != nil || !held), sent)
	switch {
	case err != nil:
		return wrapStore("refresh", g.name, err)
	case !held:
		return heldErr("refresh", g.name, l.Err())
	}
	if lerr := l.Err(); lerr != nil {
		// Ended while the renewal was on the wire (lost at the safe
		// deadline, or unlocked): the renewal did not keep it.
		return heldErr("refresh", g.name, lerr)
	}
	return nil
}

// Unlock releases this hold. Renewal of the lease stops before Unlock sends
// the release (a renewal already in flight is waited for), so no renewal of it
// reaches the store after Unlock returns. On a reentrant lock the last Unlock
// releases the lock and wakes its waiters. Unlock sends the release even when
// the Client is being closed.
//
// A release that meets a store error that may heal (driver.ErrTransient)
// is sent again, with pauses, while ctx and the lease's safe deadline
// allow (not for a reentrant handle or an owner ID, whose token a later
// Lock may hold again, nor for a hold that is not the grant's last).
//
// Unlock returns ErrNotHeld when the lease had been lost or the store no
// longer had it (but nil when the lease was valid as Unlock began and the
// release, held up, came back after the store may have let it lapse: the
// hold ended on the store either way), ErrReleased when it was already unlocked, ErrInvalid for a
// nil lease, ctx's error when ctx has ended or ends before the store
// answers (the release is then sent in the background, bounded by the TTL,
// after a renewal in flight is back; not for a reentrant handle or an owner
// ID), an error saying that the release is unconfirmed and retried in the
// background (wrapping the store's error) when transient errors lasted
// until the lease's safe deadline: the release goes on until the lease's
// deadline, when the store drops the lease anyway, and Client.Close waits
// for it; and the store's error, wrapped, when the release failed
// otherwise: the lock then expires on the store after its TTL. In every
// case the lease has ended when Unlock returns.
func (l *Lease) Unlock(ctx context.Context) error {
	if l == nil || l.g == nil {
		return invalid("lease: nil or not made by a Client")
	}
	obs := l.g.c.obs
	if obs == nil {
		return l.unlock(ctx, 0)
	}
	start := obs.now()
	err := l.unlock(ctx, start)
	obs.unlocked(l, start, err)
	return err
}

// unlock is Unlock, unobserved but for start: when Unlock began on the
// observer's clock (0 without an observer), which the release's store call
// reuses as its own start where nothing was waited for before it.
func (l *Lease) unlock(ctx context.Context, start time.Duration) error {
	g := l.g
	c := g.c
	began := time.Now()
	l.mu.Lock()
	if err := l.err; err != nil {
		l.mu.Unlock()
		return l.afterEnd(ctx, err)
	}
	if l.unlocking { // another Unlock is on its way: wait for its outcome
		l.mu.Unlock()
		select {
		case <-l.Done():
			if err := l.Err(); !errors.Is(err, ErrReleased) {
				return heldErr("unlock", g.name, err)
			}
			return heldErr("unlock", g.name, ErrReleased)
		case <-ctx.Done():
			return fmt.Errorf("dlock: unlock %q: %w", g.name, ctx.Err())
		}
	}
	l.unlocking = true
	l.mu.Unlock()

	// Count as a call in progress so that Close waits for this release;
	// after Close has begun, go on unregistered.
	if c.enter() == nil {
		defer c.exit()
	}

	if hd := g.hd; hd != nil && hd.drains {
		// Keep the handle's acquires out from here through the release
		// and its drain (see reentryLock).
		if err := hd.reentry.enter(ctx, nil, true); err != nil {
			// Given up: this hold stays on the store, for the grant's last
			// Unlock or the handle's next grant to drain, or to lapse.
			ended, last, _ := g.drop(l)
			switch {
			case ended:
				return l.afterEnd(ctx, l.Err())
			case last:
				hd.markUncertain()
			default:
				g.markUncertain()
			}
			l.finish(ErrReleased)
			return fmt.Errorf("dlock: unlock %q: %w", g.name, err)
		}
		defer hd.reentry.exit(true)
		start = 0 // it may have waited for the reentry lock
	}

	ended, last, inflight := g.drop(l)
	if ended { // lost meanwhile: lose has set l.err
		return l.afterEnd(ctx, l.Err())
	}

	// A token used once (not a reentrant handle's or an owner ID, which a
	// later Lock may hold again) can be released after Unlock returned.
	later := last && !g.reusedToken
	if inflight != nil {
		start = 0 // the wait for the renewal is no part of the release
		select {
		case <-inflight:
		case <-ctx.Done():
			l.finish(ErrReleased)
			if last && g.hd != nil {
				// No release goes out for a token a later Lock may hold
				// again: the handle's next grant, which may join this
				// hold, drains it.
				g.hd.markUncertain()
			}
			if later {
				c.background(g.ttl, func(bctx context.Context) {
					<-inflight
					g.releaseLater(bctx)
				})
			}
			return fmt.Errorf("dlock: unlock %q: %w", g.name, ctx.Err())
		}
	}
	if ctx.Err() != nil && later {
		// The caller has given up on waiting, not on releasing: send the
		// release in the background rather than leave the lock on the store
		// until its TTL runs out.
		l.finish(ErrReleased)
		c.background(g.ttl, func(bctx context.Context) { g.releaseLater(bctx) })
		return fmt.Errorf("dlock: unlock %q: %w", g.name, ctx.Err())
	}
	held, err := g.release(ctx, last, start)
	if err != nil && later && transient(err) && ctx.Err() == nil {
		// A token used once may be released twice: try again while ctx
		// and the lease's safe deadline allow.
		held, err = true, g.releaseRetry(ctx, err, g.safeDeadline())
	}
	switch {
	case err != nil && ctx.Err() != nil && later:
		// Cut short by ctx: the outcome is unknown; release again in the
		// background (a release of a token that holds nothing is harmless).
		l.finish(ErrReleased)
		c.background(g.ttl, func(bctx context.Context) { g.releaseLater(bctx) })
		if errors.Is(err, ctx.Err()) {
			return fmt.Errorf("dlock: unlock %q: %w", g.name, ctx.Err())
		}
		return fmt.Errorf("dlock: unlock %q: %w; release unconfirmed, retried in the background: %w", g.name, ctx.Err(), err)
	case err != nil && later && transient(err):
		// Not confirmed by the lease's safe deadline: go on until the
		// store would drop the lease anyway.
		l.finish(ErrReleased)
		until := time.Until(g.deadlineNow())
		c.background(g.ttl, func(bctx context.Context) { g.releaseLater(bctx) })
		return fmt.Errorf("dlock: unlock %q: release unconfirmed, retried in the background until the lease's deadline (in %s): %w",
			g.name, max(until, 0).Round(time.Millisecond), err)
	case err != nil:
		l.finish(ErrReleased)
		return wrapStore("unlock", g.name, err)
	case !held && lapsedMeanwhile(g, began):
		l.finish(ErrReleased)
		return nil
	case !held:
		lost := &LostError{Name: g.name, Reason: LostMissing}
		if gl := g.loseNow(LostMissing, nil); gl != nil {
			lost = gl
		}
		l.finish(lost)
		c.logLoss(g, lost, nil)
		return heldErr("unlock", g.name, lost)
	}
	l.finish(ErrReleased)
	return nil
}

// lapsedMeanwhile reports whether g was valid when an Unlock began and its
// release came back after the deadline, when the store may have let the hold
// lapse (a frozen member, a slow link): the hold ended after the caller's work.
func lapsedMeanwhile(g *grant, began time.Time) bool {
	return began.Before(g.safeDeadline()) && !time.Now().Before(g.deadlineNow())
}

// afterEnd is Unlock of a lease that had already ended with err. A lease lost
// because the store could not be reached may still be on the store: release
// it, best effort, so that others need not wait for its TTL. Only a token
// drawn for this one grant is safe to release that way; a reused token may
// hold a newer grant by now.
func (l *Lease) afterEnd(ctx context.Context, err error) error {
	g := l.g
	var lost *LostError
	if errors.As(err, &lost) && !g.reusedToken &&
		(lost.Reason == LostUnreachable || lost.Reason == LostExpired) {
		_, _ = g.c.storeRelease(ctx, g.key, g.token, g.fence, 0)
	}
	return heldErr("unlock", g.name, err)
}

// heldErr describes an operation on a lease that has ended with err
// (ErrReleased or a *LostError).
func heldErr(op, name string, err error) error {
	return &endedError{op: op, name: name, err: err}
}

// endedError is the error of an operation on a lease that has ended. It
// matches ErrReleased, or ErrNotHeld and the *LostError.
type endedError struct {
	op, name string
	err      error
}

func (e *endedError) Error() string {
	var lost *LostError
	if errors.As(e.err, &lost) {
		msg := fmt.Sprintf("dlock: %s %q: lock not held: lease lost: %s", e.op, e.name, lost.Reason)
		if lost.Cause != nil {
			msg += ": " + lost.Cause.Error()
		}
		return msg
	}
	return fmt.Sprintf("dlock: %s %q: lease already released", e.op, e.name)
}

func (e *endedError) Unwrap() []error {
	if errors.Is(e.err, ErrReleased) {
		return []error{ErrReleased}
	}
	return []error{ErrNotHeld, e.err}
}
