package dlock

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// waitHub coordinates a Client's waiters. Waiters on one key form a group;
// only the group's active waiter (the one that holds its gate) queries the
// store, so a release costs one attempt per Client and key, not one per
// goroutine. The hub owns the Client's one notification stream and routes
// each release to the group of its key.
type waitHub struct {
	c        *Client
	notifier driver.Notifier // nil when the backend has none

	mu      sync.Mutex
	groups  map[string]*waitGroup
	groupsN atomic.Int32 // len(groups), read without mu by waiting
	// subs counts, per key, the subscriptions the listener has confirmed
	// and not yet been asked to drop, and the releases heard for the key
	// meanwhile; epoch counts the moments releases may have been missed.
	// See mark.
	subs  map[string]*keySub
	subsN atomic.Int32 // len(subs), read without mu by mark
	epoch uint64
	// queueSeen is when a release of each key last named the head of a
	// live fair queue (see queueLive); queueSeenN is its length, read
	// without mu so that a Lock on a Client that never saw a queue takes no
	// lock for it.
	queueSeen  map[string]time.Time
	queueSeenN atomic.Int32
	queueSwept time.Time // last sweep of queueSeen, at most one per queueLiveFor

	// refused: the store refused a subscription for lack of rights
	// (driver.ErrNotifyRefused); waiters no longer subscribe, and poll.
	refused atomic.Bool

	lmu       sync.Mutex // serialises opening the listener
	listener  driver.Listener
	closed    bool
	lingering map[string]*linger // a key's one lingering subscription, guarded by lmu
	lingerWG  sync.WaitGroup     // lingering subscriptions' timers scheduled or running
	failedAt  time.Time          // last failed Listen, to retry at most once a second
}

// keySub is a key whose releases the Client hears.
type keySub struct {
	refs int    // subscriptions confirmed and not dropped
	seq  uint64 // releases heard
}

// releaseMark is what the Client knew of a key's releases at one moment.
type releaseMark struct {
	sub        *keySub // nil when the key was not subscribed
	seq, epoch uint64
}

// mark returns what the Client knows of key's releases now. Taken before
// an attempt, it tells a wait that follows whether a release may have come
// after the attempt (see released).
func (h *waitHub) mark(key string) releaseMark {
	if h.notifier == nil || h.subsN.Load() == 0 {
		return releaseMark{}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.subs[key]
	if s == nil {
		return releaseMark{}
	}
	return releaseMark{sub: s, seq: s.seq, epoch: h.epoch}
}

// released reports whether key may have been released since mk was taken:
// when there was no subscription then, there has been a moment without one
// since, or a release or a gap in the stream was heard since. When it
// reports false, the key was subscribed all along and no release came, so
// the next release will be heard: a wait may sleep before trying again.
func (h *waitHub) released(key string, mk releaseMark) bool {
	if mk.sub == nil {
		return true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.subs[key] != mk.sub || mk.sub.seq != mk.seq || h.epoch != mk.epoch
}

// subscribed counts a confirmed subscription of key; dropping undoes it.
func (h *waitHub) subscribed(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.subs == nil {
		h.subs = make(map[string]*keySub)
	}
	s := h.subs[key]
	if s == nil {
		s = &keySub{}
		h.subs[key] = s
		h.subsN.Store(int32(len(h.subs)))
	}
	s.refs++
}

// dropping uncounts a subscription of key before the listener drops it, so
// that the hub never counts one that the store no longer has.
func (h *waitHub) dropping(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s := h.subs[key]; s != nil {
		if s.refs--; s.refs <= 0 {
			delete(h.subs, key)
			h.subsN.Store(int32(len(h.subs)))
		}
	}
}

type waitGroup struct {
	key  string
	refs int           // waiters in the group, guarded by waitHub.mu
	gate chan struct{} // capacity 1: held by the active waiter
	wake chan struct{} // capacity 1: a release of key was seen
	// fair waiters by token, guarded by waitHub.mu. They do not queue at the
	// gate: the store's queue orders them, and a release wakes only the
	// waiter it names.
	fair map[string][]*fairWaiter

	smu        sync.Mutex // serialises subscribing
	subscribed bool       // guarded by smu; read by the last to leave
}

// fairWaiter is one waiter of a fair Mutex.
type fairWaiter struct {
	wake     chan struct{} // capacity 1
	position int           // its place in the store's queue at its last attempt, guarded by waitHub.mu
}

func newWaitHub(c *Client) *waitHub {
	h := &waitHub{c: c, groups: make(map[string]*waitGroup)}
	h.notifier, _ = c.backend.(driver.Notifier)
	return h
}

// notify is the listener's callback: wake the active waiter of key, or of
// every key when key is "". next, when set, is the fair waiter the store
// lets in: only that one is woken.
func (h *waitHub) notify(key, next string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if key == "" {
		h.epoch++
	} else if ks := h.subs[key]; ks != nil {
		ks.seq++
	}
	if key == "" {
		for _, g := range h.groups {
			g.wakeAll()
		}
		return
	}
	if next != "" {
		h.sawQueue(key)
	}
	g := h.groups[key]
	switch {
	case g == nil:
	case next == "":
		g.wakeAll()
	default:
		for _, w := range g.fair[next] {
			signal(w.wake)
		}
		// The name has a queue now: a plain waiter joins it (see wait).
		signal(g.wake)
	}
}

// Starvation. A plain Mutex lets a releasing owner take the lock straight
// back, which is fast, but under steady contention the owner that just
// released wins almost every race against waiters that must first hear of
// the release, and they starve. As in Go's sync.Mutex, a waiter that has
// waited starveAfter joins the store's fair queue; a release that leaves
// the lock to a queue's head announces it, and a grant that went before a
// queue says so (driver.AcquireResult.Overtook); every plain Mutex of a
// Client that heard or saw either within queueLiveFor queues too, the owner
// that just released included. The name is then served in arrival order
// until its queue is empty and the announcements stop.
const (
	starveAfter  = time.Millisecond
	queueLiveFor = time.Second
	// A plain waiter in the queue that finds the lock free but promised to
	// another head for promisedGrace takes it without the queue (see
	// waitFair), trying every promisedRetry meanwhile.
	promisedGrace = 100 * time.Millisecond
	promisedRetry = 20 * time.Millisecond
)

// sawQueue records that a release of key named a queue's head. The caller
// holds h.mu.
func (h *waitHub) sawQueue(key string) {
	now := time.Now()
	if h.queueSeen == nil {
		h.queueSeen = make(map[string]time.Time)
	}
	if len(h.queueSeen) >= 1024 && now.Sub(h.queueSwept) > queueLiveFor {
		h.queueSwept = now
		for k, t := range h.queueSeen {
			if now.Sub(t) > queueLiveFor {
				delete(h.queueSeen, k)
			}
		}
	}
	h.queueSeen[key] = now
	h.queueSeenN.Store(int32(len(h.queueSeen)))
}

// noteQueue records that key has a live queue, as an acquire that
// overtook it reported.
func (h *waitHub) noteQueue(key string) {
	h.mu.Lock()
	h.sawQueue(key)
	h.mu.Unlock()
}

// queueLive reports whether a release of key named a queue's head, or an
// acquire of key overtook one, within queueLiveFor.
func (h *waitHub) queueLive(key string) bool {
	if h.queueSeenN.Load() == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	t, ok := h.queueSeen[key]
	if ok && time.Since(t) > queueLiveFor {
		delete(h.queueSeen, key)
		h.queueSeenN.Store(int32(len(h.queueSeen)))
		ok = false
	}
	return ok
}

// starving reports whether a plain waiter that started at start, and was
// last refused with last, should join the queue. A writer that waits for
// readers keeps its writer intent instead, which already holds new readers
// back.
func (h *waitHub) starving(m *Mutex, start time.Time, last driver.AcquireResult) bool {
	return m.starve && last.Shared == 0 && !last.Queued &&
		(time.Since(start) >= starveAfter || h.queueLive(m.key))
}

// wakeAll wakes the active waiter and every fair waiter. The caller holds
// waitHub.mu.
func (g *waitGroup) wakeAll() {
	signal(g.wake)
	for _, ws := range g.fair {
		for _, w := range ws {
			signal(w.wake)
		}
	}
}

// wakeKey wakes local waiters of key at once when this Client released it,
// without waiting for the store's notification: the active waiter, and of
// fair waiters only the one that was at the head of the queue.
func (h *waitHub) wakeKey(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ks := h.subs[key]; ks != nil {
		ks.seq++ // a release by this Client counts as heard (see released)
	}
	g := h.groups[key]
	if g == nil {
		return
	}
	signal(g.wake)
	for _, ws := range g.fair {
		for _, w := range ws {
			if w.position == 1 {
				signal(w.wake)
			}
		}
	}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// waiting reports whether the Client has waiters on key.
func (h *waitHub) waiting(key string) bool {
	if h.groupsN.Load() == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.groups[key] != nil
}

func (h *waitHub) join(key string) *waitGroup {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := h.groups[key]
	if g == nil {
		g = &waitGroup{key: key, gate: make(chan struct{}, 1), wake: make(chan struct{}, 1)}
		h.groups[key] = g
		h.groupsN.Store(int32(len(h.groups)))
	}
	g.refs++
	return g
}

func (h *waitHub) leave(g *waitGroup) {
	h.mu.Lock()
	g.refs--
	last := g.refs == 0
	if last {
		delete(h.groups, g.key)
		h.groupsN.Store(int32(len(h.groups)))
	}
	h.mu.Unlock()
	if !last {
		return
	}
	g.smu.Lock()
	subscribed := g.subscribed
	g.smu.Unlock()
	if subscribed {
		h.unsubscribeLater(g.key)
	}
}

// subscriptionLinger is how long the subscription to a key's releases
// outlives the last waiter that took it: a Client that waits for the same
// name again soon (a worker that locks, unlocks and locks again) then finds
// it in place, instead of paying for a SUBSCRIBE, its confirmation and an
// UNSUBSCRIBE every time it waits.
var subscriptionLinger = 2 * time.Second

// linger is the subscription a key keeps after its last waiter left.
type linger struct {
	timer *time.Timer
	until time.Time // when to drop it, pushed on by each wait that ends
}

// unsubscribeLater drops one subscription to key once subscriptionLinger
// has passed. The listener counts a key's subscriptions, so a waiter that
// subscribes meanwhile keeps it, without a round trip. A key keeps one
// lingering subscription at most, whose time each later wait pushes on: the
// subscriptions of those waits are dropped at once (the listener only counts
// them down), so that a hot key holds one timer, not one per wait.
func (h *waitHub) unsubscribeLater(key string) {
	h.lmu.Lock()
	l := h.listener
	if l == nil || h.closed {
		h.lmu.Unlock()
		return
	}
	until := time.Now().Add(subscriptionLinger)
	if lg := h.lingering[key]; lg != nil {
		lg.until = until
		h.lmu.Unlock()
		h.unsubscribe(l, key)
		return
	}
	if h.lingering == nil {
		h.lingering = make(map[string]*linger)
	}
	lg := &linger{until: until}
	h.lingerWG.Add(1)
	lg.timer = time.AfterFunc(subscriptionLinger, func() { h.lingerDue(key, lg) })
	h.lingering[key] = lg
	h.lmu.Unlock()
}

// lingerDue drops key's lingering subscription lg when its time has come,
// and otherwise sets its timer again.
func (h *waitHub) lingerDue(key string, lg *linger) {
	h.lmu.Lock()
	if h.closed || h.lingering[key] != lg {
		h.lmu.Unlock()
		h.lingerWG.Done()
		return
	}
	if d := time.Until(lg.until); d > 0 {
		lg.timer.Reset(d) // still counted in lingerWG
		h.lmu.Unlock()
		return
	}
	delete(h.lingering, key)
	l := h.listener
	h.lmu.Unlock()
	defer h.lingerWG.Done()
	h.unsubscribe(l, key)
}

// unsubscribe drops one subscription to key on l.
func (h *waitHub) unsubscribe(l driver.Listener, key string) {
	h.dropping(key)
	ctx, cancel := context.WithTimeout(h.c.ctx, time.Second)
	defer cancel()
	if err := l.Unsubscribe(ctx, key); err != nil {
		h.c.log.Debug("dlock: unsubscribe failed", "key", key, "err", err)
	}
}

// openListener opens the Client's notification stream on first use.
func (h *waitHub) openListener() (driver.Listener, error) {
	h.lmu.Lock()
	defer h.lmu.Unlock()
	if h.listener != nil || h.closed {
		return h.listener, nil
	}
	if !h.failedAt.IsZero() && time.Since(h.failedAt) < time.Second {
		return nil, errListenBackoff
	}
	l, err := h.notifier.Listen(h.c.ctx, h.notify)
	if err != nil {
		h.failedAt = time.Now()
		return nil, err
	}
	h.listener = l
	return l, nil
}

// errListenBackoff marks a Listen not retried yet after a recent failure.
var errListenBackoff = errors.New("dlock: notifications unavailable; retrying later")

// subscribe makes sure the active waiter of g gets release notifications
// before it tries again. Without them it still works, by polling.
func (h *waitHub) subscribe(ctx context.Context, g *waitGroup) {
	if h.notifier == nil || h.refused.Load() {
		return
	}
	g.smu.Lock()
	defer g.smu.Unlock()
	if g.subscribed {
		return
	}
	l, err := h.openListener()
	if err == nil && l != nil {
		err = l.Subscribe(ctx, g.key)
		g.subscribed = err == nil
		if g.subscribed {
			h.subscribed(g.key)
		}
	}
	switch {
	case err == nil || errors.Is(err, errListenBackoff):
	case errors.Is(err, driver.ErrNotifyRefused):
		// The store will refuse every key alike (an ACL): stop asking, and
		// say so once.
		if h.refused.CompareAndSwap(false, true) {
			h.c.log.Warn("dlock: the store refuses release notifications; every wait polls from now on, which hands the lock over later", "err", err)
		}
	case ctx.Err() == nil:
		h.c.log.Warn("dlock: release notifications unavailable; polling", "key", g.key, "err", err)
	}
}

// wait is Lock after a failed first attempt, whose answer is last; mk is
// what the Client knew of the key's releases before that attempt: when no
// release came since, the wait sleeps before it tries again.
//
// The waiters of one Client on one key queue at the group's gate, in
// arrival order, and only the one at the gate deals with the store: it
// alone tries, is woken by releases, and, when it waits in the store's fair
// queue (a Fair Mutex, or a plain one whose wait starved), holds the
// Client's one place in that queue. However many goroutines wait, a Client
// costs the store one entry per name and one attempt per release, and each
// waiter costs its own goroutine only.
func (h *waitHub) wait(ctx context.Context, m *Mutex, token string, last driver.AcquireResult, mk releaseMark) (*Lease, error) {
	// Close ends the wait, even in the middle of a store call.
	ctx, stop := h.c.closeAware(ctx)
	defer stop()
	g := h.join(m.key)
	defer h.leave(g)

	// A waiter that queued behind another at the gate tries at once when
	// its turn comes: what its first try saw (the holder's TTL) is old by
	// then.
	gated := false
	select {
	case g.gate <- struct{}{}:
	default:
		gated = true
		if last.Queued {
			// The waiter at the gate keeps the Client's place; a queue
			// entry or writer intent of this one would stand for nobody
			// (and a queue entry that came to the head would hold the lock
			// up for everyone until it lapsed).
			m.abandon(token, last, h.entryUsers(g, token) > 0)
			last.Queued = false
		}
		select {
		case g.gate <- struct{}{}:
		case <-ctx.Done():
			return nil, errors.Join(m.notObtained(last), context.Cause(ctx))
		}
	}
	defer func() { <-g.gate }()

	if !m.opts.fair {
		l, starved, err := h.waitPlain(ctx, g, m, token, &last, mk, gated)
		if !starved {
			return l, err
		}
		// Queue up, as a fair waiter: its first try queues.
		mk, gated = releaseMark{}, true
	}
	return h.waitFair(ctx, g, m, token, last, mk, gated)
}

// waitPlain is the wait of a Mutex without Fair, at the gate. It reports
// starved, with no lease and no error, when the wait starved and should go
// on in the queue (waitFair); *last is the last answer of the store.
func (h *waitHub) waitPlain(ctx context.Context, g *waitGroup, m *Mutex, token string, last *driver.AcquireResult, mk releaseMark, gated bool) (l *Lease, starved bool, err error) {
	if m.fairNow() {
		return nil, true, nil // the name has a live queue: join it at once
	}
	start := time.Now()
	notObtained := func() error { return errors.Join(m.notObtained(*last), context.Cause(ctx)) }
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for attempt := 1; ; attempt++ {
		res := *last
		h.subscribe(ctx, g) // before released: this wait's own subscription must be in place
		if attempt > 1 || gated || h.released(m.key, mk) {
			l, r, err := h.attempt(ctx, g, g.wake, m, token, false)
			switch {
			case l != nil:
				return l, false, nil
			case err != nil && ctx.Err() != nil:
				return nil, false, notObtained() // names the holder last seen; try cleaned up
			case err != nil:
				return nil, false, err
			}
			res, *last = r, r
			m.busy(res)
		}
		if h.starving(m, start, *last) {
			return nil, true, nil
		}

		// Releases wake a subscribed waiter, so it polls only as a safety
		// net; one that is not (no notifications, or they failed) polls
		// in earnest.
		retry := m.opts.retry
		if retry == nil {
			retry = defaultPolledRetry
			if h.notified(g) {
				retry = defaultNotifiedRetry
			}
		}
		d := max(retry.Delay(attempt), time.Millisecond)
		if res.HolderTTL > 0 && res.HolderTTL < d {
			d = res.HolderTTL + time.Millisecond
		}
		if res.Queued {
			// A writer intent is kept only by trying again before it lapses.
			d = min(d, m.opts.queueTTL()/3)
		}
		if !sleep(ctx, timer, d, g.wake) {
			m.abandon(token, *last, false)
			return nil, false, notObtained()
		}
		if h.starving(m, start, *last) {
			return nil, true, nil
		}
	}
}

// waitFair is the wait of a fair Mutex, or of a plain one that starved, at
// the gate. It keeps the Client's queue entry alive by trying again every
// third of its time to live, and is woken by a release that names its
// token, by the holder's TTL running out, and, on stores without
// notification, by polling on the WithRetry schedule. It tries at once
// when gated is set or its last answer did not queue it, and otherwise
// when a release may have come since mk.
func (h *waitHub) waitFair(ctx context.Context, g *waitGroup, m *Mutex, token string, last driver.AcquireResult, mk releaseMark, gated bool) (*Lease, error) {
	w := &fairWaiter{wake: make(chan struct{}, 1), position: last.Position}
	h.mu.Lock()
	if g.fair == nil {
		g.fair = make(map[string][]*fairWaiter)
	}
	// Goroutines of one reentrant handle share a token and so a queue
	// entry: a release that names the token wakes them all.
	g.fair[token] = append(g.fair[token], w)
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		ws := slices.DeleteFunc(g.fair[token], func(x *fairWaiter) bool { return x == w })
		if len(ws) == 0 {
			delete(g.fair, token)
		} else {
			g.fair[token] = ws
		}
		h.mu.Unlock()
	}()

	notObtained := func() error { return errors.Join(m.notObtained(last), context.Cause(ctx)) }
	retry := m.opts.retry
	if retry == nil {
		retry = defaultPolledRetry
	}
	refresh := m.opts.queueTTL() / 3
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	// A plain Mutex that queued because it starved does not wait on a
	// head that does not come: a waiter that died keeps its entry until the
	// entry lapses (up to 5s). While the lock stays free but promised to
	// another head, such a waiter tries again every promisedRetry, and after
	// promisedGrace it takes the lock without the queue, as a plain Mutex
	// may.
	var promisedSince time.Time
	for attempt := 1; ; attempt++ {
		fair := true
		if m.starve && !promisedSince.IsZero() && time.Since(promisedSince) >= promisedGrace {
			fair = false
		}
		res := last
		h.subscribe(ctx, g) // before released: this wait's own subscription must be in place
		if attempt > 1 || gated || !last.Queued || h.released(m.key, mk) {
			l, r, err := h.attempt(ctx, g, w.wake, m, token, fair)
			switch {
			case l != nil:
				return l, nil
			case err != nil && ctx.Err() != nil:
				return nil, notObtained() // try cleaned up
			case err != nil:
				return nil, err
			}
			res, last = r, r
			h.mu.Lock()
			w.position = res.Position
			h.mu.Unlock()
			m.busy(res)
		}

		d := refresh
		notified := h.notified(g)
		if !notified || m.opts.retry != nil {
			d = min(d, max(retry.Delay(attempt), time.Millisecond))
		}
		if !notified && m.opts.retry == nil && res.Position > 0 {
			// Polling: only the head can be let in, and every poll of the
			// waiters behind it is in vain until it is their turn; the head
			// polls at the schedule's first pace and the others the slower,
			// the further back they are.
			d = min(d, time.Duration(res.Position)*max(retry.Delay(1), time.Millisecond))
		}
		switch {
		case !m.starve:
		case res.Holder == "" && res.HolderTTL == 0 && res.Shared == 0:
			// Free, but promised to the queue's head.
			if promisedSince.IsZero() {
				promisedSince = time.Now()
			}
			d = min(d, promisedRetry)
		default:
			promisedSince = time.Time{}
		}
		if res.HolderTTL > 0 {
			// Not only the head: when the head left the queue while the
			// lock was held, nobody is told who is head now, and a holder
			// that expires is announced by no release.
			d = min(d, res.HolderTTL+time.Millisecond)
		}
		if !sleep(ctx, timer, d, w.wake) {
			m.abandon(token, last, h.entryUsers(g, token) > 1)
			return nil, notObtained()
		}
	}
}

// entryUsers returns how many waiters of g wait in the queue with token,
// and so on one queue entry (goroutines of one reentrant handle).
func (h *waitHub) entryUsers(g *waitGroup, token string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(g.fair[token])
}

// notified reports whether releases of g's key wake its waiters: the
// Client's notification stream took the subscription.
func (h *waitHub) notified(g *waitGroup) bool {
	if h.notifier == nil {
		return false
	}
	g.smu.Lock()
	defer g.smu.Unlock()
	return g.subscribed
}

// attempt makes one attempt of a wait: it subscribes to releases of the
// key first, so that none after the attempt is missed, and drops a wake-up
// seen before it, which the attempt covers.
func (h *waitHub) attempt(ctx context.Context, g *waitGroup, wake chan struct{}, m *Mutex, token string, fair bool) (*Lease, driver.AcquireResult, error) {
	h.subscribe(ctx, g)
	select {
	case <-wake:
	default:
	}
	return m.try(ctx, token, true, fair)
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

var (
	defaultNotifiedRetry = ExponentialBackoff(100*time.Millisecond, 2*time.Second)
	defaultPolledRetry   = ExponentialBackoff(5*time.Millisecond, 500*time.Millisecond)
)

// close ends the notification stream. Waiters have left by now.
func (h *waitHub) close() {
	h.lmu.Lock()
	h.closed = true
	l := h.listener
	h.listener = nil
	for _, lg := range h.lingering {
		if lg.timer.Stop() {
			h.lingerWG.Done()
		}
	}
	h.lingering = nil
	h.lmu.Unlock()
	h.lingerWG.Wait() // an unsubscription under way finishes before the stream closes
	if l != nil {
		if err := l.Close(); err != nil {
			h.c.log.Debug("dlock: closing the notification stream", "err", err)
		}
	}
}
