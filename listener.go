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

// linger is the subscription a key keeps after its last waiter left.
type linger struct {
	timer *time.Timer
	until time.Time // when to drop it, pushed on by each wait that ends
}

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
			h.log.Warn("dlock: the store refuses release notifications; every wait polls from now on, which hands the lock over later", "err", err)
		}
	case ctx.Err() == nil:
		h.log.Warn("dlock: release notifications unavailable; polling", "key", g.key, "err", err)
	}
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
	l, err := h.notifier.Listen(h.ctx, h.notify)
	if err != nil {
		h.failedAt = time.Now()
		return nil, err
	}
	h.listener = l
	return l, nil
}

// errListenBackoff marks a Listen not retried yet after a recent failure.
var errListenBackoff = errors.New("dlock: notifications unavailable; retrying later")

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
	ctx, cancel := context.WithTimeout(h.ctx, time.Second)
	defer cancel()
	if err := l.Unsubscribe(ctx, key); err != nil {
		h.log.Debug("dlock: unsubscribe failed", "key", key, "err", err)
	}
}

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
			h.log.Debug("dlock: closing the notification stream", "err", err)
		}
	}
}
