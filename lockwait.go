// Lock's wait: the loop a handle runs in its turn in its Client's waiter
// group (see lockturn.go), until it is granted or its context ends.

package dlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock/driver"
)

var (
	defaultNotifiedRetry = ExponentialBackoff(100*time.Millisecond, 2*time.Second)
	defaultPolledRetry   = ExponentialBackoff(5*time.Millisecond, 500*time.Millisecond)
)

// waiter is one wait for the turn of its group: plain (woken by any release
// of the key) until it joins the store's fair queue, fair (woken by a
// release that names its token) from then on.
type waiter struct {
	h      *handle
	g      *waitGroup
	token  string
	last   driver.AcquireResult // the store's last answer
	mk     releaseMark          // what the Client knew of releases before the last attempt
	atOnce bool                 // the next attempt goes out at once, whatever mk says
	// queuing: the first attempt was a fair request that may have queued
	// (a Fair Mutex, or a plain one while its name has a live queue).
	queuing bool

	queue *fairWaiter // non-nil while the waiter is in the store's fair queue
	// queued is when the last request went out, when it was a fair one
	// and the store answered it with a queue entry; zero after any other
	// answer (see answered, handedOver). A waiter that takes a place passed
	// on (adopt) takes its predecessor's.
	queued time.Time
	// seen is the highest fence counter an answer showed the waiter (the
	// Counter of refusals, the fence of a grant it gave back): a handoff
	// announced with a fence at or below it has ended.
	seen uint64
	// queuedEver: some answer to this wait said "queued" (see run).
	queuedEver bool
	start      time.Time // when the plain wait began, for starvation
	// promisedSince is when a plain waiter in the queue first found the
	// lock free but promised to another head (see queueDelay).
	promisedSince time.Time
	// paceHolder and pacePosition are the holder and place in the queue
	// the waiter last saw, since paceSince (see pollPace).
	paceHolder   string
	pacePosition int
	paceSince    time.Time
	// For observers: the attempts the wait sent, and whether a release
	// handed it the lock.
	attempts int
	handoff  bool
	// lastErr is the transient store error of the last attempt, nil after
	// an answer; errs counts such errors in a row.
	lastErr error
	errs    int
	// prior is an earlier token of the wait that still waits to be handed
	// over (see handPrior), or "".
	prior string
	// place: a request of token asked the store to keep the Client's place
	// (driver.AcquireRequest.KeepPlace), and may have been the last to set
	// its entry (an answered one that queued, or one whose outcome is
	// unknown; a copy that lands late may count), so that a release that
	// hands token the lock may queue token's successor; also set for a
	// place taken over (adopt). placeSent, what the latest attempt asked.
	// handedSucc: the handoff that granted the wait said that it did queue
	// the successor (see passPlace).
	place, placeSent, handedSucc bool
}

// run is the wait's loop: try when a release may have come, sleep until a
// wake-up, the holder's TTL or the retry schedule, and so on until granted
// or ctx ends. A plain waiter that starves joins the queue and goes on in
// the same loop, its schedule started afresh. A transient store error is
// tried again after a pause (transientDelay); any other ends the wait.
func (w *waiter) run(ctx context.Context) (*Lease, error) {
	h := w.h
	w.start = time.Now()
	if h.opts.fair || (w.queuing && w.last.Queued) {
		w.enqueue()
	} else if h.fairNow() {
		w.starved() // the name has a live queue: join it at once
	}
	defer w.dequeue()
	keep := w.keeps()
	defer func() {
		if w.prior != "" {
			h.c.cleanup(h.key, w.prior, h.opts.ttl)
		}
	}()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for attempt := 1; ; attempt++ {
		if l := w.handedOver(); l != nil {
			return l, nil
		}
		res := w.last
		// Never waited for: until the store confirms it, the waiter polls.
		pending := h.hub.subscribe(w.g)
		ready := w.tryNow(attempt, pending)
		if ready && w.prior != "" {
			w.handPrior(ctx, false) // the last try: the attempt goes out anyway
		}
		if ready {
			fair := w.fairNext()
			l, r, sent, err := w.attempt(ctx, fair, keep)
			if err != nil {
				// The request may have landed, and kept the Client's place.
				w.place = w.place || w.placeSent
			}
			if err != nil && keep && (ctx.Err() != nil || !transient(err)) && !rideDropped(err) {
				// try left it to the wait; a token that kept the Client's
				// place takes its successor with it.
				if w.place {
					h.c.settle(h.opts.ttl, h.c.placeRelease(h.key, w.token))
				} else {
					h.c.cleanup(h.key, w.token, h.opts.ttl)
				}
			}
			switch {
			case l != nil:
				return l, nil
			case err != nil && ctx.Err() != nil:
				return nil, w.notObtained(ctx) // names the holder last seen; try cleaned up
			case err != nil && !transient(err):
				if errors.As(err, new(*ConflictError)) {
					w.abandon() // answered: the wait's place is still there
				}
				return nil, err
			case err != nil:
				old := w.token
				w.failed(err)
				if keep {
					w.prior = old
					w.handPrior(ctx, true) // else before the next attempt
				}
			default:
				w.lastErr, w.errs = nil, 0
				res, w.last = r, r
				w.answered(r, sent, fair)
				if r.Queued && fair {
					w.place = w.place || w.placeSent
				}
				if r.Fence > 0 {
					// A grant that came too late, given back. Its release may
					// land later still: go on with a new token, at once.
					old := w.token
					w.retoken()
					if keep {
						ok, _ := h.handOver(ctx, old, w.token, r.Fence, false)
						w.moved(ok)
					}
					h.busy(r)
					continue
				}
				if w.queue != nil {
					h.hub.moved(w.queue, r.Position)
				}
				h.hub.heard(w.g, r)
				h.busy(r)
			}
		}
		var d time.Duration
		switch {
		case w.errs > 0:
			d = transientDelay(w.errs)
		case w.queue == nil && h.starving(w.start, w.last):
			w.starved()
			attempt = 0
			continue
		case w.queue != nil:
			d = w.queueDelay(attempt, res)
		default:
			d = w.plainDelay(attempt, res)
		}
		if pending {
			d = max(d, w.pendingGrace(ctx))
		}
		if !sleep(ctx, timer, d, w.wake()) {
			w.abandon()
			return nil, w.notObtained(ctx)
		}
		if w.errs == 0 && w.queue == nil && h.starving(w.start, w.last) {
			w.starved()
			attempt = 0
		}
	}
}

// pendingGrace is how long more a waiter whose subscription is pending
// sleeps before it polls: a store that confirms at once wakes it first (the
// confirmation wakes the group), so that a healthy store sees no polls
// from a crowd of new waiters; one that does not confirm costs the waiter
// at most pendingPoll, or an eighth of its wait, from the wait's start.
func (w *waiter) pendingGrace(ctx context.Context) time.Duration {
	grace := pendingPoll
	if dl, ok := ctx.Deadline(); ok {
		grace = min(grace, dl.Sub(w.start)/8)
	}
	return time.Until(w.start.Add(grace))
}

// pendingPoll bounds how long a waiter waits for its subscription's
// confirmation before it polls (see pendingGrace).
const pendingPoll = 200 * time.Millisecond

// failed records a transient store error of an attempt, whose outcome is
// unknown: the attempt cleaned up after itself (handle.unknownOutcome),
// and a token drawn for the wait is replaced, since that clean-up's release
// may land after the next grant. The clean-up takes the token's place in
// the store's queue with it: the next fair request queues again (with the
// token's successor, when the token kept the Client's place: see retoken),
// and the waiter keeps its place among the Client's waiters.
func (w *waiter) failed(err error) {
	w.lastErr = err
	w.errs++
	w.last = driver.AcquireResult{}
	w.queued = time.Time{}
	w.retoken()
}

// keeps reports whether the wait passes its writer intent on to each new
// token it draws (handle.handOver): an exclusive wait with a token of its
// own, on a backend that can move an intent (driver.IntentMover).
func (w *waiter) keeps() bool {
	_, ok := w.h.backend.(driver.IntentMover)
	return ok && w.h.token == "" && w.h.mode == driver.Exclusive
}

// handPrior hands the wait's prior token over to its token (see
// handle.handOver). With retry, a move that meets a transient error keeps
// the prior token (its intent keeps readers out meanwhile, and its
// clean-up waits) for one more try before the next attempt; that try hands
// it over whatever the move's outcome, so that a store whose moves keep
// failing costs the wait its intent, never its attempts.
func (w *waiter) handPrior(ctx context.Context, retry bool) {
	moved, err := w.h.handOver(ctx, w.prior, w.token, 0, retry)
	w.moved(moved)
	if err == nil {
		w.prior = ""
	}
}

// moved records that a hand-over may have given the wait's token a writer
// intent, which its clean-up must then remove when the wait ends.
func (w *waiter) moved(ok bool) {
	if ok {
		w.queuedEver = true
	}
}

// answered records an answer r to a request sent at sent, a fair one or
// not (see queued, seen). Only a fair request keeps the token's queue
// entry: a "queued" answer to another (a writer intent, as for the
// promisedGrace fallback's request with readers on the name) leaves a
// handed grant to lapse as the last fair request left it, so it does not
// count for handedOver, which then claims the grant with a request.
func (w *waiter) answered(r driver.AcquireResult, sent time.Time, fair bool) {
	w.seen = max(w.seen, r.Counter, r.Fence)
	w.queuedEver = w.queuedEver || r.Queued
	if r.Queued && fair {
		w.queued = sent
	} else {
		w.queued = time.Time{}
	}
}

// handedOver returns the lease of a grant that a release handed to the
// waiter (driver.Handoff), made without a request, or nil.
//
// The grant lives on the store until the head's entry would have expired:
// at least until queued + QueueTTL, when the request sent at queued was
// answered before the grant was made. That holds when every answer since
// showed a fence counter below the grant's fence (an answer after the
// grant would have been the grant, or, once it ended, a counter at or above
// its fence; see seen), and when no answer since was other than "queued"
// (a grant given back, a refusal without a place). Otherwise, or when the
// lease cannot be made that way (see handle.handedLease), the next attempt
// goes out at once and claims the grant if it is still there.
func (w *waiter) handedOver() *Lease {
	if w.queue == nil {
		return nil
	}
	fence, succ := w.h.hub.handedOff(w.g, w.token, w.queue)
	if fence == 0 || fence <= w.seen {
		return nil // none, or one that has ended
	}
	if !w.queued.IsZero() {
		if l := w.h.handedLease(w.token, fence, w.queued); l != nil {
			w.handoff, w.handedSucc = true, succ
			return l
		}
	}
	w.atOnce = true
	return nil
}

// tryNow reports whether attempt goes to the store at once: a first attempt
// only when a release may have come since the last one, or the waiter
// queued for the turn, or (in the queue) its last answer left it out. While
// the key's subscription is pending, a first attempt waits for its
// confirmation or the polled schedule, whichever comes first: an attempt
// before the confirmation would not cover the releases until it.
func (w *waiter) tryNow(attempt int, pending bool) bool {
	if attempt == 1 && w.errs > 0 && !w.atOnce {
		return false // the first try failed: pause first
	}
	return attempt > 1 || w.atOnce || (w.queue != nil && !w.last.Queued) ||
		(!pending && w.h.hub.released(w.h.key, w.mk) && !w.handsOffHeard())
}

// handsOffHeard reports whether the waiter sits in the queue with a direct
// handoff, its Client was subscribed to the key's releases all along since
// before its last attempt, and every release since was a handoff: each
// either handed it the lock, which it heard, or went to another, so it
// need not ask.
func (w *waiter) handsOffHeard() bool {
	return w.queue != nil && w.h.handoff && w.last.Queued && w.h.hub.onlyHandoffsSince(w.h.key, w.mk)
}

// attempt makes one attempt of the wait. The key's subscription is in
// place (see run), so no release after the attempt is missed; a wake-up
// seen before it is dropped, since the attempt covers it.
func (w *waiter) attempt(ctx context.Context, fair, keep bool) (*Lease, driver.AcquireResult, time.Time, error) {
	select {
	case <-w.wake():
	default:
	}
	w.attempts++
	w.placeSent = fair && w.h.keepPlace && w.h.hub.crowded(w.g)
	return w.h.try(ctx, w.token, attemptKind{wait: true, fair: fair, claim: w.queue == nil && w.claiming(),
		place: w.placeSent, keep: keep, ride: !w.last.Queued && w.prior == ""})
}

// fairNext reports whether the waiter's next request is a fair one: in the
// queue, unless it is a plain waiter that found the lock free but promised
// to another head for promisedGrace (see queueDelay).
func (w *waiter) fairNext() bool {
	return w.queue != nil &&
		!(w.h.starve && !w.promisedSince.IsZero() && time.Since(w.promisedSince) >= promisedGrace)
}

// wake is the channel that wakes the waiter: its group's while plain, its
// own in the queue.
func (w *waiter) wake() chan struct{} {
	if w.queue != nil {
		return w.queue.wake
	}
	return w.g.wake
}

// retoken gives the wait a new owner token, when the handle draws one per
// Lock call (a fixed token must stay), and moves its place among the
// group's fair waiters to it.
func (w *waiter) retoken() {
	if w.h.token != "" {
		return
	}
	old := w.token
	if w.place {
		// The old token's successor may hold the Client's place already
		// (a release handed old the lock, perhaps unheard): the wait takes
		// it, and its next request keeps the place or makes one.
		w.token = driver.Successor(old)
	} else {
		w.token = newToken()
	}
	w.queuedEver = w.place // a random new token has had no place yet
	if w.queue != nil {
		w.h.hub.dequeue(w.g, old, w.queue)
		w.queue = w.h.hub.enqueue(w.g, w.token, 0)
	}
}

// starved moves a plain waiter into the queue: its next attempt is a fair
// one, at once, that queues it.
func (w *waiter) starved() {
	w.mk, w.atOnce = releaseMark{}, true
	w.enqueue()
}

// enqueue registers the waiter in its group's fair waiters, woken by a
// release that names its token.
func (w *waiter) enqueue() {
	w.queue = w.h.hub.enqueue(w.g, w.token, w.last.Position)
}

// dequeue undoes enqueue when the wait ends.
func (w *waiter) dequeue() {
	if w.queue != nil {
		w.h.hub.dequeue(w.g, w.token, w.queue)
	}
}

// plainDelay is how long a plain waiter sleeps after attempt, whose answer
// was res. Releases wake a subscribed waiter, so it polls only as a safety
// net; one that is not (no notifications, or they failed) polls in
// earnest.
func (w *waiter) plainDelay(attempt int, res driver.AcquireResult) time.Duration {
	h := w.h
	retry := h.opts.retry
	if retry == nil {
		retry = defaultPolledRetry
		if h.hub.notified(w.g) {
			retry = defaultNotifiedRetry
		}
	}
	d := max(retry.Delay(attempt), time.Millisecond)
	if res.HolderTTL > 0 && res.HolderTTL < d {
		d = res.HolderTTL + time.Millisecond
	}
	if res.Queued {
		// A writer intent is kept only by trying again before it lapses.
		d = min(d, h.qttl/3)
	}
	if w.claiming() {
		d = w.claimDelay(d, res)
	}
	return d
}

// claimDelay is plainDelay's d for a starving plain waiter that claims
// (see starve.go), after an answer res. With its claim live it tries again
// before the claim lapses, and, where releases are not announced, every
// claimPoll: the lock is its own the moment the holder lets go, and waits
// for it meanwhile. Refused by another's claim, it tries again at the
// retry schedule's first pace, to claim next.
func (w *waiter) claimDelay(d time.Duration, res driver.AcquireResult) time.Duration {
	h := w.h
	notified := h.hub.notified(w.g)
	switch {
	case res.Queued:
		d = min(d, claimTTL/3)
		if !notified && h.opts.retry == nil {
			d = min(d, claimPoll)
		}
	case !notified && h.opts.retry == nil:
		d = min(d, max(defaultPolledRetry.Delay(1), time.Millisecond))
	}
	return d
}

// queueDelay is how long a waiter in the queue sleeps after attempt, whose
// answer was res. It keeps the Client's queue entry alive by trying again
// every third of its time to live, and is woken by a release that names its
// token, by the holder's TTL running out, and, on stores without
// notification, by polling on the WithRetry schedule.
func (w *waiter) queueDelay(attempt int, res driver.AcquireResult) time.Duration {
	h := w.h
	retry := h.opts.retry
	if retry == nil {
		retry = defaultPolledRetry
	}
	d := h.qrefresh
	if !w.queued.IsZero() {
		// The entry lives QueueTTL from queued, and is kept in time
		// whatever the wait did since: a place taken over from another
		// waiter (adopt) is as old as that waiter's last request.
		d = min(d, max(time.Until(w.queued.Add(h.qrefresh)), 0))
	}
	notified := h.hub.notified(w.g)
	if !notified || h.opts.retry != nil {
		d = min(d, max(retry.Delay(attempt), time.Millisecond))
	}
	if !notified && h.opts.retry == nil && res.Position > 0 {
		// Polling: only the head can be let in, and every poll of the
		// waiters further back is in vain until it is their turn. The head
		// polls at pollPace, and so does the waiter behind it: the head's
		// grant makes it the head, and a short hold leaves it the lock
		// before a slower poll would learn that. The others poll at the
		// schedule's first pace, the slower the further back they are.
		pace := time.Duration(res.Position) * max(retry.Delay(1), time.Millisecond)
		if res.Position <= 2 {
			pace = w.pollPace(time.Now(), res, retry.Delay(1))
		}
		d = min(d, pace)
	}
	// A plain Mutex that queued because it starved does not wait on a head
	// that does not come: a waiter that died keeps its entry until the
	// entry lapses (up to 5s). A release leaves the lock free but promised
	// to such a head when the head takes no handoff (one that does holds
	// the handed grant until its entry lapses; see starve.go). While that
	// lasts, a plain waiter tries again every promisedRetry, and after
	// promisedGrace it takes the lock without the queue, as a plain Mutex
	// may (see attempt).
	switch {
	case !h.starve:
	case res.Holder == "" && res.HolderTTL == 0 && (res.Shared == 0 || h.mode == driver.Shared):
		// Free but promised to the head: for a reader or permit, whatever
		// shared holds are in. (A queued writer that waits for them to go
		// is named by the refusal, as its intent's holder.)
		if w.promisedSince.IsZero() {
			w.promisedSince = time.Now()
		}
		d = min(d, promisedRetry)
	default:
		w.promisedSince = time.Time{}
	}
	if res.HolderTTL > 0 {
		// Not only the head: when the head left the queue while the lock
		// was held, nobody is told who is head now, and a holder that
		// expires is announced by no release.
		d = min(d, res.HolderTTL+time.Millisecond)
	}
	return d
}

// pollPace is how often the head of a queue polls the store when releases
// are not announced: every claimPoll while the queue moves, slowing as the
// time since the waiter last saw the holder or its own place change grows
// (an eighth of it), to first, the retry schedule's first pace. A quick
// succession of short holds is followed closely, as a plain Mutex's claimer
// follows them (see claimDelay); a long hold costs what it did.
func (w *waiter) pollPace(now time.Time, res driver.AcquireResult, first time.Duration) time.Duration {
	if w.paceSince.IsZero() || res.Holder != w.paceHolder || res.Position != w.pacePosition {
		w.paceHolder, w.pacePosition, w.paceSince = res.Holder, res.Position, now
	}
	return min(max(now.Sub(w.paceSince)/8, claimPoll), max(first, time.Millisecond))
}

// notObtained is the error of a wait that ended: the holder last seen,
// and why it ended.
func (w *waiter) notObtained(ctx context.Context) error {
	if w.lastErr != nil {
		return errors.Join(w.h.notObtained(w.last), context.Cause(ctx),
			fmt.Errorf("the store failed at the last attempt: %w", storeCause(w.lastErr)))
	}
	return errors.Join(w.h.notObtained(w.last), context.Cause(ctx))
}

// sleep waits for d, a wake-up or the end of ctx; it reports false when ctx
// ended. timer is stopped and drained when it returns.
func sleep(ctx context.Context, timer *time.Timer, d time.Duration, wake chan struct{}) bool {
	timer.Reset(d)
	ok := true
	select {
	case <-wake:
	case <-timer.C:
	case <-ctx.Done():
		ok = false
	}
	if !timer.Stop() {
		select {
		case <-timer.C:
		default:
		}
	}
	return ok
}

// passPlace passes the Client's place in the store's queue on to the next
// waiter of the group to take the turn (adopt), when the release that
// granted l to the waiter queued its token's successor, or may have: the
// handoff that granted it said it did, or the grant came from a request
// and a request of the token asked for it (place). A place that no
// waiter takes is withdrawn (see handle.wait).
func (w *waiter) passPlace(l *Lease) {
	if w.handoff && !w.handedSucc || !w.handoff && !w.place {
		return // none was queued, or none can have been
	}
	h := w.h
	p := &queuePlace{token: driver.Successor(w.token), marked: w.handoff, queued: w.queued,
		qttl: h.qttl, metadata: h.opts.metadata, fence: l.Fence(), mk: h.hub.mark(h.key)}
	h.hub.passPlace(w.g, p)
}

// adopt makes the waiter, as it takes its group's turn, wait in the queue
// place p that its predecessor passed on (passPlace), with p's token and
// no request: the entry is there when the handoff's announcement said so
// (marked), and then the waiter waits as one whose request queued at
// p.queued, for the release that hands it the lock. Otherwise its first
// attempt goes out at once with p's token, which keeps the place if it is
// there and makes one if not. A waiter of another kind (a handle without
// KeepPlace, or with another QueueTTL or metadata, which the entry's owner
// and expiry would not match) does not take the place: it is withdrawn.
func (w *waiter) adopt(p *queuePlace) {
	if p == nil {
		return
	}
	h := w.h
	if !h.keepPlace || h.qttl != p.qttl || h.opts.metadata != p.metadata {
		h.withdrawPlace(p)
		return
	}
	w.token, w.place, w.queuedEver = p.token, true, true
	w.seen = max(w.seen, p.fence)
	w.atOnce = true
	if p.marked && !p.queued.IsZero() {
		w.last = driver.AcquireResult{Queued: true}
		w.queued, w.mk, w.atOnce = p.queued, p.mk, false
	}
}
