// The handle behind Mutex, RWMutex and Semaphore: its set-up, TryLock, one
// attempt on the store, and what a failed or abandoned attempt leaves to
// clean up. Lock's first attempt is in lockturn.go.

package dlock

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// handle is one owner of one named lock: a Mutex, one side of an RWMutex,
// or a Semaphore. A reentrant handle (Reentrant) keeps one owner token for
// its life and may hold the lock several times; any other handle draws a
// new token for every Lock, so a second Lock on it waits like any other
// owner.
type handle struct {
	c       *Client // for the Client's services: calls in progress, clean-ups, owner strings
	backend driver.Backend
	hub     *waitHub
	name    string
	key     string
	opts    options
	err     error  // invalid name or options
	token   string // fixed token of a reentrant handle or of WithOwnerID; else ""
	mode    driver.Mode
	limit   int // a semaphore's permits; 0 otherwise

	// starve: a plain Mutex on a store with fair queues, or a plain
	// RWMutex or Semaphore on one that also reports shared requests that
	// overtook its queue (driver.CapOvertookShared) and hands the lock to
	// the queue (driver.CapHandoff: without it a queue lets readers in one
	// at a time, each asking in turn), whose waits join the queue when they
	// starve and whose requests respect a queue the Client has seen (see
	// starve.go).
	starve bool
	// handoff: the handle's queued requests let a release grant it the
	// lock directly (driver.CapHandoff; see lockwait.go): a handle whose
	// token is drawn per Lock call, without lock-delay, Fair (of every
	// kind) or a plain Mutex (its waits once they queue, with entries of
	// plainQueueTTL; see starve.go).
	handoff bool
	// keepPlace: a Fair exclusive handle with handoff on a store that
	// queues a successor for a Client that keeps its place
	// (driver.CapKeepPlace, driver.PlaceReleaser): its waiters ask for it
	// while other waiters of the Client wait behind them (see
	// waiter.passPlace).
	keepPlace bool
	// qttl is the time to live of the handle's queue entries and writer
	// intents (driver.AcquireRequest.QueueTTL); qrefresh, how often a
	// waiter in the queue keeps its entry (see plainQueueTTL).
	qttl, qrefresh time.Duration
	// claim: a plain Mutex whose token is drawn per Lock call, on a store
	// whose fair queue does not serve starving waiters (no starve) but
	// that takes claims (driver.CapClaim): its waits claim the next grant
	// when they starve (see starve.go).
	claim bool

	mu   sync.Mutex
	held *grant // a reentrant handle's current grant
	// uncertain: an acquire with the handle's fixed token failed with an
	// unknown outcome while the handle held nothing, so the store may count
	// a hold that no lease stands for. The handle's next grant inherits it
	// and drains such holds at its last Unlock. Guarded by mu.
	uncertain bool
	// drains: a reentrant handle without an owner ID, whose last Unlock
	// may drain holds of its token (see grant.release): its acquires and
	// its Unlocks pass reentry.
	drains  bool
	reentry reentryLock
	typ     string // the lock type, for observers (Event.Type)
}

// init sets h up as kind's handle on name: the Client's defaults, then
// opts. mode and limit are the kind's (Exclusive and 0 for a Mutex and a
// writer). Errors are kept in h.err, for its methods to return.
func (h *handle) init(c *Client, kind, name string, mode driver.Mode, limit int, opts []Option) {
	h.name, h.mode, h.limit = name, mode, limit
	if c == nil {
		h.err = invalid("client: nil")
		return
	}
	h.c, h.backend, h.hub, h.opts = c, c.backend, c.hub, c.opts
	var given options // the options given to this handle, to check their scope
	for _, o := range opts {
		if o != nil {
			o.apply(&h.opts)
			o.apply(&given)
		}
	}
	h.key = h.opts.keyPrefix + name
	h.err = checkScope(kind, &c.opts, &given, &h.opts)
	if h.err == nil {
		h.err = h.opts.validate(name)
	}
	if h.err == nil && c.backend != nil {
		h.err = c.checkBackend(&h.opts)
	}
	if h.err == nil && c.backend != nil && mode == driver.Shared {
		if limit > 0 {
			h.err = c.need(driver.CapSemaphore)
		} else {
			h.err = c.need(driver.CapShared)
		}
	}
	if h.err == nil && c.backend != nil && kind != "Mutex" && h.opts.fair {
		// An RWMutex's writer side too: a fair RWMutex queues its readers.
		h.err = c.needFor("Fair with "+kind, driver.CapFairShared)
	}
	if h.opts.ownerID != "" {
		h.token = h.opts.ownerID
	} else if h.opts.reentrant {
		h.token = newToken()
	}
	// A handle whose token outlives a wait (reentrant, owner ID) cannot
	// leave a queue at once when the wait ends, so it never joins one
	// unasked; where releases are not announced, or grants do not say that
	// they overtook a queue, the owners that overtake it would not learn of
	// it; and where a fair acquire costs several statements (SQL), queueing
	// would halve a hot lock's throughput.
	h.starve = h.err == nil && c.backend != nil && !h.opts.fair && h.token == "" &&
		c.need(driver.CapFair) == nil && c.need(driver.CapOvertook) == nil && h.hub.notifier != nil &&
		(kind == "Mutex" || c.need(driver.CapFairShared) == nil && c.need(driver.CapOvertookShared) == nil &&
			c.need(driver.CapHandoff) == nil)
	h.typ = typeOf(kind, mode == driver.Shared)
	h.drains = h.opts.reentrant && h.opts.ownerID == ""
	h.handoff = h.err == nil && c.backend != nil && (h.opts.fair || h.starve) && h.token == "" &&
		h.opts.lockDelay == 0 && c.need(driver.CapHandoff) == nil
	// A place nobody takes must go with its successor (driver.PlaceReleaser),
	// and the wait cleans up after an attempt whose outcome is unknown
	// itself, as it does where writer intents move (waiter.keeps): a
	// backend, or a wrapper of one, without both keeps no place.
	_, placeReleaser := c.backend.(driver.PlaceReleaser)
	_, intentMover := c.backend.(driver.IntentMover)
	h.keepPlace = h.handoff && h.opts.fair && h.mode == driver.Exclusive && placeReleaser && intentMover &&
		c.need(driver.CapKeepPlace) == nil
	h.qttl = h.opts.queueTTL()
	h.qrefresh = h.qttl / 3
	if h.handoff && h.starve {
		if q, refresh, ok := h.plainQueueTTL(); ok {
			h.qttl, h.qrefresh = q, refresh
		} else {
			h.handoff = false
		}
	}
	h.claim = h.err == nil && kind == "Mutex" && c.backend != nil && !h.opts.fair && h.token == "" &&
		!h.starve && c.need(driver.CapClaim) == nil
}

// tryLock is TryLock of every kind.
func (h *handle) tryLock(ctx context.Context) (*Lease, error) {
	if h.c == nil || h.c.obs == nil {
		l, _, err := h.tryOnce(ctx)
		return l, err
	}
	start, octx := h.c.obs.started(ctx, h, true)
	l, sent, err := h.tryOnce(ctx)
	h.c.obs.lockEnded(octx, h, true, h.c.obs.startOf(start, sent), l, 1, false, err)
	return l, err
}

// tryOnce is tryLock, unobserved; sent is when its request was sent (zero
// when none was).
func (h *handle) tryOnce(ctx context.Context) (*Lease, time.Time, error) {
	if err := h.enter(); err != nil {
		return nil, time.Time{}, err
	}
	defer h.c.exit()
	if err := ctx.Err(); err != nil {
		return nil, time.Time{}, errors.Join(&NotObtainedError{Name: h.name}, err)
	}
	l, res, sent, err := h.try(ctx, h.tokenFor(), attemptKind{fair: h.opts.fair})
	if err != nil || l != nil {
		return l, sent, h.tryErr(ctx, err)
	}
	return nil, sent, h.notObtained(res)
}

func (h *handle) enter() error {
	if h.err != nil {
		return h.err
	}
	if h.c == nil {
		return invalid("mutex: not made by a Client")
	}
	return h.c.enter()
}

// tokenFor returns the owner token for one Lock call.
func (h *handle) tokenFor() string {
	if h.token != "" {
		return h.token
	}
	return newToken()
}

// tryErr turns an acquire error into Lock's error: a wait ended by ctx is
// "not obtained".
func (h *handle) tryErr(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return errors.Join(&NotObtainedError{Name: h.name}, context.Cause(ctx))
	}
	return err
}

// busy reports a failed attempt to the WithOnBusy function.
func (h *handle) busy(res driver.AcquireResult) {
	if h.opts.onBusy != nil {
		h.opts.onBusy(h.notObtained(res))
	}
}

func (h *handle) notObtained(res driver.AcquireResult) *NotObtainedError {
	return &NotObtainedError{
		Name: h.name, Holder: res.Holder, HolderTTL: res.HolderTTL,
		Shared: res.Shared, Permits: h.limit, WriterWaiting: res.WriterWaiting, Position: res.Position,
	}
}

// attemptKind says how try sends its request.
type attemptKind struct {
	// wait tells the store that the caller waits (it may queue the token or
	// record a writer intent); fair that the request respects the name's
	// queue (and, with wait, joins it); claim (with wait, for a handle with
	// claim) that a starving plain waiter claims the next grant (see
	// starve.go); place (with wait and fair, for a handle with keepPlace)
	// that the Client keeps its place in the queue for its next waiter
	// (see waiter.passPlace).
	wait, fair, claim, place bool
	// keep: the caller passes its writer intent on (see handle.handOver),
	// and does the clean-ups itself (see try).
	keep bool
	// ride: a waiting attempt made while the Client holds the key waits
	// for the Client's release of the key to carry it (see rides).
	ride bool
}

// try makes one acquire attempt with token, as k says. It returns a lease
// when the lock was obtained, the store's answer when it was not, or an
// error when the store failed; then what the attempt may have written is
// removed. A refusal
// that is a conflict of kinds (driver.AcquireResult.Conflict) is returned
// as a *ConflictError. sent is when the request went out. A grant that came
// too late to be used is given back and, for a waiting caller, answered as
// a refusal that carries the grant's Fence (refusals carry none). With
// k.keep, neither a transient error's clean-up nor a late grant's
// give-back is done here: the caller does them.
func (h *handle) try(ctx context.Context, token string, k attemptKind) (_ *Lease, _ driver.AcquireResult, sent time.Time, _ error) {
	wait, fair, keep := k.wait, k.fair, k.keep
	if h.drains {
		// From the look for a grant to join to the lease made: see
		// reentryLock.
		if err := h.reentry.enter(ctx, h.c.closingCtx.Done(), false); err != nil {
			return nil, driver.AcquireResult{}, time.Now(), err
		}
		defer h.reentry.exit(false)
	}
	var joined *grant
	if h.opts.reentrant {
		h.mu.Lock()
		if h.held != nil && h.held.live() {
			joined = h.held
		}
		h.mu.Unlock()
	}
	req := driver.AcquireRequest{
		Key:       h.key,
		Token:     token,
		TTL:       h.opts.ttl,
		Reentrant: h.opts.reentrant,
		LockDelay: h.opts.lockDelay,
		Mode:      h.mode,
		Limit:     h.limit,
		Fair:      fair,
		Wait:      wait,
	}
	if wait {
		req.QueueTTL = h.qttl
		req.Handoff = fair && h.handoff
		req.KeepPlace = req.Handoff && k.place && h.keepPlace
		if k.claim && !fair && h.claim {
			// The claim lives claimTTL; a writer intent the request records
			// or keeps (readers keep the lock) lives the handle's qttl, so
			// that a slow statement does not let new readers past it.
			req.Claim = true
			req.ClaimTTL = min(req.QueueTTL, claimTTL)
		}
	}
	sent = time.Now()
	if joined != nil {
		req.Owner = joined.ownerNow()
		req.Joining = joined.fence
		// Re-entry is one round trip that never waits. Its outcome must be
		// known, or the hold count could be left wrong, so it is not cut
		// short by ctx, only bounded by the TTL.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), h.opts.ttl)
		defer cancel()
	} else {
		req.Owner = h.c.owner(sent, h.opts.metadata)
	}
	// A handle that drains holds its reentry lock here, which its own
	// Unlock needs: it never parks (see rides).
	res, sent, rd, err := h.send(ctx, req, sent, k.ride && joined == nil && !h.drains)
	if rd != nil {
		defer close(rd.ack) // the lease, if any, is made by then
	}
	took := time.Duration(-1) // not measured yet
	if h.c.obs != nil {
		// Read before the observer runs, so that the check below of a
		// grant that came too late counts no time of the observer's; the
		// call is reported once that is decided.
		took = time.Since(sent)
		defer h.c.obs.acquired(h.name, took, err)
	}
	if err != nil {
		if !keep && !rideDropped(err) {
			h.unknownOutcome(token, joined, wait)
		}
		return nil, res, sent, wrapStore("acquire", h.name, err)
	}
	if !res.Acquired {
		if res.QueueLive && h.starve {
			h.hub.noteQueue(h.key)
		}
		if res.Conflict && h.mode == driver.Shared {
			return nil, res, sent, &ConflictError{
				Name: h.name, Permits: h.limit, HeldPermits: res.HeldLimit, Holder: res.Holder, Shared: res.Shared,
			}
		}
		return nil, res, sent, nil
	}
	if res.Overtook && h.starve {
		h.hub.noteQueue(h.key)
	}
	if joined == nil || res.Fence != joined.fence {
		// A new grant is trusted until sent + validity − margin. An answer
		// that comes later than that brings a lease that is already dead:
		// give it back rather than hand the caller a lock it must not use.
		// The release is made before returning, so that a wait that tries
		// again with the same token cannot have its next grant released.
		if took < 0 {
			took = time.Since(sent)
		}
		if took >= h.c.validFor(h.opts.ttl)-h.opts.safetyMargin() {
			if !keep {
				h.giveBack(ctx, token, res.Fence)
			}
			if wait {
				// Not obtained: the wait goes on. The fence tells it that
				// a handoff of this grant, if one is announced late, is over.
				return nil, driver.AcquireResult{Fence: res.Fence}, sent, nil
			}
			return nil, res, sent, &NotObtainedError{Name: h.name, Slow: took}
		}
	}
	l := h.grantLease(joined, token, req.Owner, res, sent)
	if h.c.obs != nil {
		// The answer's arrival (took was measured after the Acquire, as
		// the observer is set) stands for the grant's time (Event.Held,
		// Event.Wait): a clock read the observer need not make again.
		l.at = h.c.obs.at(sent.Add(took))
	}
	return l, res, sent, nil
}

// handedLease makes the lease for a grant that a release handed to token
// as the queue's head (driver.Handoff) with fence. The store made it after
// it answered the request sent at queued, the last one it answered with a
// queue entry, so it lives on the store at least until queued + QueueTTL
// (see driver.AcquireRequest.Handoff): the lease's deadline is that, less
// the drift allowance, and its first renewal gives it TTL (see
// handedRenewBy). It returns nil,
// and the waiter claims the grant with a request instead, when the
// handoff came after handedWindow, or when the lease would not be renewed
// (WithAutoRenew(false)) and should get the full TTL at once.
func (h *handle) handedLease(token string, fence uint64, queued time.Time) *Lease {
	valid := h.c.validFor(h.qttl)
	safe := valid - h.opts.safetyMargin()
	if !h.opts.autoRenew || time.Since(queued) > h.handedWindow(h.qttl) {
		return nil
	}
	g, l := newGrant(h.c, h, token, h.c.owner(queued, h.opts.metadata), fence, queued, false)
	g.handedOver(queued, valid, handedRenewBy(queued, safe, time.Now()))
	g.schedule()
	return l
}

// handedWindow is how long after a queued request sent at S a handoff can
// be taken from its announcement, for entries of qttl: while a quarter of
// the entry's time is left before the lease's safe deadline, S + qttl less
// the drift allowance and the safety margin (see handedLease).
func (h *handle) handedWindow(qttl time.Duration) time.Duration {
	return h.c.validFor(qttl) - h.opts.safetyMargin() - qttl/4
}

// grantLease makes the lease for a successful acquire sent at sent: a
// further lease on joined when the store joined the handle's grant, and
// otherwise a new grant.
func (h *handle) grantLease(joined *grant, token, owner string, res driver.AcquireResult, sent time.Time) *Lease {
	if joined != nil {
		l, lost := joined.rejoin(res.Fence, sent)
		if l != nil {
			return l
		}
		// Lost meanwhile, or the store made a fresh grant because the one
		// this handle held was gone (deleted, expired) without the client
		// noticing yet: start a grant of its own.
		h.c.logLoss(joined, lost, nil)
	}
	if h.token == "" {
		g, l := newGrant(h.c, h, token, owner, res.Fence, sent, false)
		h.holding(l, res)
		g.schedule()
		return l
	}
	// In one critical section, so that an unknown outcome of another
	// goroutine of the handle marks either the handle or this grant.
	h.mu.Lock()
	if h.opts.reentrant && h.held != nil && h.held.fence == res.Fence {
		// Another Lock of the handle, which also found no grant to join,
		// made the grant of this fence meanwhile: the store counts this
		// hold in it, so this lease joins it (two grants of one fence
		// would each count the other's holds as their own).
		if l, _ := h.held.rejoin(res.Fence, sent); l != nil {
			h.mu.Unlock()
			return l
		}
	}
	g, l := newGrant(h.c, h, token, owner, res.Fence, sent, h.uncertain)
	h.uncertain = false
	if h.opts.reentrant {
		h.held = g
	}
	h.mu.Unlock()
	h.holding(l, res)
	g.schedule()
	return l
}

// holding makes l, an exclusive grant answered res, the lease that the
// Client's waiters on the key park their attempts on (see rides), unless
// others wait in the store's queue: a grant that overtook a queue (or,
// in handedLease, one handed over by a release) says so. Then the
// waiters' attempts go out at once, as the queue's other entries did, and
// the release is not held up on the store by an attempt that would only
// join the queue (Redis answers the release's handoff notice only after
// every command of the pipeline has run).
func (h *handle) holding(l *Lease, res driver.AcquireResult) {
	if h.c.rides != nil && h.mode == driver.Exclusive && !res.Overtook {
		h.c.rides.hold(h.key, l) // until l ends (Lease.finish)
	}
}

// holdsOther reports whether the handle holds a live grant other than g
// (a nil handle holds none).
func (h *handle) holdsOther(g *grant) bool {
	if h == nil {
		return false
	}
	h.mu.Lock()
	other := h.held
	h.mu.Unlock()
	return other != nil && other != g && other.live()
}
