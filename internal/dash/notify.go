package dash

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// maxSubscriptions bounds the keys the dash subscribes to: each costs a
// round trip to subscribe. The locks beyond it are seen by sampling only.
const maxSubscriptions = 1000

// listenRetry is the least time between two failed Listens.
const listenRetry = 5 * time.Second

// callTimeout bounds one Listen, Subscribe or Unsubscribe. A round of
// subscriptions stops at its first failure (the store is slow or down:
// the samples say so), so that it cannot hold the sampler for long.
const callTimeout = 2 * time.Second

// watcher subscribes to the release notifications of the locks the last
// sample saw held (driver.Notifier: Redis pub/sub, PostgreSQL
// LISTEN/NOTIFY, etcd watches, SQLite wake-ups), so that a release is shown
// without waiting for the next sample. A notification only wakes the
// sampler: what the page shows still comes from a sample. A release
// between a sample and the subscription that follows it is seen by the
// next sample, as without notifications. Its own goroutine (start) makes
// the store calls, so that a slow or hung store never holds up the
// samples: Run hands it the keys of each sample (want) and reads on.
type watcher struct {
	open     func() driver.Notifier // nil: no notifications
	ln       driver.Listener        // nil until Listen succeeded; the goroutine's
	failedAt time.Time              // the last failed Listen; the goroutine's
	subs     map[string]bool        // the goroutine's
	wake     chan struct{}          // a notification came; buffered, of 1
	keys     chan []string          // the last sample's keys; buffered, of 1
	on       *atomic.Bool           // notifications are on
	wg       sync.WaitGroup

	mu        sync.Mutex
	announced map[string]bool // keys whose release was announced since take
}

func newWatcher(open func() driver.Notifier, on *atomic.Bool) *watcher {
	return &watcher{open: open, on: on, subs: map[string]bool{}, wake: make(chan struct{}, 1), keys: make(chan []string, 1)}
}

// start runs the goroutine that subscribes until ctx is done; stop waits
// for it and ends the notification stream.
func (w *watcher) start(ctx context.Context) {
	if w.open == nil {
		return
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case keys := <-w.keys:
				w.on.Store(w.sync(ctx, keys))
			}
		}
	}()
}

// want hands the goroutine the keys of the last sample, in place of any
// it has not taken yet. Only Run calls it.
func (w *watcher) want(keys []string) {
	if w.open == nil {
		return
	}
	select {
	case <-w.keys:
	default:
	}
	w.keys <- keys
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
// reports whether notifications are on. Only the goroutine calls it.
func (w *watcher) sync(ctx context.Context, keys []string) bool {
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
		lctx, cancel := context.WithTimeout(ctx, callTimeout)
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
		if want[k] {
			continue
		}
		uctx, cancel := context.WithTimeout(ctx, callTimeout)
		err := w.ln.Unsubscribe(uctx, k)
		cancel()
		if err != nil {
			return true // tried again after the next sample
		}
		delete(w.subs, k)
	}
	for _, k := range keys {
		if w.subs[k] {
			continue
		}
		if len(w.subs) >= maxSubscriptions || ctx.Err() != nil {
			break
		}
		sctx, cancel := context.WithTimeout(ctx, callTimeout)
		err := w.ln.Subscribe(sctx, k)
		cancel()
		if err != nil {
			break // tried again after the next sample
		}
		w.subs[k] = true
	}
	// On only while some release can be announced: a stream whose every
	// subscription failed announces nothing.
	return len(w.subs) > 0 || len(keys) == 0
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

// stop waits for the goroutine (its ctx must be done) and ends the
// notification stream.
func (w *watcher) stop() {
	w.wg.Wait()
	w.on.Store(false)
	if w.ln != nil {
		_ = w.ln.Close()
	}
}
