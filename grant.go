// A grant: one hold of a lock on the store by one token, and every change
// of its state (joining, renewing, losing, ending). No other file writes a
// grant's guarded fields.

package dlock

import (
	"context"
	"sync"
	"time"
)

// grant is one hold of a lock on the store by one token: the unit that is
// renewed and lost. Leases of a reentrant handle that hold the lock at the
// same time share one grant.
//
// Its life: newGrant (with its first lease) and schedule; rejoin adds a
// lease; beginRefresh/tick start a renewal and finishRenewal applies its
// answer; lose or stop end it (ended), after which it makes no store call.
type grant struct {
	c         *Client  // for the Client's services: releases, logging, background work
	r         *renewer // schedules the grant's renewals and safety deadline
	name      string
	typ       string // the lock type, for observers
	key       string
	token     string
	fence     uint64
	ttl       time.Duration
	valid     time.Duration // how long after its send time a grant or renewal is valid: ttl less the backend's drift
	margin    time.Duration
	autoRenew bool
	// reusedToken: the token outlives this grant (reentrant handle or
	// WithOwnerID), so after a loss it may hold a newer grant.
	reusedToken bool
	// sharedToken: other handles or processes may hold with the same token
	// (WithOwnerID), so the store's hold count is not all this handle's.
	sharedToken bool
	// hd is the handle whose fixed token the grant holds with (reentrant
	// handle, WithOwnerID), or nil: its last release is serialised with
	// the handle's acquires (see handle.reentry).
	hd *handle

	mu       sync.Mutex
	owner    string        // the owner string on the store (a Proclaim changes it)
	leases   []*Lease      // live leases on this grant
	first    [1]*Lease     // leases' first backing array, so that one holder costs no allocation
	deadline time.Time     // local validity deadline: send time of the last good acquire or renewal + valid
	renewAt  time.Time     // next automatic renewal
	lastErr  error         // error of the last renewal attempt, nil after a good one
	inflight chan struct{} // non-nil while a renewal is in flight; closed when it returns
	ended    bool          // lost or released: no store call for this grant any more
	// uncertain: the store may count more holds than this grant's leases (a
	// re-entry or a release whose outcome is unknown).
	uncertain bool

	// The renewer's bookkeeping, guarded by renewer.mu (renew.go).
	at    time.Time // next event, for the renewer's heap
	index int       // position in the renewer's heap, -1 when not in it
}

// grantAndLease is a new grant with its first lease, made in one
// allocation: a grant almost always has exactly one lease, and each keeps
// the other alive anyway (the lease points to its grant, the grant lists
// its live leases).
type grantAndLease struct {
	g grant
	l Lease
}

// newGrant makes the grant of h's acquire sent at sent, with its first
// lease on it; uncertain carries over holds of the token that the store
// may count (see handle.uncertain). The grant is not scheduled yet (see
// schedule).
func newGrant(c *Client, h *handle, token, owner string, fence uint64, sent time.Time, uncertain bool) (*grant, *Lease) {
	valid := c.validFor(h.opts.ttl)
	gl := &grantAndLease{g: grant{
		c:           c,
		r:           c.renewer,
		name:        h.name,
		typ:         h.typ,
		key:         h.key,
		token:       token,
		owner:       owner,
		fence:       fence,
		ttl:         h.opts.ttl,
		valid:       valid,
		margin:      h.opts.safetyMargin(),
		autoRenew:   h.opts.autoRenew,
		reusedToken: h.token != "",
		sharedToken: h.opts.ownerID != "",
		deadline:    sent.Add(valid),
		renewAt:     sent.Add(h.opts.ttl / 3),
		uncertain:   uncertain,
		index:       -1,
	}}
	if h.token != "" {
		gl.g.hd = h
	}
	g, l := &gl.g, &gl.l
	l.g = g
	g.first[0] = l
	g.leases = g.first[:1]
	return g, l
}

// handedOver sets the first deadline of a new grant that a release handed
// over (see handle.handedLease): valid after sent, its first renewal due at
// renewBy (see handedRenewBy; a batch that goes out a little before may
// take it along, as for any grant). Called before schedule.
func (g *grant) handedOver(sent time.Time, valid time.Duration, renewBy time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.deadline = sent.Add(valid)
	g.renewAt = renewBy.Add(g.renewSlack()) // due at renewBy: see renewDue
}

// schedule hands a new grant to the renewer.
func (g *grant) schedule() {
	g.mu.Lock()
	g.r.reschedule(g)
	g.mu.Unlock()
}

// ownerNow returns the owner string the grant has on the store.
func (g *grant) ownerNow() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.owner
}

// setOwner records the owner string a Proclaim gave the grant on the store.
func (g *grant) setOwner(owner string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.owner = owner
}

// live reports whether the grant has not ended.
func (g *grant) live() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.ended
}

// rejoin adds a lease for a re-entry sent at sent, which the store answered
// with fence, and extends the deadline. It returns no lease when the grant
// has ended, or when fence is not the grant's (the store made a fresh grant:
// this one was gone without the client noticing yet, and is lost now; the
// loss is returned to be logged).
func (g *grant) rejoin(fence uint64, sent time.Time) (*Lease, *LostError) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ended {
		return nil, nil
	}
	if fence != g.fence {
		return nil, g.lose(LostMissing, nil)
	}
	l := newLease(g)
	g.leases = append(g.leases, l)
	if g.extend(sent) {
		g.renewAt = sent.Add(g.ttl / 3)
		g.r.reschedule(g)
	}
	return l, nil
}

// extend moves the deadline to sent + valid when that is later, and
// reports whether it did. The caller holds g.mu.
func (g *grant) extend(sent time.Time) bool {
	d := sent.Add(g.valid)
	if !d.After(g.deadline) {
		return false
	}
	g.deadline = d
	return true
}

// markUncertain records that the store may count a hold no lease stands
// for, unless the grant has ended; it reports whether it recorded it.
func (g *grant) markUncertain() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ended {
		return false
	}
	g.uncertain = true
	return true
}

// safeUntil is when the lease must be treated as lost if it was not renewed.
// The caller holds g.mu.
func (g *grant) safeUntil() time.Time { return g.deadline.Add(-g.margin) }

// safeDeadline is safeUntil for callers that do not hold g.mu.
func (g *grant) safeDeadline() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.safeUntil()
}

// expireDue loses g when its safe deadline has passed and the renewer has
// not got to it yet (the process was paused, the scheduler is busy), so that
// every read of a lease's state agrees with the monotonic clock.
func (g *grant) expireDue() {
	g.mu.Lock()
	var lost *LostError
	if !g.ended && !time.Now().Before(g.safeUntil()) {
		lost = g.lose(g.lossReason(), g.lastErr)
	}
	g.mu.Unlock()
	if lost != nil {
		g.c.logLoss(g, lost, nil)
	}
}

// renewSlack is how early a renewal may go out to join a batch.
func (g *grant) renewSlack() time.Duration { return g.ttl / 30 }

// renewDue reports whether an automatic renewal should be sent now.
func (g *grant) renewDue(now time.Time) bool {
	return g.autoRenew && g.inflight == nil && !now.Before(g.renewAt.Add(-g.renewSlack()))
}

// nextEvent is when the renewer must next look at g: the safety deadline, or
// a renewal a little before it is due so that neighbours share a batch.
// The caller holds g.mu.
func (g *grant) nextEvent() time.Time {
	at := g.safeUntil()
	if g.autoRenew && g.inflight == nil {
		if r := g.renewAt.Add(-g.renewSlack()); r.Before(at) {
			at = r
		}
	}
	return at
}

// tick is the renewer's look at a grant that fell due at now: it loses the
// grant when its safety deadline has passed, starts a renewal when one is
// due at at (now, or a little later for a grant taken along into a batch)
// and reports it, and otherwise schedules the grant again.
func (g *grant) tick(now, at time.Time) (renew bool, lost *LostError) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.ended:
	case !now.Before(g.safeUntil()):
		lost = g.lose(g.lossReason(), g.lastErr)
	case g.renewDue(at):
		g.inflight = make(chan struct{})
		g.r.push(g)
		renew = true
	default:
		g.r.push(g)
	}
	return renew, lost
}

// beginRefresh starts a renewal for Lease.Refresh. When one is in flight
// already it returns its channel, to wait on before trying again; ended
// reports that the grant has ended.
func (g *grant) beginRefresh() (inflight <-chan struct{}, ended bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.ended:
		return nil, true
	case g.inflight != nil:
		return g.inflight, false
	}
	g.inflight = make(chan struct{})
	return nil, false
}

// finishRenewal ends the renewal in flight, sent at sent, with the store's
// answer, and returns what to log (see Client.logLoss).
func (g *grant) finishRenewal(sent time.Time, held bool, err error) (lost *LostError, failed error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	close(g.inflight)
	g.inflight = nil
	if g.ended {
		return nil, nil
	}
	switch {
	case err != nil:
		g.lastErr = err
		failed = err
		// Try again soon, but not in a tight loop, and more than once
		// before the safety deadline when little time is left (a handed
		// grant's first renewal).
		d := min(max(g.ttl/10, 10*time.Millisecond), time.Second)
		if left := time.Until(g.safeUntil()); left < 3*d {
			d = max(left/3, 10*time.Millisecond)
		}
		g.renewAt = time.Now().Add(d).Add(g.renewSlack())
	case !held:
		return g.lose(LostMissing, nil), nil
	default:
		g.lastErr = nil
		g.extend(sent)
		g.renewAt = sent.Add(g.ttl / 3)
	}
	if !time.Now().Before(g.safeUntil()) {
		return g.lose(g.lossReason(), g.lastErr), failed
	}
	g.r.reschedule(g)
	return nil, failed
}

// lossReason is the reason for a loss at the safety deadline.
func (g *grant) lossReason() LostReason {
	if g.lastErr != nil || g.inflight != nil {
		return LostUnreachable
	}
	return LostExpired
}

// lose ends the grant and every lease on it, and returns the loss to log
// once g.mu is released (nil when the grant had already ended). The caller
// holds g.mu.
func (g *grant) lose(reason LostReason, cause error) *LostError {
	if g.ended {
		return nil
	}
	g.ended = true
	g.r.remove(g)
	err := &LostError{Name: g.name, Reason: reason, Cause: cause}
	for _, l := range g.leases {
		l.finish(err)
	}
	g.leases = nil
	return err
}

// loseNow is lose for callers that do not hold g.mu.
func (g *grant) loseNow(reason LostReason, cause error) *LostError {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lose(reason, cause)
}

// closing ends the grant as the Client closes: it returns how many leases
// held it, to release as many holds, and the loss (nil when it had ended).
func (g *grant) closing() (holds int, lost *LostError) {
	g.mu.Lock()
	defer g.mu.Unlock()
	holds = len(g.leases)
	return holds, g.lose(LostClosed, nil)
}

// drop takes lease l off the grant for Unlock. It reports ended when the
// grant had ended already (l has its error then), and last when l was its
// last lease: then the grant ends here, unscheduled, and inflight is the
// renewal in flight, if any, to wait for before the release is sent.
func (g *grant) drop(l *Lease) (ended, last bool, inflight <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ended {
		return true, false, nil
	}
	for i, x := range g.leases {
		if x == l {
			g.leases = append(g.leases[:i], g.leases[i+1:]...)
			break
		}
	}
	if len(g.leases) > 0 {
		return false, false, nil
	}
	g.ended = true
	g.r.remove(g)
	return false, true, g.inflight
}

// release sends one release of g's token, and when last is set and the hold
// count on the store may be higher than the client knows (a re-entry or a
// release with an unknown outcome), drains the handle's extra holds. It
// reports whether the token held the lock.
//
// Unlock calls it, for a reentrant handle's grant, with the handle's reentry lock
// held (see reentryLock), so that the holds it counts and drains are this
// grant's own.
func (g *grant) release(ctx context.Context, last bool, start time.Duration) (held bool, err error) {
	res, err := g.c.storeRelease(ctx, g.key, g.token, g.fence, start)
	if err != nil {
		g.mu.Lock()
		g.uncertain = true // the hold may or may not be gone
		g.mu.Unlock()
		if last && g.hd != nil {
			// The hold may still be on the store: the handle's next grant,
			// which may join it, drains it at its last Unlock.
			g.hd.markUncertain()
		}
		return false, err
	}
	g.mu.Lock()
	drain := last && g.uncertain && !g.sharedToken
	g.mu.Unlock()
	for extra := res.Remaining; drain && res.Held && res.Remaining > 0 && extra > 0; extra-- {
		res, err = g.c.storeRelease(ctx, g.key, g.token, g.fence, 0)
		if err != nil {
			return true, err
		}
	}
	if drain && !res.Held && !g.hd.holdsOther(g) {
		// g's grant is gone, but an acquire of this handle whose outcome
		// was unknown may have made a fresh grant of the token since (the
		// store had lost g's): the token is the handle's alone (no owner
		// ID), so that hold is its own to drop, untied, as many times as
		// it has holds. g is still reported not held.
		for range maxOrphanHolds {
			r, err := g.c.storeRelease(ctx, g.key, g.token, 0, 0)
			if err != nil || !r.Held || r.Remaining == 0 {
				break
			}
		}
	}
	return res.Held, nil
}

// releaseRetry sends the last release of g's token again after the
// transient store error err, with pauses (transientDelay), while ctx allows
// and until the next try would go out after until. It returns nil once the
// store answers, whatever the answer: a token that holds nothing any more
// was released by an earlier try whose answer was lost (g's token is used
// once; see Lease.unlock). It returns the last error otherwise.
func (g *grant) releaseRetry(ctx context.Context, err error, until time.Time) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for n := 1; err != nil && transient(err); n++ {
		d := transientDelay(n)
		if !time.Now().Add(d).Before(until) || !sleep(ctx, timer, d, nil) {
			return err
		}
		_, err = g.release(ctx, true, 0)
	}
	return err
}

// releaseLater sends the last release of g's token in the background for an
// Unlock that could not see it through, and again through transient
// errors until the lease's deadline, when the store drops it anyway.
func (g *grant) releaseLater(ctx context.Context) {
	if _, err := g.release(ctx, true, 0); err != nil {
		if err = g.releaseRetry(ctx, err, g.deadlineNow()); err != nil {
			g.c.log.Warn("dlock: release failed; the lock expires on the store at the lease's deadline", "lock", g.name, "fence", g.fence, "err", err)
		}
	}
}

// deadlineNow is g's deadline, for callers that do not hold g.mu.
func (g *grant) deadlineNow() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.deadline
}

// maxOrphanHolds bounds the releases that drop a fresh grant a handle's
// unknown acquire may have left.
const maxOrphanHolds = 16
