// The wait hub: a Client's waiter groups, their gates and wake-ups, and what
// the Client knows of each key's releases.

package dlock

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// waitHub coordinates a Client's waiters. Waiters on one key form a group;
// only the group's active waiter (the one that holds its gate) queries the
// store, so a release costs one attempt per Client and key, not one per
// goroutine. The hub owns the Client's one notification stream (listener.go)
// and routes each release to the group of its key. The wait loop itself is
// the handle's (lockwait.go); the hub gives it primitives only.
type waitHub struct {
	notifier driver.Notifier // nil when the backend has none
	log      *slog.Logger
	ctx      context.Context // the Client's life: the stream's and unsubscriptions' context

	mu      sync.Mutex
	groups  map[string]*waitGroup
	groupsN atomic.Int32 // len(groups), read without mu by waiting
	// trying holds the keys on which a Lock makes its first attempt
	// outside a group (see joinOrTry).
	trying map[string]struct{}
	// subs counts, per key, the subscriptions the listener has confirmed
	// and not yet been asked to drop, and the releases heard for the key
	// meanwhile; epoch counts the moments releases may have been missed.
	// See mark.
	subs  map[string]*keySub
	subsN atomic.Int32 // len(subs), read without mu by mark
	epoch uint64
	// queueSeen is when a release of each key last named the head of a
	// live fair queue (see queueLive in starve.go); queueSeenN is its
	// length, read without mu so that a Lock on a Client that never saw a
	// queue takes no lock for it.
	queueSeen  map[string]time.Time
	queueSeenN atomic.Int32
	queueSwept time.Time // last sweep of queueSeen, at most one per queueLiveFor
	// handed is, per subscribed key, the last direct handoff announced to
	// a token that no waiter of this Client waited with at that moment
	// (see notify, handedOff).
	handed map[string]driver.Handoff
	// watchers are, per key, the channels of the Client's election
	// observers (Election.Observe), signalled with every release heard of
	// the key, every gap in the stream and every grant this Client made
	// by campaigning.
	watchers map[string][]chan struct{}

	// refused: the store refused a subscription for lack of rights
	// (driver.ErrNotifyRefused); waiters no longer subscribe, and poll.
	refused atomic.Bool

	lmu      sync.Mutex // guards the stream and the fields below
	listener driver.Listener
	closed   bool
	keys     map[string]*keyListen // the key subscriptions on the stream (listener.go)
	lingerWG sync.WaitGroup        // lingering subscriptions' timers set or running
	subWG    sync.WaitGroup        // subscriptions under way for waiter groups (subscribeGroup)
	failedAt time.Time             // last failed Listen, to retry at most once a second
	// subFailed is, per key, when its last Subscribe failed or was not
	// confirmed in time: the key's users poll for subscribeWait after it.
	subFailed map[string]time.Time
	// subCtx, the context of the subscriptions made for waiter groups,
	// ends as Close begins.
	subCtx    context.Context
	subCancel context.CancelFunc
}

func newWaitHub(notifier driver.Notifier, log *slog.Logger, ctx context.Context) *waitHub {
	h := &waitHub{notifier: notifier, log: log, ctx: ctx, groups: make(map[string]*waitGroup)}
	h.subCtx, h.subCancel = context.WithCancel(ctx)
	return h
}

// waitGroup is the waiters of one Client on one key.
type waitGroup struct {
	key  string
	refs int           // waiters in the group, guarded by waitHub.mu
	gate chan struct{} // capacity 1: held by the active waiter
	wake chan struct{} // capacity 1: a release of key was seen
	// reserved: the gate is held for the Lock making its first attempt
	// on key (see joinOrTry); last, the store's last answer to a waiter
	// of the group (see heard). Guarded by waitHub.mu.
	reserved bool
	last     driver.AcquireResult
	// fair waiters by token, guarded by waitHub.mu. They do not queue at the
	// gate: the store's queue orders them, and a release wakes only the
	// waiter it names.
	fair map[string][]*fairWaiter

	smu         sync.Mutex // guards the three below
	subscribed  bool       // the key's subscription is confirmed and counts this group as a user
	subscribing bool       // a subscription for the group is under way (subscribeGroup)
	left        bool       // the group's last waiter left: it takes no subscription any more
	// subCancel ends the subscription under way for the group (set while
	// subscribing): the group's last waiter left, so nobody waits for it.
	subCancel context.CancelCauseFunc
}

// fairWaiter is one waiter in the store's fair queue.
type fairWaiter struct {
	wake     chan struct{} // capacity 1
	position int           // its place in the store's queue at its last attempt, guarded by waitHub.mu
	handoff  uint64        // the fence of a grant a release handed it, or 0; guarded by waitHub.mu
}

// keySub is a key whose releases the Client hears.
type keySub struct {
	refs int    // subscriptions confirmed and not dropped
	seq  uint64 // releases heard
	// plain counts the releases heard that were not a direct handoff (see
	// waiter.handsOffHeard).
	plain uint64
}

// releaseMark is what the Client knew of a key's releases at one moment.
type releaseMark struct {
	sub               *keySub // nil when the key was not subscribed
	seq, plain, epoch uint64
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
	return releaseMark{sub: s, seq: s.seq, plain: s.plain, epoch: h.epoch}
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

// onlyHandoffsSince reports whether key has been subscribed without a
// break (and the stream without a gap) since mk was taken, and every
// release heard since was a direct handoff.
func (h *waitHub) onlyHandoffsSince(key string, mk releaseMark) bool {
	if mk.sub == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.subs[key] == mk.sub && h.epoch == mk.epoch && mk.sub.plain == mk.plain
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
	delete(h.handed, key)
	if s := h.subs[key]; s != nil {
		if s.refs--; s.refs <= 0 {
			delete(h.subs, key)
			h.subsN.Store(int32(len(h.subs)))
		}
	}
}

// notify is the listener's callback: wake the active waiter of key, or of
// every key when key is "". next, when set, is the fair waiter the store
// lets in: only that one is woken, and given the grant when the release
// handed it the lock (driver.ParseNext).
func (h *waitHub) notify(key, next string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if key == "" {
		h.epoch++
		for _, g := range h.groups {
			g.wakeAll()
		}
		for _, ws := range h.watchers {
			signalAll(ws)
		}
		return
	}
	signalAll(h.watchers[key])
	token, fence := driver.ParseNext(next)
	if ks := h.subs[key]; ks != nil {
		ks.seq++
		if fence == 0 {
			ks.plain++
		}
	}
	if next != "" {
		h.sawQueue(key)
	}
	g := h.groups[key]
	if fence > 0 && h.subs[key] != nil && (g == nil || len(g.fair[token]) == 0) {
		// Handed to a token no waiter of this Client waits with now: it
		// may be this Client's, between its first attempt and its wait.
		// Kept until the next handoff of the key (there is none before
		// this grant is released) or until the key is unsubscribed.
		if h.handed == nil {
			h.handed = make(map[string]driver.Handoff)
		}
		h.handed[key] = driver.Handoff{Token: token, Fence: fence}
	}
	switch {
	case g == nil:
	case next == "":
		g.wakeAll()
	default:
		for _, w := range g.fair[token] {
			if fence > 0 {
				w.handoff = fence
			}
			signal(w.wake)
		}
		// The name has a queue now: a plain waiter joins it (see starve.go).
		signal(g.wake)
	}
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
		ks.plain++
	}
	signalAll(h.watchers[key])
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

func signalAll(cs []chan struct{}) {
	for _, c := range cs {
		signal(c)
	}
}

// watch registers an election observer of key: the channel returned
// (capacity 1) is signalled as described at waitHub.watchers. unwatch
// takes it out again.
func (h *waitHub) watch(key string) chan struct{} {
	w := make(chan struct{}, 1)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.watchers == nil {
		h.watchers = make(map[string][]chan struct{})
	}
	h.watchers[key] = append(h.watchers[key], w)
	return w
}

// unwatch takes the observer channel w of key out.
func (h *waitHub) unwatch(key string, w chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ws := slices.DeleteFunc(h.watchers[key], func(x chan struct{}) bool { return x == w })
	if len(ws) == 0 {
		delete(h.watchers, key)
	} else {
		h.watchers[key] = ws
	}
}

// wakeWatchers signals the election observers of key: this Client made a
// grant of it (which the store does not announce).
func (h *waitHub) wakeWatchers(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	signalAll(h.watchers[key])
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

// join adds a waiter to key's group; leave takes it out again.
func (h *waitHub) join(key string) *waitGroup {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.joinLocked(key)
}

func (h *waitHub) joinLocked(key string) *waitGroup {
	g := h.groups[key]
	if g == nil {
		g = &waitGroup{key: key, gate: make(chan struct{}, 1), wake: make(chan struct{}, 1)}
		if _, ok := h.trying[key]; ok {
			// A Lock's first attempt is under way: the gate is its turn.
			g.gate <- struct{}{}
			g.reserved = true
		}
		h.groups[key] = g
		h.groupsN.Store(int32(len(h.groups)))
	}
	g.refs++
	return g
}

// leave takes a waiter out of g; the last to leave gives up the group's
// use of the key's subscription, which lingers a while (see unlisten).
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
	g.left = true
	subscribed := g.subscribed
	if g.subCancel != nil {
		g.subCancel(errGroupLeft)
	}
	g.smu.Unlock()
	if subscribed {
		h.unlisten(g.key)
	}
}

// enqueue registers a waiter of g in the store's fair queue with token, at
// position; dequeue takes it out.
func (h *waitHub) enqueue(g *waitGroup, token string, position int) *fairWaiter {
	w := &fairWaiter{wake: make(chan struct{}, 1), position: position}
	h.mu.Lock()
	defer h.mu.Unlock()
	if g.fair == nil {
		g.fair = make(map[string][]*fairWaiter)
	}
	// Goroutines of one reentrant handle share a token and so a queue
	// entry: a release that names the token wakes them all.
	g.fair[token] = append(g.fair[token], w)
	return w
}

// dequeue takes w, of token, out of g's fair waiters.
func (h *waitHub) dequeue(g *waitGroup, token string, w *fairWaiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ws := slices.DeleteFunc(g.fair[token], func(x *fairWaiter) bool { return x == w })
	if len(ws) == 0 {
		delete(g.fair, token)
	} else {
		g.fair[token] = ws
	}
}

// handedOff returns the fence of a grant a release handed to w, which
// waits on g's key with token, once, or 0. The announcement may have come
// before w was registered (see notify).
func (h *waitHub) handedOff(g *waitGroup, token string, w *fairWaiter) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	f := w.handoff
	w.handoff = 0
	if ho, ok := h.handed[g.key]; ok && ho.Token == token {
		delete(h.handed, g.key)
		if f == 0 {
			f = ho.Fence
		}
	}
	return f
}

// moved records w's place in the queue after an attempt.
func (h *waitHub) moved(w *fairWaiter, position int) {
	h.mu.Lock()
	w.position = position
	h.mu.Unlock()
}

// entryUsers returns how many waiters of g wait in the queue with token,
// and so on one queue entry (goroutines of one reentrant handle).
func (h *waitHub) entryUsers(g *waitGroup, token string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(g.fair[token])
}
