// Giving back what a Client may hold on the store without a lease to show
// for it, in one place.
//
// Every release of a hold goes through Client.storeRelease: Unlock's, a
// lost lease's, a grant that came too late (handle.giveBack), and the
// clean-ups below, but for the clean-up of a token that kept the Client's
// place in a fair queue (placeRelease), which takes the place's successor
// out with it (driver.PlaceReleaser). A Lock that ends without a lease
// leaves through one of two doors of its handle:
//
//   - unknownOutcome, after an acquire whose answer never came: a per-call
//     token is released in the background (Client.cleanup); a token that
//     outlives the call (a reentrant handle's, an owner ID's) may hold the
//     lock for another Lock, so its possible extra hold is counted instead
//     (handle.uncertain, drained by the handle's last Unlock), and its queue
//     place withdrawn;
//   - abandon, after a wait that ended: the queue entry or writer intent of
//     its last answer is released or withdrawn.
//
// A wait that goes on with a new token (its attempt's outcome unknown, or
// its grant too late) gives the old one back through handOver, which first
// moves the wait's writer intent to the new token.
//
// Both wait for the store up to settleWait, so that the next TryLock finds
// the lock as free as it is, and go on in the background after that.

package dlock

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// cleanup releases, in the background, what an acquire of token with an
// unknown outcome, or a wait that ended, may have left on key, before the
// call returns when the store answers within settleWait (see settle).
func (c *Client) cleanup(key, token string, ttl time.Duration) {
	c.settle(ttl, c.cleanupRelease(key, token))
}

// cleanupRelease returns the release of token on key, tied to no grant,
// that a clean-up sends, and that logs its failure.
func (c *Client) cleanupRelease(key, token string) func(ctx context.Context) {
	return func(ctx context.Context) {
		if _, err := c.storeRelease(ctx, key, token, 0, 0); err != nil {
			c.log.Warn("dlock: clean-up after an interrupted acquire failed; the lock expires after its TTL", "lock", strings.TrimPrefix(key, c.opts.keyPrefix), "err", err)
		}
	}
}

// settleWait bounds how long a call that ends waits for its clean-up on the
// store (see settle).
const settleWait = 250 * time.Millisecond

// settle runs fn, with a context that ends after timeout, and waits for it
// up to settleWait: a wait that gives up withdraws its place before Lock
// returns, so that the next TryLock finds the lock as free as it is, while
// a store that does not answer delays the caller no more than settleWait;
// fn then goes on in the background (Close waits for it).
func (c *Client) settle(timeout time.Duration, fn func(ctx context.Context)) {
	done := make(chan struct{})
	c.background(timeout, func(ctx context.Context) {
		defer close(done)
		fn(ctx)
	})
	t := time.NewTimer(settleWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// storeRelease sends one release of token on key, and wakes this Client's
// waiters on key at once when it left the lock free. A waiter's attempt
// parked on key goes out with it (see rides). With a fence it is
// tied to the grant of that fence where the backend can do it
// (driver.GrantReleaser): a token that a later Lock may hold again (a
// reentrant handle's, an owner ID's) must not see a late copy of this
// release drop that later grant. start is the observer's clock read just
// before (observer.now), or 0 to read it here.
func (c *Client) storeRelease(ctx context.Context, key, token string, fence uint64, start time.Duration) (driver.ReleaseResult, error) {
	if start == 0 {
		start = c.obs.now()
	}
	var res driver.ReleaseResult
	var err error
	var rd *ride
	if c.rides != nil && ctx.Err() == nil {
		rd = c.rides.take(key) // a waiter's attempt, parked for this release
	}
	if rd != nil {
		res, err = c.releaseWith(ctx, rd, key, token, fence)
	} else if gr, ok := c.backend.(driver.GrantReleaser); ok && fence > 0 {
		res, err = gr.ReleaseGrant(ctx, key, token, fence)
	} else {
		res, err = c.backend.Release(ctx, key, token)
	}
	c.obs.storeCall("release", key, start, err)
	if err == nil && res.Held && res.Remaining == 0 {
		c.hub.wakeKey(key, rd != nil)
	}
	return res, err
}

// giveBack releases a grant of fence that came too late to be used, within
// a TTL, tied to that grant where the backend can (driver.GrantReleaser).
func (h *handle) giveBack(ctx context.Context, token string, fence uint64) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.opts.ttl)
	defer cancel()
	if _, err := h.c.storeRelease(ctx, h.key, token, fence, 0); err != nil {
		h.c.log.Warn("dlock: giving back a grant that came too late failed; the lock expires after its TTL", "lock", h.name, "fence", fence, "err", err)
	}
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
func (h *handle) unknownOutcome(token string, joined *grant, wait bool) {
	if h.token == "" {
		h.c.cleanup(h.key, token, h.opts.ttl)
		return
	}
	if wait && joined == nil {
		h.withdraw(token)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	g := joined
	if g == nil {
		g = h.held
	}
	if g == nil || !g.markUncertain() {
		h.uncertain = true
	}
}

// markUncertain records that the store may count a hold of the handle's
// token that no lease stands for (see uncertain).
func (h *handle) markUncertain() {
	h.mu.Lock()
	h.uncertain = true
	h.mu.Unlock()
}

// abandon removes what a wait that ended may have left on the store: a
// queue entry or a writer intent of token (last is the wait's last answer),
// before Lock returns unless the store is slow to answer (see settle). A
// token that outlives the wait (reentrant handle, WithOwnerID) may hold the
// lock meanwhile, which a release would end, so its entry is withdrawn
// without touching holds (driver.Withdrawer); where the backend cannot, or
// shared says that other waiters of this Client use the same entry, it is
// left to lapse after its QueueTTL.
func (h *handle) abandon(token string, last driver.AcquireResult, shared bool) {
	switch {
	case !last.Queued:
	case h.token == "":
		h.c.cleanup(h.key, token, h.opts.ttl)
	case shared:
	default:
		h.withdraw(token)
	}
}

// abandon removes what the wait w, which ended, may have left on the
// store (handle.abandon), whenever its token ever had a place: an intent or
// entry that lapsed between two attempts (the last answer then says "not
// queued") stays behind as an expired record on a SQL store. When its
// token kept the Client's place, a release may have handed it the lock
// and queued its successor, which its clean-up takes out too.
func (w *waiter) abandon() {
	if w.place {
		w.h.c.settle(w.h.opts.ttl, w.h.c.placeRelease(w.h.key, w.token))
		return
	}
	last := w.last
	last.Queued = last.Queued || w.queuedEver
	w.h.abandon(w.token, last, w.queue != nil && w.h.hub.entryUsers(w.g, w.token) > 1)
}

// withdrawPlace releases, in the background, the queue place p that a
// release made for the Client and no waiter of it took (see
// waiter.passPlace): its entry, the grant a release may have handed it
// meanwhile, and the successor that release may have queued. Its token
// was drawn for that place alone.
func (h *handle) withdrawPlace(p *queuePlace) {
	h.c.background(h.opts.ttl, h.c.placeRelease(h.key, p.token))
}

// placeRelease returns the clean-up of token, a token that kept the
// Client's place in the queue (driver.PlaceReleaser): its hold and entry
// go, and its successor's entry with them. It wakes the Client's waiters
// when it left the lock free, and logs its failure.
func (c *Client) placeRelease(key, token string) func(ctx context.Context) {
	return func(ctx context.Context) {
		pr := c.backend.(driver.PlaceReleaser) // handles without one keep no place
		start := c.obs.now()
		res, err := pr.ReleasePlace(ctx, key, token)
		c.obs.storeCall("release", key, start, err)
		if err != nil {
			c.log.Warn("dlock: clean-up of a place in the queue failed; it expires after its time to live", "lock", strings.TrimPrefix(key, c.opts.keyPrefix), "err", err)
			return
		}
		if res.Held && res.Remaining == 0 {
			c.hub.wakeKey(key, false)
		}
	}
}

// withdraw takes token's queue entry and writer intent off the store
// without touching its holds, where the backend can (driver.Withdrawer),
// before the call returns unless the store is slow to answer (see settle).
func (h *handle) withdraw(token string) {
	w, ok := h.backend.(driver.Withdrawer)
	if !ok {
		return
	}
	h.c.settle(h.opts.ttl, func(ctx context.Context) {
		start := h.c.obs.now()
		err := w.Withdraw(ctx, h.key, token)
		h.c.obs.storeCall("withdraw", h.key, start, err)
		if err != nil && !errors.Is(err, errors.ErrUnsupported) {
			h.hub.log.Warn("dlock: leaving the queue failed; the entry lapses after its time to live", "lock", h.name, "err", err)
		}
	})
}

// handOver gives back token old of a wait that goes on with token to: an
// attempt of old of unknown outcome (fence 0), or old's grant of fence
// that came too late. Where the backend can (driver.IntentMover), old's
// writer intent first moves to to (or to gets one when old holds the
// lock), so that old's release lets no new reader in before the writer. It
// reports whether to may have an intent, for the wait's clean-up: whenever
// a move was sent (a lost answer, or a Redlock minority, may have moved
// it). With retry, a transient error of the move keeps old for another try
// (waiter.handPrior) and is returned; otherwise old goes whatever the move
// did.
func (h *handle) handOver(ctx context.Context, old, to string, fence uint64, retry bool) (bool, error) {
	var err error
	mv, ok := h.backend.(driver.IntentMover)
	if ok {
		_, err = mv.MoveIntent(ctx, h.key, old, to, h.c.owner(time.Now(), h.opts.metadata), h.qttl)
	}
	if err != nil && retry && fence == 0 && transient(err) && ctx.Err() == nil {
		return true, err
	}
	if fence > 0 {
		h.giveBack(ctx, old, fence)
	} else {
		h.c.cleanup(h.key, old, h.opts.ttl)
	}
	return ok && !errors.Is(err, errors.ErrUnsupported), nil
}
