// The starvation policy: when a plain Mutex's waits join the store's fair
// queue, and what the Client remembers of a name's live queue.

package dlock

import (
	"time"

	"github.com/dlock-go/dlock/driver"
)

// Starvation. A plain Mutex lets a releasing owner take the lock straight
// back, which is fast, but under steady contention the owner that just
// released wins almost every race against waiters that must first hear of
// the release, and they starve. As in Go's sync.Mutex, a waiter that has
// waited starveAfter joins the store's fair queue; a release that leaves
// the lock to a queue's head announces it, and a grant that went before a
// queue says so (driver.AcquireResult.Overtook); every plain Mutex of a
// Client that heard or saw either within queueLiveFor queues too, the owner
// that just released included. The name is then served in arrival order
// until its queue is empty and the announcements stop. A plain RWMutex
// (its readers and writers) and a plain Semaphore do the same on a store
// that reports the shared requests that overtook the queue too
// (driver.CapOvertookShared), else a Client whose plain readers or permits
// went before the queue would never learn of it and the queued waiters
// would wait behind every such Client's requests, and whose releases hand
// the lock over (driver.CapHandoff), else queued readers would come in one
// at a time, each asking in turn.
//
// Where the store hands the lock to the queue's head itself
// (driver.CapHandoff), a plain waiter in the queue accepts that handoff as
// a Fair one does: the name is then served at one request per grant. A
// head that died after queueing would hold the lock up until its entry
// lapses (the handed grant lives on the entry), so a plain handle's
// entries live plainQueueTTL, shorter than a Fair one's: a plain head
// that dies costs the others at most that, less than a holder that dies
// (its TTL). A head that takes no handoff and does not come costs them
// promisedGrace: the lock stays free, and they take it without the queue.
//
// On a store whose fair queue costs too much to serve a hot lock (SQL:
// several statements per grant, and waiters woken by polling) the waiters
// do not queue; a plain waiter that has waited starveAfter
// (claimAfterPolled where it is not woken by releases) claims the next
// grant instead (driver.AcquireRequest.Claim): one claim per name, kept on
// the lock's own row, which the plain acquire of every other owner
// respects, the releasing owner's included. The claimer polls at
// claimPoll while its claim is live and the lock held (a store with
// notifications wakes it at the release), and the other starving waiters
// at the retry schedule's first pace, to claim next. Nothing is claimed
// while nobody starves, so an uncontended lock, or one whose waiters are
// served in time, is taken as fast as before; a claimer that dies keeps
// the lock free for claimTTL at most.
const (
	starveAfter  = time.Millisecond
	queueLiveFor = time.Second
	// A plain waiter in the queue that finds the lock free but promised to
	// another head for promisedGrace takes it without the queue (see
	// waiter.queueDelay), trying every promisedRetry meanwhile.
	promisedGrace = 100 * time.Millisecond
	promisedRetry = 20 * time.Millisecond
	// claimTTL is how long a claim lives after the request that made or
	// kept it; the claimer renews it at least every claimTTL/3.
	claimTTL = 500 * time.Millisecond
	// plainQueueFloor is the shortest time to live of a plain handle's
	// queue entries when they take handoffs (see plainQueueTTL).
	plainQueueFloor  = time.Second
	claimPoll        = time.Millisecond
	claimAfterPolled = 100 * time.Millisecond
	// A handed grant's first renewal goes out at least handedRenewBudget
	// before its safe deadline, and not before handedRenewAfter after the
	// handoff (see handedRenewBy).
	handedRenewAfter  = 50 * time.Millisecond
	handedRenewBudget = 1500 * time.Millisecond
)

// sawQueue records that a release of key named a queue's head. The caller
// holds h.mu.
func (hub *waitHub) sawQueue(key string) {
	now := time.Now()
	if hub.queueSeen == nil {
		hub.queueSeen = make(map[string]time.Time)
	}
	if len(hub.queueSeen) >= 1024 && now.Sub(hub.queueSwept) > queueLiveFor {
		hub.queueSwept = now
		for k, t := range hub.queueSeen {
			if now.Sub(t) > queueLiveFor {
				delete(hub.queueSeen, k)
			}
		}
	}
	hub.queueSeen[key] = now
	hub.queueSeenN.Store(int32(len(hub.queueSeen)))
}

// noteQueue records that key has a live queue, as an acquire that
// overtook it reported.
func (hub *waitHub) noteQueue(key string) {
	hub.mu.Lock()
	hub.sawQueue(key)
	hub.mu.Unlock()
}

// queueLive reports whether a release of key named a queue's head, or an
// acquire of key overtook one, within queueLiveFor.
func (hub *waitHub) queueLive(key string) bool {
	if hub.queueSeenN.Load() == 0 {
		return false
	}
	hub.mu.Lock()
	defer hub.mu.Unlock()
	t, ok := hub.queueSeen[key]
	if ok && time.Since(t) > queueLiveFor {
		delete(hub.queueSeen, key)
		hub.queueSeenN.Store(int32(len(hub.queueSeen)))
		ok = false
	}
	return ok
}

// fairNow reports whether the handle's next request should be a fair one:
// always for a Fair Mutex, and for a plain one while its name has a live
// queue.
func (h *handle) fairNow() bool {
	return h.opts.fair || (h.starve && h.hub.queueLive(h.key))
}

// starving reports whether a plain waiter of h that started at start, and
// was last refused with last, should join the queue. A writer that waits
// for readers keeps its writer intent instead, which already holds new
// readers back; a reader or permit queues whatever refused it.
func (h *handle) starving(start time.Time, last driver.AcquireResult) bool {
	return h.starve && (h.mode == driver.Shared || last.Shared == 0) && !last.Queued &&
		(time.Since(start) >= starveAfter || h.hub.queueLive(h.key))
}

// claiming reports whether the plain waiter w claims the next grant with
// its next request: once it has waited starveAfter where releases wake it,
// or claimAfterPolled where it polls (a claimed handoff then costs the
// claimer's polling pace, so the lock is left to the faster barging until
// a wait grows long).
func (w *waiter) claiming() bool {
	if !w.h.claim {
		return false
	}
	after := starveAfter
	if !w.h.hub.notified(w.g) {
		after = claimAfterPolled
	}
	return time.Since(w.start) >= after
}

// plainQueueTTL is the time to live of a plain handle's queue entries when
// its queued waits take direct handoffs, how often a waiter refreshes its
// entry, and whether they should take them at all.
//
// Entries live three times the safety margin (3 s with the default TTL),
// at least plainQueueFloor and at most a Fair handle's. Shorter entries
// would bound a dead head more tightly, but leave a handed lease, until its
// first renewal answers, too little time to ride out a slow store (with
// twice the margin, a single 700 ms round trip right after the handoff
// lost it). An announcement is of use for handedWindow after the head's
// last fair request, so the head refreshes its entry at four fifths of
// that window at most: a third of the entry (1 s) by default; the window
// is the shorter for margins above about 1.7 s (entries at their 5 s cap)
// or with a drift allowance. When the window is under a sixth of the
// entry's time (a safety margin near the TTL; with the default margin, a
// TTL above about 29 s), the handle's waits take no handoff (ok false) and
// keep a Fair handle's entries.
func (h *handle) plainQueueTTL() (ttl, refresh time.Duration, ok bool) {
	q := min(h.opts.queueTTL(), max(3*h.opts.safetyMargin(), plainQueueFloor))
	window := h.handedWindow(q)
	if window < q/6 {
		return 0, 0, false
	}
	return q, min(q/3, window*4/5), true
}

// handedRenewBy is when the first renewal of a grant handed over at now
// goes out, for a head whose last queued request went out at queued and
// whose lease is trusted until queued + safe: at half that time, as a
// requested grant's at a third of its TTL, but early enough to leave
// handedRenewBudget for the renewal's answer (a slow store, a retry: a
// plain Mutex's 3 s entries leave a handed lease 2 s, where a 700 ms round
// trip must not lose it), and not sooner than handedRenewAfter after the
// handoff (a short hold costs no renewal). With the defaults: 0.5 s after
// the head's last request for a plain Mutex, 2 s for a Fair one.
func handedRenewBy(queued time.Time, safe time.Duration, now time.Time) time.Time {
	by := queued.Add(safe - handedRenewBudget)
	if soon := now.Add(handedRenewAfter); by.Before(soon) {
		by = soon
	}
	if half := queued.Add(safe / 2); half.Before(by) {
		by = half
	}
	return by
}
