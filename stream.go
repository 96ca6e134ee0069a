// The Client's notification stream: opening it, subscribing a waiter group
// to its key's releases, lingering subscriptions, and closing it.

package dlock

import (
	"context"
	"errors"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// subscriptionLinger is how long the subscription to a key's releases
// outlives the last waiter that took it: a Client that waits for the same
// name again soon (a worker that locks, unlocks and locks again) then finds
// it in place, instead of paying for a SUBSCRIBE, its confirmation and an
// UNSUBSCRIBE every time it waits.
var subscriptionLinger = 2 * time.Second

// subscribeWait bounds the wait for the store to confirm a subscription:
// past it the waiter polls instead, and so do the name's waits and
// observers for subscribeWait more before one subscribes again (listen). A
// subscription that a failing connection left waiting to be made again (a
// master that died, a Cluster's slot in flight) would otherwise hold Lock
// until the store is back or ctx ends, where polling would get the lock or
// the store's error.
var subscribeWait = 5 * time.Second

// keyListen is the Client's one subscription to a key's releases on its
// stream, shared by the waiter groups of the key (usually one; two while
// one leaves as the next comes). The hub counts its users, so that the
// stream never has two live subscriptions of one key: it subscribes again
// only after the Unsubscribe of the last one has returned (see
// driver.Listener). Guarded by waitHub.lmu.
type keyListen struct {
	state keyState
	users int           // waiter groups that use it
	done  chan struct{} // while subscribing or dropping: closed when that is over
	until time.Time     // lingering: when to drop it
	timer *time.Timer   // runs lingerDue; armed tells whether it is set
	armed bool          // the timer is set and counted in lingerWG
}

type keyState int

const (
	keySubscribing keyState = iota // Subscribe in flight
	keyLive                        // confirmed, with users
	keyLingering                   // confirmed, no users: dropped at until
	keyDropping                    // Unsubscribe in flight
)

// errGroupLeft ends a subscription under way whose waiter group was left
// (see waitHub.leave): it is not a failure of the store.
var errGroupLeft = errors.New("dlock: every waiter of the name left")

// errHubClosed: the Client is closing; no subscription is made.
var errHubClosed = errors.New("dlock: client closing")

// subscribe has the Client subscribe to g's key's releases for g's
// waiters, in the background: a waiter is never blocked on a subscription.
// Until the store confirms it, g's waiters poll as where releases are not
// announced (notified reports false); once it is confirmed, they are woken
// so that an attempt covers any release before it, and from then on by
// releases. It reports whether a subscription is under way (not confirmed
// yet, not failed).
func (hub *waitHub) subscribe(g *waitGroup) (pending bool) {
	if hub.notifier == nil || hub.refused.Load() {
		return false
	}
	g.smu.Lock()
	defer g.smu.Unlock()
	switch {
	case g.subscribed || g.left:
		return false
	case g.subscribing:
		return true
	}
	live, start := hub.startSubscribe(g.key)
	switch {
	case live:
		g.subscribed = true
		return false
	case !start:
		return false
	}
	g.subscribing = true
	go hub.subscribeGroup(g)
	return true
}

// startSubscribe takes key's subscription for one more user at once when
// it is confirmed already (live or lingering) and reports live; otherwise
// it reports start when a subscription may be tried now: the Client is not
// closing, and neither key's Subscribe nor the stream's Listen failed too
// recently (see listen, openListener). With start, the caller's goroutine
// is counted in subWG.
func (hub *waitHub) startSubscribe(key string) (live, start bool) {
	hub.lmu.Lock()
	defer hub.lmu.Unlock()
	if hub.closed {
		return false, false
	}
	if ks := hub.keys[key]; ks != nil && (ks.state == keyLive || ks.state == keyLingering) {
		ks.state = keyLive
		ks.users++
		return true, false
	}
	if at, ok := hub.subFailed[key]; ok && time.Since(at) < subscribeWait {
		return false, false
	}
	if hub.listener == nil && !hub.failedAt.IsZero() && time.Since(hub.failedAt) < time.Second {
		return false, false
	}
	hub.subWG.Add(1)
	return false, true
}

// subscribeGroup makes key's subscription live for g, bounded by
// subscribeWait and the Client's life, and wakes g's waiters when it is
// confirmed; a group whose waiters all left meanwhile gives it up.
func (hub *waitHub) subscribeGroup(g *waitGroup) {
	defer hub.subWG.Done()
	ctx, cancel := context.WithCancelCause(hub.subCtx)
	defer cancel(nil)
	g.smu.Lock()
	if g.left {
		g.subscribing = false
		g.smu.Unlock()
		return
	}
	g.subCancel = cancel
	g.smu.Unlock()
	ok := hub.listenOrPoll(ctx, g.key)
	g.smu.Lock()
	g.subCancel = nil
	g.subscribing = false
	keep := ok && !g.left
	g.subscribed = keep
	g.smu.Unlock()
	switch {
	case keep:
		hub.mu.Lock()
		g.wakeAll()
		hub.mu.Unlock()
	case ok:
		hub.unlisten(g.key)
	}
}

// listenOrPoll makes key's subscription live for one more user (listen),
// and reports whether it did; when it did not, the caller polls, and the
// reason is logged.
func (hub *waitHub) listenOrPoll(ctx context.Context, key string) bool {
	if hub.notifier == nil || hub.refused.Load() {
		return false
	}
	err := hub.listen(ctx, key)
	switch {
	case err == nil || errors.Is(err, errListenBackoff) || errors.Is(err, errSubscribeBackoff) || errors.Is(err, errHubClosed):
	case errors.Is(err, driver.ErrNotifyRefused):
		// The store will refuse every key alike (an ACL): stop asking, and
		// say so once.
		if hub.refused.CompareAndSwap(false, true) {
			hub.log.Warn("dlock: the store refuses release notifications; every wait polls from now on, which hands the lock over later", "err", err)
		}
	case ctx.Err() == nil:
		hub.log.Warn("dlock: release notifications unavailable; polling", "key", key, "err", err)
	}
	return err == nil
}

// notified reports whether releases of g's key wake its waiters: the
// Client's notification stream took the subscription.
func (hub *waitHub) notified(g *waitGroup) bool {
	if hub.notifier == nil {
		return false
	}
	g.smu.Lock()
	defer g.smu.Unlock()
	return g.subscribed
}

// listen makes the key's subscription live for one more user: it takes
// over a lingering one, joins a live one, waits for one being made or
// dropped, or subscribes. Within subscribeWait of a failed Subscribe of key
// it returns errSubscribeBackoff, and the user polls: a store that lets a
// subscription wait out subscribeWait would otherwise cost that much to
// every wait, and to every pass of an election's observer.
func (hub *waitHub) listen(ctx context.Context, key string) error {
	for {
		hub.lmu.Lock()
		if hub.closed {
			hub.lmu.Unlock()
			return errHubClosed
		}
		if at, ok := hub.subFailed[key]; ok {
			if time.Since(at) < subscribeWait {
				hub.lmu.Unlock()
				return errSubscribeBackoff
			}
			delete(hub.subFailed, key)
		}
		ks := hub.keys[key]
		switch {
		case ks == nil:
			return hub.subscribeKey(ctx, key) // unlocks h.lmu
		case ks.state == keyLive || ks.state == keyLingering:
			ks.state = keyLive
			ks.users++
			hub.lmu.Unlock()
			return nil
		}
		done := ks.done
		hub.lmu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// subscribeKey subscribes to key, which has no subscription. The caller
// holds h.lmu, which it releases.
func (hub *waitHub) subscribeKey(ctx context.Context, key string) error {
	l, err := hub.openListener()
	if err != nil {
		hub.lmu.Unlock()
		return err
	}
	ks := &keyListen{state: keySubscribing, done: make(chan struct{})}
	if hub.keys == nil {
		hub.keys = make(map[string]*keyListen)
	}
	hub.keys[key] = ks
	hub.lmu.Unlock()
	sctx, cancel := context.WithTimeout(ctx, subscribeWait)
	err = l.Subscribe(sctx, key)
	cancel()
	hub.lmu.Lock()
	defer hub.lmu.Unlock()
	close(ks.done)
	if err != nil {
		delete(hub.keys, key)
		if !hub.closed && !errors.Is(context.Cause(ctx), errGroupLeft) {
			// Whatever ended it, the caller's context included: the
			// name's next users poll rather than wait for it again.
			// (Not when the group that asked for it was left: nobody
			// waited for it, and the store did not fail.)
			hub.subscribeFailed(key)
		}
		return err
	}
	ks.state, ks.users = keyLive, 1
	hub.subscribed(key)
	return nil
}

// openListener opens the Client's notification stream on first use. The
// caller holds h.lmu.
func (hub *waitHub) openListener() (driver.Listener, error) {
	if hub.listener != nil {
		return hub.listener, nil
	}
	if !hub.failedAt.IsZero() && time.Since(hub.failedAt) < time.Second {
		return nil, errListenBackoff
	}
	l, err := hub.notifier.Listen(hub.ctx, hub.notify)
	if err != nil {
		hub.failedAt = time.Now()
		return nil, err
	}
	hub.listener = l
	return l, nil
}

// watchHandoffs has the Client's stream, whose subscription of key the
// caller holds, report the handoffs of key to other clients too, when its
// backend announces them to the head's client alone (driver.HandoffWatcher).
// It returns the undo, or nil when there is nothing to undo.
func (hub *waitHub) watchHandoffs(ctx context.Context, key string) func() {
	hub.lmu.Lock()
	l, closed := hub.listener, hub.closed
	hub.lmu.Unlock()
	w, ok := l.(driver.HandoffWatcher)
	if closed || !ok {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, subscribeWait)
	err := w.Watch(wctx, key)
	cancel()
	if err != nil {
		hub.lmu.Lock()
		closed = hub.closed
		hub.lmu.Unlock()
		// A refusal is the store's for every channel: the next Subscribe
		// reports it, and the Client polls.
		if ctx.Err() == nil && !closed && !errors.Is(err, driver.ErrNotifyRefused) {
			hub.log.Warn("dlock: handoffs to other clients unheard; the observer sees them at its next read", "key", key, "err", err)
		}
		return nil
	}
	return func() { _ = w.Unwatch(context.WithoutCancel(hub.ctx), key) }
}

// errListenBackoff marks a Listen not retried yet after a recent failure.
var errListenBackoff = errors.New("dlock: notifications unavailable; retrying later")

// errSubscribeBackoff marks a key's Subscribe not retried yet after a
// recent failure.
var errSubscribeBackoff = errors.New("dlock: the name's notifications unavailable; retrying later")

// subscribeFailed records that a Subscribe of key failed now. The records
// of other keys whose pause is over go once they are many. h.lmu is held.
func (hub *waitHub) subscribeFailed(key string) {
	if hub.subFailed == nil {
		hub.subFailed = make(map[string]time.Time)
	}
	if len(hub.subFailed) >= 64 {
		for k, at := range hub.subFailed {
			if time.Since(at) >= subscribeWait {
				delete(hub.subFailed, k)
			}
		}
	}
	hub.subFailed[key] = time.Now()
}

// unlisten gives up one user of key's subscription. The last lets it
// linger for subscriptionLinger, so that a wait that comes soon finds it in
// place; a hot key keeps one timer, which each wait's end pushes on.
func (hub *waitHub) unlisten(key string) {
	hub.lmu.Lock()
	defer hub.lmu.Unlock()
	ks := hub.keys[key]
	if ks == nil || hub.closed || ks.state != keyLive {
		return
	}
	if ks.users--; ks.users > 0 {
		return
	}
	ks.state = keyLingering
	ks.until = time.Now().Add(subscriptionLinger)
	if ks.armed {
		return // lingerDue sees the new until
	}
	ks.armed = true
	hub.lingerWG.Add(1)
	if ks.timer == nil {
		ks.timer = time.AfterFunc(subscriptionLinger, func() { hub.lingerDue(key, ks) })
	} else {
		ks.timer.Reset(subscriptionLinger)
	}
}

// lingerDue drops key's lingering subscription ks when its time has come,
// and otherwise sets its timer again.
func (hub *waitHub) lingerDue(key string, ks *keyListen) {
	hub.lmu.Lock()
	if hub.closed || hub.keys[key] != ks || ks.state != keyLingering {
		ks.armed = false // in use again: the next unlisten sets it
		hub.lmu.Unlock()
		hub.lingerWG.Done()
		return
	}
	if d := time.Until(ks.until); d > 0 {
		ks.timer.Reset(d) // still armed and counted in lingerWG
		hub.lmu.Unlock()
		return
	}
	ks.armed = false
	ks.state = keyDropping
	ks.done = make(chan struct{})
	l := hub.listener
	hub.lmu.Unlock()
	defer hub.lingerWG.Done()

	hub.dropping(key)
	ctx, cancel := context.WithTimeout(hub.ctx, time.Second)
	defer cancel()
	if err := l.Unsubscribe(ctx, key); err != nil {
		hub.log.Debug("dlock: unsubscribe failed", "key", key, "err", err)
	}
	hub.lmu.Lock()
	delete(hub.keys, key)
	close(ks.done)
	hub.lmu.Unlock()
}

// close ends the notification stream. Waiters have left by now.
func (hub *waitHub) close() {
	hub.lmu.Lock()
	hub.closed = true
	hub.subCancel()
	l := hub.listener
	hub.listener = nil
	for _, ks := range hub.keys {
		if ks.armed && ks.timer.Stop() {
			ks.armed = false
			hub.lingerWG.Done()
		}
	}
	hub.lmu.Unlock()
	hub.subWG.Wait()    // subscriptions under way end before the stream closes
	hub.lingerWG.Wait() // an unsubscription under way finishes before the stream closes
	if l != nil {
		if err := l.Close(); err != nil {
			hub.log.Debug("dlock: closing the notification stream", "err", err)
		}
	}
}
