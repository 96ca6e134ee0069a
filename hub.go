// The wait hub: a Client's waiter groups, their turns and wake-ups, and what
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
// only the group's active waiter (the one that holds its turn) queries the
// store, so a release costs one attempt per Client and key, not one per
// goroutine. The hub owns the Client's one notification stream (stream.go)
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
	keys     map[string]*keyListen // the key subscriptions on the stream (stream.go)
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
	turn chan struct{} // capacity 1: held by the active waiter
	wake chan struct{} // capacity 1: a release of key was seen
	// reserved: the turn is held for the Lock making its first attempt
	// on key (see joinOrTry); last, the store's last answer to a waiter
	// of the group (see heard). Guarded by waitHub.mu.
	reserved bool
	last     driver.AcquireResult
	// fair waiters by token, guarded by waitHub.mu. They do not queue at the
	// gate: the store's queue orders them, and a release wakes only the
	// waiter it names.
	fair map[string][]*fairWaiter
	// place is the Client's place in the store's queue that a granted
	// waiter passes on to the next waiter to take the turn (see
	// waiter.passPlace), or nil; guarded by waitHub.mu.
	place *queuePlace

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
	// successor: that release queued the successor of the waiter's token
	// (driver.Handoff.Successor); guarded by waitHub.mu.
	successor bool
}

// queuePlace is a queue entry that a release made for a Client, the
// successor of the token it handed the lock to (driver.AcquireRequest.
// KeepPlace), for the Client's next waiter to take.
type queuePlace struct {
	token string
	// marked: the release's announcement said that it queued the entry;
	// otherwise the entry may exist, and the next waiter asks for it.
	marked bool
	// queued is when the request went out that set the expiry of the
	// predecessor's entry, which the successor's copies (the predecessor's
	// last queued request, or one of its own predecessor's), or zero: the
	// entry lives at least QueueTTL from then (see
	// driver.AcquireRequest.Handoff). qttl and metadata are the
	// predecessor's handle's.
	queued   time.Time
	qttl     time.Duration
	metadata string
	fence    uint64      // the predecessor's grant, below the successor's
	mk       releaseMark // the Client's releases heard when the place was passed on
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
func (hub *waitHub) mark(key string) releaseMark {
	if hub.notifier == nil || hub.subsN.Load() == 0 {
		return releaseMark{}
	}
	hub.mu.Lock()
	defer hub.mu.Unlock()
	s := hub.subs[key]
	if s == nil {
		return releaseMark{}
	}
	return releaseMark{sub: s, seq: s.seq, plain: s.plain, epoch: hub.epoch}
}

// released reports whether key may have been released since mk was taken:
// when there was no subscription then, there has been a moment without one
// since, or a release or a gap in the stream was heard since. When it
// reports false, the key was subscribed all along and no release came, so
// the next release will be heard: a wait may sleep before trying again.
func (hub *waitHub) released(key string, mk releaseMark) bool {
	if mk.sub == nil {
		return true
	}
	hub.mu.Lock()
	defer hub.mu.Unlock()
	return hub.subs[key] != mk.sub || mk.sub.seq != mk.seq || hub.epoch != mk.epoch
}

// onlyHandoffsSince reports whether key has been subscribed without a
// break (and the stream without a gap) since mk was taken, and every
// release heard since was a direct handoff.
func (hub *waitHub) onlyHandoffsSince(key string, mk releaseMark) bool {
	if mk.sub == nil {
		return false
	}
	hub.mu.Lock()
	defer hub.mu.Unlock()
	return hub.subs[key] == mk.sub && hub.epoch == mk.epoch && mk.sub.plain == mk.plain
}

// subscribed counts a confirmed subscription of key; dropping undoes it.
func (hub *waitHub) subscribed(key string) {
	hub.mu.Lock()
	defer hub.mu.Unlock()
	if hub.subs == nil {
		hub.subs = make(map[string]*keySub)
	}
	s := hub.subs[key]
	if s == nil {
		s = &keySub{}
		hub.subs[key] = s
		hub.subsN.Store(int32(len(hub.subs)))
	}
	s.refs++
}

// dropping uncounts a subscription of key before the listener drops it, so
// that the hub never counts one that the store no longer has.
func (hub *waitHub) dropping(key string) {
	hub.mu.Lock()
	defer hub.mu.Unlock()
	delete(hub.handed, key)
	if s := hub.subs[key]; s != nil {
		if s.refs--; s.refs <= 0 {
			delete(hub.subs, key)
			hub.subsN.Store(int32(len(hub.subs)))
		}
	}
}

// notify is the listener's callback: wake the active waiter of key, or of
// every key when key is "". next, when set, is the fair waiter the store
// lets in: only that one is woken, and given the grant when the release
// handed it the lock (driver.ParseHandoff).
func (hub *waitHub) notify(key, next string) {
	hub.mu.Lock()
	defer hub.mu.Unlock()
	if key == "" {
		hub.epoch++
		for _, g := range hub.groups {
			g.wakeAll()
		}
		for _, ws := range hub.watchers {
			signalAll(ws)
		}
		return
	}
	signalAll(hub.watchers[key])
	ho := driver.ParseHandoff(next)
	token, fence := ho.Token, ho.Fence
	if ks := hub.subs[key]; ks != nil {
		ks.seq++
		if fence == 0 {
			ks.plain++
		}
	}
	if next != "" {
		hub.sawQueue(key)
	}
	g := hub.groups[key]
	if fence > 0 && hub.subs[key] != nil && (g == nil || len(g.fair[token]) == 0) {
		// Handed to a token no waiter of this Client waits with now: it
		// may be this Client's, between its first attempt and its wait.
		// Kept until the next handoff of the key (there is none before
		// this grant is released) or until the key is unsubscribed.
		if hub.handed == nil {
			hub.handed = make(map[string]driver.Handoff)
		}
		hub.handed[key] = ho
	}
	switch {
	case g == nil:
	case next == "":
		g.wakeAll()
	default:
		for _, w := range g.fair[token] {
			if fence > 0 {
				w.handoff, w.successor = fence, ho.Successor
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
// fair waiters only the one that was at the head of the queue. With
// carried (the release carried a waiter's attempt, which went out after
// it: see rides), it wakes none: the attempt's answer is news of the
// release, and any other waiter hears it from the store.
func (hub *waitHub) wakeKey(key string, carried bool) {
	hub.mu.Lock()
	defer hub.mu.Unlock()
	if ks := hub.subs[key]; ks != nil {
		ks.seq++ // a release by this Client counts as heard (see released)
		ks.plain++
	}
	signalAll(hub.watchers[key])
	g := hub.groups[key]
	if g == nil || carried {
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
func (hub *waitHub) watch(key string) chan struct{} {
	w := make(chan struct{}, 1)
	hub.mu.Lock()
	defer hub.mu.Unlock()
	if hub.watchers == nil {
		hub.watchers = make(map[string][]chan struct{})
	}
	hub.watchers[key] = append(hub.watchers[key], w)
	return w
}

// unwatch takes the observer channel w of key out.
func (hub *waitHub) unwatch(key string, w chan struct{}) {
	hub.mu.Lock()
	defer hub.mu.Unlock()
	ws := slices.DeleteFunc(hub.watchers[key], func(x chan struct{}) bool { return x == w })
	if len(ws) == 0 {
		delete(hub.watchers, key)
	} else {
		hub.watchers[key] = ws
	}
}

// wakeWatchers signals the election observers of key: this Client made a
// grant of it (which the store does not announce).
func (hub *waitHub) wakeWatchers(key string) {
	hub.mu.Lock()
	defer hub.mu.Unlock()
	signalAll(hub.watchers[key])
}

// waiting reports whether the Client has waiters on key.
func (hub *waitHub) waiting(key string) bool {
	if hub.groupsN.Load() == 0 {
		return false
	}
	hub.mu.Lock()
	defer hub.mu.Unlock()
	return hub.groups[key] != nil
}

// join adds a waiter to key's group; leave takes it out again.
func (hub *waitHub) join(key string) *waitGroup {
	hub.mu.Lock()
	defer hub.mu.Unlock()
	return hub.joinLocked(key)
}

func (hub *waitHub) joinLocked(key string) *waitGroup {
	g := hub.groups[key]
	if g == nil {
		g = &waitGroup{key: key, turn: make(chan struct{}, 1), wake: make(chan struct{}, 1)}
		if _, ok := hub.trying[key]; ok {
			// A Lock's first attempt is under way: the turn is its.
			g.turn <- struct{}{}
			g.reserved = true
		}
		hub.groups[key] = g
		hub.groupsN.Store(int32(len(hub.groups)))
	}
	g.refs++
	return g
}

// leave takes a waiter out of g; the last to leave gives up the group's
// use of the key's subscription, which lingers a while (see unlisten), and
// returns the queue place passed on that no waiter took (see passPlace),
// for the caller to withdraw.
func (hub *waitHub) leave(g *waitGroup) *queuePlace {
	hub.mu.Lock()
	g.refs--
	last := g.refs == 0
	var orphan *queuePlace
	if last {
		delete(hub.groups, g.key)
		hub.groupsN.Store(int32(len(hub.groups)))
		orphan, g.place = g.place, nil
	}
	hub.mu.Unlock()
	if !last {
		return nil
	}
	g.smu.Lock()
	g.left = true
	subscribed := g.subscribed
	if g.subCancel != nil {
		g.subCancel(errGroupLeft)
	}
	g.smu.Unlock()
	if subscribed {
		hub.unlisten(g.key)
	}
	return orphan
}

// crowded reports whether other waiters of g than the caller wait.
func (hub *waitHub) crowded(g *waitGroup) bool {
	hub.mu.Lock()
	defer hub.mu.Unlock()
	return g.refs > 1
}

// passPlace leaves p for the next waiter of g to take the turn (takePlace).
func (hub *waitHub) passPlace(g *waitGroup, p *queuePlace) {
	hub.mu.Lock()
	g.place = p
	hub.mu.Unlock()
}

// takePlace returns the place passed on in g, if any, and clears it.
func (hub *waitHub) takePlace(g *waitGroup) *queuePlace {
	hub.mu.Lock()
	defer hub.mu.Unlock()
	p := g.place
	g.place = nil
	return p
}

// enqueue registers a waiter of g in the store's fair queue with token, at
// position; dequeue takes it out.
func (hub *waitHub) enqueue(g *waitGroup, token string, position int) *fairWaiter {
	w := &fairWaiter{wake: make(chan struct{}, 1), position: position}
	hub.mu.Lock()
	defer hub.mu.Unlock()
	if g.fair == nil {
		g.fair = make(map[string][]*fairWaiter)
	}
	// Goroutines of one reentrant handle share a token and so a queue
	// entry: a release that names the token wakes them all.
	g.fair[token] = append(g.fair[token], w)
	return w
}

// dequeue takes w, of token, out of g's fair waiters.
func (hub *waitHub) dequeue(g *waitGroup, token string, w *fairWaiter) {
	hub.mu.Lock()
	defer hub.mu.Unlock()
	ws := slices.DeleteFunc(g.fair[token], func(x *fairWaiter) bool { return x == w })
	if len(ws) == 0 {
		delete(g.fair, token)
	} else {
		g.fair[token] = ws
	}
}

// handedOff returns the fence of a grant a release handed to w, which
// waits on g's key with token, once, or 0, and whether that release queued
// token's successor. The announcement may have come before w was
// registered (see notify).
func (hub *waitHub) handedOff(g *waitGroup, token string, w *fairWaiter) (uint64, bool) {
	hub.mu.Lock()
	defer hub.mu.Unlock()
	f, succ := w.handoff, w.successor
	w.handoff, w.successor = 0, false
	if ho, ok := hub.handed[g.key]; ok && ho.Token == token {
		delete(hub.handed, g.key)
		if f == 0 {
			f, succ = ho.Fence, ho.Successor
		}
	}
	return f, succ
}

// moved records w's place in the queue after an attempt.
func (hub *waitHub) moved(w *fairWaiter, position int) {
	hub.mu.Lock()
	w.position = position
	hub.mu.Unlock()
}

// entryUsers returns how many waiters of g wait in the queue with token,
// and so on one queue entry (goroutines of one reentrant handle).
func (hub *waitHub) entryUsers(g *waitGroup, token string) int {
	hub.mu.Lock()
	defer hub.mu.Unlock()
	return len(g.fair[token])
}
