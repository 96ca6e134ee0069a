package dlock

import (
	"sync"
	"time"
)

// grant is one hold of a lock on the store by one token: the unit that is
// renewed and lost. Leases of a reentrant handle that hold the lock at the
// same time share one grant.
type grant struct {
	c         *Client
	name      string
	key       string
	token     string
	owner     string
	fence     uint64
	ttl       time.Duration
	margin    time.Duration
	autoRenew bool
	// reusedToken: the token outlives this grant (reentrant handle or
	// WithOwnerID), so after a loss it may hold a newer grant.
	reusedToken bool
	// sharedToken: other handles or processes may hold with the same token
	// (WithOwnerID), so the store's hold count is not all this handle's.
	sharedToken bool

	mu       sync.Mutex
	leases   []*Lease      // live leases on this grant
	first    [1]*Lease     // leases' first backing array, so that one holder costs no allocation
	deadline time.Time     // local validity deadline: send time of the last good acquire or renewal + ttl − the backend's drift
	renewAt  time.Time     // next automatic renewal
	lastErr  error         // error of the last renewal attempt, nil after a good one
	inflight chan struct{} // non-nil while a renewal is in flight; closed when it returns
	ended    bool          // lost or released: no store call for this grant any more
	// uncertain: the store may count more holds than this grant's leases (a
	// re-entry or a release whose outcome is unknown).
	uncertain bool

	at    time.Time // next event, for the renewer's heap (guarded by renewer.mu)
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

// newGrant makes the grant of an acquire sent at sent, with its first lease
// on it. The grant is not scheduled yet.
func newGrant(c *Client, m *Mutex, token, owner string, fence uint64, sent time.Time) (*grant, *Lease) {
	gl := &grantAndLease{g: grant{
		c:           c,
		name:        m.name,
		key:         m.key,
		token:       token,
		owner:       owner,
		fence:       fence,
		ttl:         m.opts.ttl,
		margin:      m.opts.safetyMargin(),
		autoRenew:   m.opts.autoRenew,
		reusedToken: m.token != "",
		sharedToken: m.opts.ownerID != "",
		deadline:    sent.Add(c.validFor(m.opts.ttl)),
		renewAt:     sent.Add(m.opts.ttl / 3),
		index:       -1,
	}}
	g, l := &gl.g, &gl.l
	l.g = g
	g.first[0] = l
	g.leases = g.first[:1]
	return g, l
}

// safeUntil is when the lease must be treated as lost if it was not renewed.
func (g *grant) safeUntil() time.Time { return g.deadline.Add(-g.margin) }

// renewSlack is how early a renewal may go out to join a batch.
func (g *grant) renewSlack() time.Duration { return g.ttl / 30 }

// renewDue reports whether an automatic renewal should be sent now.
func (g *grant) renewDue(now time.Time) bool {
	return g.autoRenew && g.inflight == nil && !now.Before(g.renewAt.Add(-g.renewSlack()))
}

// nextEvent is when the renewer must next look at g: the safety deadline, or
// a renewal a little before it is due so that neighbours share a batch.
func (g *grant) nextEvent() time.Time {
	at := g.safeUntil()
	if g.autoRenew && g.inflight == nil {
		if r := g.renewAt.Add(-g.renewSlack()); r.Before(at) {
			at = r
		}
	}
	return at
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
	g.c.renewer.remove(g)
	err := &LostError{Name: g.name, Reason: reason, Cause: cause}
	for _, l := range g.leases {
		l.finish(err)
	}
	g.leases = nil
	return err
}

// applyRenewal records the outcome of a renewal sent at sent and returns
// what to log once g.mu is released. The caller holds g.mu.
func (g *grant) applyRenewal(sent time.Time, held bool, err error) (lost *LostError, failed error) {
	if g.ended {
		return nil, nil
	}
	switch {
	case err != nil:
		g.lastErr = err
		failed = err
		// Try again soon, but not in a tight loop.
		g.renewAt = time.Now().Add(min(max(g.ttl/10, 10*time.Millisecond), time.Second)).Add(g.renewSlack())
	case !held:
		return g.lose(LostMissing, nil), nil
	default:
		g.lastErr = nil
		if d := sent.Add(g.c.validFor(g.ttl)); d.After(g.deadline) {
			g.deadline = d
		}
		g.renewAt = sent.Add(g.ttl / 3)
	}
	if !time.Now().Before(g.safeUntil()) {
		return g.lose(g.lossReason(), g.lastErr), failed
	}
	g.c.renewer.reschedule(g)
	return nil, failed
}

// logLoss logs a loss and a failed renewal; call it without holding g.mu,
// since a log handler may call back into the lease.
func (c *Client) logLoss(name string, lost *LostError, failed error) {
	if failed != nil {
		c.log.Warn("dlock: renewal failed", "name", name, "err", failed)
	}
	if lost != nil {
		c.log.Warn("dlock: lease lost", "name", name, "reason", lost.Reason.String(), "err", lost.Cause)
	}
}

// stopRenewal ends the grant for a release and returns the channel of a
// renewal in flight, if any, to wait on before the release is sent. The
// caller holds g.mu.
func (g *grant) stopRenewal() <-chan struct{} {
	g.ended = true
	g.c.renewer.remove(g)
	return g.inflight
}
