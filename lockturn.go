// A Lock call: its first attempt, or its turn among its Client's waiters
// on the name without one, and the way into the wait (lockwait.go).

package dlock

import (
	"context"
	"errors"
	"runtime"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// lock is Lock of every kind: a first attempt, then the wait (lockwait.go).
func (h *handle) lock(ctx context.Context) (*Lease, error) {
	if h.c == nil || h.c.obs == nil {
		l, _, _, err := h.lockWait(ctx)
		return l, err
	}
	start, octx := h.c.obs.started(ctx, h, false)
	l, w, sent, err := h.lockWait(ctx)
	attempts, handoff := 1, false
	if w != nil {
		attempts, handoff = w.attempts, w.handoff
		if !sent.IsZero() { // the first attempt, before the wait
			attempts++
		}
	}
	h.c.obs.lockEnded(octx, h, false, h.c.obs.startOf(start, sent), l, attempts, handoff, err)
	return l, err
}

// lockWait is lock, unobserved; it returns the wait's waiter, if it
// waited, and when its first request was sent (zero when none was).
func (h *handle) lockWait(ctx context.Context) (*Lease, *waiter, time.Time, error) {
	if err := h.enter(); err != nil {
		return nil, nil, time.Time{}, err
	}
	defer h.c.exit()
	if h.opts.wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, h.opts.wait)
		defer cancel()
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, time.Time{}, errors.Join(&NotObtainedError{Name: h.name}, err)
	}
	token := h.tokenFor()
	// The goroutines of a Client that wait for one name take turns at
	// its group's turn (see handle.wait), and a Lock of its own token
	// makes its first attempt only when the Client has no other request
	// for the name under way: else it joins the group without one, and
	// tries when its turn comes.
	own := h.token == ""
	if own {
		if g, last := h.hub.joinOrTry(h.key); g != nil {
			h.busy(last) // what the Client last heard stands for a first attempt
			l, w, err := h.wait(ctx, turn{g: g, token: token})
			return l, w, time.Time{}, err
		}
	}
	fair := h.fairNow()
	mk := h.hub.mark(h.key)
	// A Client keeps one place per name in the store's queue, for the
	// waiter whose turn it is in its group (see handle.wait): a fair first try
	// joins the queue only when the Client has no waiter on the name yet.
	queue := !fair || own || !h.hub.waiting(h.key)
	l, res, sent, err := h.try(ctx, token, attemptKind{wait: queue, fair: fair, ride: true})
	var slow *NotObtainedError
	if errors.As(err, &slow) && slow.Slow > 0 && ctx.Err() == nil {
		// A first try that did not queue (the Client has a waiter on the
		// name already) was granted too late and gave the grant back: Lock
		// goes on waiting, as after any refusal.
		l, err, res = nil, nil, driver.AcquireResult{Fence: res.Fence}
	}
	var failed error
	switch {
	case err != nil && ctx.Err() == nil && transient(err):
		// The store failed in a way that may heal: the wait goes on, and
		// tries again after a pause (see waiter.failed).
		failed, res = err, driver.AcquireResult{}
	case err != nil || l != nil:
		if own {
			h.hub.tried(h.key, res, false)
			if l != nil && h.c.rides.holds(h.key, l) {
				// Let a Lock that waited for this attempt run now, so that
				// it parks for this lease's release (see rides) rather
				// than when this goroutine's work lets it.
				runtime.Gosched()
			}
		}
		return l, nil, sent, h.tryErr(ctx, err)
	default:
		h.busy(res)
	}
	t := turn{token: token, last: res, sent: sent, mk: mk, queuing: fair && queue, failed: failed}
	if own {
		t.g = h.hub.tried(h.key, res, true)
		t.holding = t.g != nil
	}
	l, w, err := h.wait(ctx, t)
	return l, w, sent, err
}

// turn is how a Lock comes to wait: after its first attempt (last, its
// answer, sent at sent; mk, what the Client knew of the key's releases
// before it; queuing, a fair request that may have queued; failed, its
// transient store error), or without one (zero sent: its Client had a
// request for the name under way). g is the group it joined already, if
// any, and holding says that it holds g's turn.
type turn struct {
	g       *waitGroup
	holding bool
	token   string
	last    driver.AcquireResult
	sent    time.Time
	mk      releaseMark
	queuing bool
	failed  error
}

// wait is Lock after its first attempt, or instead of it (see turn): when
// no release came since mk, the wait sleeps before it tries again; a Lock
// that made no attempt tries as soon as it holds the turn.
//
// The waiters of one Client on one key wait for the group's turn, in
// arrival order, and only the one whose turn it is deals with the store: it
// alone tries, is woken by releases, and, when it waits in the store's fair
// queue (a Fair Mutex, or a plain one whose wait starved), holds the
// Client's one place in that queue. However many goroutines wait, a Client
// costs the store one entry per name and one attempt per release, and each
// waiter costs its own goroutine only.
//
// A transient store error of the first attempt (failed), whose outcome is
// unknown, makes the wait try again after a pause, with a token of its own.
//
// It returns the waiter too, for the attempts it made (see observeLock).
func (h *handle) wait(ctx context.Context, t turn) (*Lease, *waiter, error) {
	// Close ends the wait, even in the middle of a store call.
	ctx, stop := h.c.closeAware(ctx)
	defer stop()
	g := t.g
	if g == nil {
		g = h.hub.join(h.key)
	}
	defer func() {
		if p := h.hub.leave(g); p != nil {
			h.withdrawPlace(p) // passed on to a waiter that left since
		}
	}()
	token, last := t.token, t.last
	if !t.sent.IsZero() {
		h.hub.heard(g, last)
	}
	w := &waiter{h: h, g: g, token: token, last: last, mk: t.mk, queuing: t.queuing, atOnce: t.sent.IsZero()}
	w.answered(last, t.sent, t.queuing)
	if t.failed != nil {
		w.failed(t.failed)
	}
	if last.Fence > 0 && h.token == "" {
		// The first try's grant came too late and was given back: that
		// release may still land later and must not cut a grant of the
		// wait, which goes on with a token of its own.
		w.token = newToken()
	}

	// A waiter that queued behind another for the turn tries at once when
	// its turn comes: what its first try saw (the holder's TTL) is old by
	// then.
	if !t.holding {
		select {
		case g.turn <- struct{}{}:
		default:
			w.atOnce = true
			if last.Queued {
				// The waiter whose turn it is keeps the Client's place; a queue
				// entry or writer intent of this one would stand for nobody
				// (and a queue entry that came to the head would hold the lock
				// up for everyone until it lapsed).
				h.abandon(token, last, h.hub.entryUsers(g, token) > 0)
				w.last.Queued = false
				w.queued = time.Time{}
				if h.token == "" {
					// The clean-up releases what the token may hold, perhaps
					// later, in the background: go on with a token of its own,
					// which that release cannot touch.
					w.token = newToken()
				}
			}
			select {
			case g.turn <- struct{}{}:
			case <-ctx.Done():
				return nil, w, w.notObtained(ctx)
			}
		}
	}
	var yield bool
	defer func() {
		<-g.turn
		if yield {
			// The next waiter has the turn: let it run now, so that it
			// parks for this lease's release (see rides) rather than when
			// this goroutine's work lets it.
			runtime.Gosched()
		}
	}()
	w.adopt(h.hub.takePlace(g))
	l, err := w.run(ctx)
	if l != nil {
		w.passPlace(l)
	}
	yield = l != nil && h.c.rides.holds(h.key, l)
	return l, w, err
}

// joinOrTry is the start of a Lock whose token is its own: when the Client
// waits on key, or another Lock makes its first attempt on it, the Lock
// joins key's group (returned, with the store's last answer to the group,
// zero when none came yet), to wait for the turn without a request of its
// own; otherwise it returns nil, and the Lock makes its first attempt, and
// then calls tried. A group made meanwhile holds its turn for that Lock,
// so that one request of the Client is under way at a time.
func (hub *waitHub) joinOrTry(key string) (*waitGroup, driver.AcquireResult) {
	hub.mu.Lock()
	defer hub.mu.Unlock()
	_, busy := hub.trying[key]
	if hub.groups[key] != nil || busy {
		g := hub.joinLocked(key)
		return g, g.last
	}
	if hub.trying == nil {
		hub.trying = make(map[string]struct{})
	}
	hub.trying[key] = struct{}{}
	return nil, driver.AcquireResult{}
}

// tried ends the first attempt that joinOrTry let a Lock make on key. A
// Lock that goes on waiting (wait, after the answer res) joins key's group
// and takes its turn (returned): the turn held for it when a group came
// meanwhile, else that of a group made now, so that a Lock that comes
// before the wait joins it rather than make a first attempt of its own. A
// Lock that does not wait lets a held turn go, and tried returns nil.
func (hub *waitHub) tried(key string, res driver.AcquireResult, wait bool) *waitGroup {
	hub.mu.Lock()
	defer hub.mu.Unlock()
	delete(hub.trying, key)
	g := hub.groups[key]
	switch {
	case g == nil && wait:
		g = hub.joinLocked(key) // trying is cleared: the turn is free
		g.turn <- struct{}{}
		g.last = res
		return g
	case g == nil || !g.reserved:
		return nil
	}
	g.reserved = false
	if !wait {
		<-g.turn
		return nil
	}
	g.last = res
	g.refs++
	return g
}

// heard records the store's answer res to a waiter of g, which the Locks
// that join g are told (see joinOrTry).
func (hub *waitHub) heard(g *waitGroup, res driver.AcquireResult) {
	hub.mu.Lock()
	g.last = res
	hub.mu.Unlock()
}
