package dash

import (
	"context"
	"sync"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// maxSubscriptions bounds the keys the dash subscribes to: each costs a
// round trip to subscribe. The locks beyond it are seen by sampling only.
const maxSubscriptions = 1000

// listenRetry is the least time between two failed Listens.
const listenRetry = 5 * time.Second

// watcher subscribes to the release notifications of the locks the last
// sample saw held (driver.Notifier: Redis pub/sub, PostgreSQL
// LISTEN/NOTIFY, etcd watches, SQLite wake-ups), so that a release is shown
// without waiting for the next sample. A notification only wakes the
// sampler: what the page shows still comes from a sample. A release
// between a sample and the subscription that follows it is seen by the
// next sample, as without notifications. Only Run's goroutine uses it.
type watcher struct {
	open     func() driver.Notifier // nil: no notifications
	ln       driver.Listener        // nil until Listen succeeded
	failedAt time.Time              // the last failed Listen
	subs     map[string]bool
	wake     chan struct{} // a notification came; buffered, of 1

	mu        sync.Mutex
	announced map[string]bool // keys whose release was announced since take
}

func newWatcher(open func() driver.Notifier) *watcher {
	return &watcher{open: open, subs: map[string]bool{}, wake: make(chan struct{}, 1)}
}

// notify is the Listener's callback: it must not block.
func (w *watcher) notify(key, _ string) {
	if key != "" {
		w.mu.Lock()
		if w.announced == nil {
			w.announced = map[string]bool{}
		}
		w.announced[key] = true
		w.mu.Unlock()
	}
	select {
	case w.wake <- struct{}{}:
	default: // a wake-up is pending already
	}
}

// sync subscribes to keys and drops the subscriptions of the others. It
// reports whether notifications are on.
func (w *watcher) sync(ctx context.Context, keys []string, timeout time.Duration) bool {
	if w.open == nil {
		return false
	}
	if w.ln == nil {
		if !w.failedAt.IsZero() && time.Since(w.failedAt) < listenRetry {
			return false
		}
		n := w.open()
		if n == nil {
			return false
		}
		lctx, cancel := context.WithTimeout(ctx, timeout)
		ln, err := n.Listen(lctx, w.notify)
		cancel()
		if err != nil {
			w.failedAt = time.Now()
			return false
		}
		w.ln = ln
	}
	want := make(map[string]bool, len(keys))
	for _, k := range keys {
		want[k] = true
	}
	for k := range w.subs {
		if !want[k] {
			uctx, cancel := context.WithTimeout(ctx, timeout)
			_ = w.ln.Unsubscribe(uctx, k)
			cancel()
			delete(w.subs, k)
		}
	}
	for _, k := range keys {
		if w.subs[k] || len(w.subs) >= maxSubscriptions || ctx.Err() != nil {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, timeout)
		err := w.ln.Subscribe(sctx, k)
		cancel()
		if err == nil {
			w.subs[k] = true
		}
	}
	return true
}

// take returns the keys whose release was announced since the last take
// (nil for none), for the sample about to be taken: a hold of such a key
// that is gone was released, not lost, however long ago it was last seen.
func (w *watcher) take() map[string]bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	a := w.announced
	w.announced = nil
	return a
}

// close ends the notification stream.
func (w *watcher) close() {
	if w.ln != nil {
		_ = w.ln.Close()
	}
}
