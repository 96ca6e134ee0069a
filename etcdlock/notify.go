package etcdlock

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/dlock-go/dlock/driver"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Listen implements driver.Notifier with etcd watches: a subscription is a
// watch on the lock's directory (clientv3 carries every watch of a
// Listener on one gRPC stream), and a delete there (a release, an expired
// lease, a withdrawn or lapsed writer intent, a forced release) wakes the
// key's waiters. Re-entries and renewals delete nothing and wake nobody.
//
// The watches ask for a leader (clientv3.WithRequireLeader): a member cut
// off from the majority ends them, and the Listener tells the client that
// releases may have been missed (fn("", "")) while it watches again.
func (b *Backend) Listen(ctx context.Context, fn func(key, next string)) (driver.Listener, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	lctx, cancel := context.WithCancel(clientv3.WithRequireLeader(context.Background()))
	return &listener{b: b, fn: fn, ctx: lctx, cancel: cancel, subs: make(map[string]*subscription)}, nil
}

type listener struct {
	b      *Backend
	fn     func(key, next string)
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	subs   map[string]*subscription
	wg     sync.WaitGroup
}

type subscription struct {
	n      int
	cancel context.CancelFunc
	done   chan struct{}
	// watched counts the Watch calls (driver.HandoffWatcher) not undone:
	// while it is above 0 a Client with no queued token hears handoffs.
	watched int
	// kick is closed when watched changes: the watches are made again.
	kick chan struct{}
	// pending are the Watch calls waiting for their watch to be created.
	pending []chan<- error
}

// Subscribe implements driver.Listener: it returns once etcd has created
// the watch, so that a release after it is seen.
func (l *listener) Subscribe(ctx context.Context, key string) error {
	ctx, cancel := l.b.bound(ctx)
	defer cancel()
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return errors.New("etcd: listener closed")
	}
	if s := l.subs[key]; s != nil {
		s.n++
		l.mu.Unlock()
		return nil
	}
	wctx, cancel := context.WithCancel(l.ctx)
	s := &subscription{n: 1, cancel: cancel, done: make(chan struct{}), kick: make(chan struct{})}
	l.subs[key] = s
	l.wg.Add(1)
	l.mu.Unlock()

	created := make(chan error, 1)
	go l.watch(wctx, key, s, created)
	select {
	case err := <-created:
		if err == nil {
			return nil
		}
		l.drop(key, s)
		return wrap(err)
	case <-ctx.Done():
		l.drop(key, s)
		return wrap(ctx.Err())
	}
}

// drop ends subscription s of key and waits for its goroutine.
func (l *listener) drop(key string, s *subscription) {
	l.mu.Lock()
	if l.subs[key] == s {
		delete(l.subs, key)
	}
	l.mu.Unlock()
	s.cancel()
	<-s.done
}

// watch runs the watches of key until ctx ends. The first creation's
// outcome goes to created.
//
// While this Backend has a token queued for key behind another entry, it
// watches only the entry ahead of the oldest such token (etcd's own
// recipe, as concurrency.Mutex waits): the entry's delete is all that can
// make that token the head, and the queue's other writes, a new waiter's
// entry among them, wake nobody. When the token heads the queue it
// watches the lock's directory: a release, a handoff, an expiry, a forced
// release, a shared hold or writer intent gone. With no token queued (a
// plain waiter, or a Client whose subscription outlives its grant) it
// watches only the deletes of the holder's key, shared holds and writer
// intents, and the forced-release record: a handoff, a refresh or a new
// waiter wakes none of these, so that the cost of a grant does not grow
// with the Clients that subscribed to the name. A watch that etcd ends (no
// leader, compaction) is made again, after telling the client that it may
// have missed releases.
func (l *listener) watch(ctx context.Context, key string, s *subscription, created chan<- error) {
	defer l.wg.Done()
	defer close(s.done)
	backoff := 10 * time.Millisecond
	// from is the revision through which this subscription has seen the
	// lock's events (0: none yet): a watch made again, as the token's
	// place changed, resumes after it, so that nothing between two
	// watches is missed.
	// from is the revision since which the last watch of key without a
	// queued token saw every event (see watchDir), 0 when none did.
	var from int64
	// aheadGone: the last followAhead saw the entry ahead go (see
	// followAhead).
	aheadGone := false
	c := &confirmer{first: created}
	for ctx.Err() == nil {
		l.mu.Lock()
		kick, watched := s.kick, s.watched > 0
		c.chs = append(c.chs, s.pending...)
		s.pending = nil
		l.mu.Unlock()
		token, at, changed := l.b.oldestQueued(key)
		var err error
		switch {
		case token == "":
			from, err = l.watchFree(ctx, key, watched, changed, kick, c)
		default:
			// Confirmed at once: what the token waits for, its entry
			// coming to the head and the lock then left or handed to it,
			// is read by followAhead and watchDir once they watch, so
			// that nothing after now is missed.
			c.ok()
			var (
				head, gone bool
				next       **headHint
			)
			head, next, gone, err = l.followAhead(ctx, key, token, at, aheadGone, watched, changed, kick)
			aheadGone = gone
			if err == nil && head {
				err = l.watchDir(ctx, key, token, from, next, changed, kick)
			}
		}
		if token == "" {
			aheadGone = false
		}
		if ctx.Err() != nil {
			break
		}
		if err == nil {
			backoff = 10 * time.Millisecond
			continue // the token's place changed: watch anew
		}
		from = 0
		if c.first != nil {
			// Not created: let Subscribe fail rather than wait.
			c.fail(err)
			return
		}
		c.fail(err)
		// The watch ended (no leader, compaction): releases may have been
		// missed. Read and watch again.
		l.fn("", "")
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		backoff = min(2*backoff, time.Second)
	}
	c.fail(ctx.Err())
}

// confirmer tells Subscribe (first) and Watch calls (chs) that their key
// is watched, once the read that a watch starts after is done: the watch
// delivers every event after that read's revision, whenever etcd creates
// it, and a watch that fails is reported as missed releases (fn("", "")).
type confirmer struct {
	first chan<- error
	chs   []chan<- error
}

func (c *confirmer) ok() { c.fail(nil) }

func (c *confirmer) fail(err error) {
	if c.first != nil {
		c.first <- err
		c.first = nil
	}
	for _, ch := range c.chs {
		ch <- err
	}
	c.chs = nil
}

// errWatchEnded reports a watch that etcd ended or never created.
var errWatchEnded = errors.New("watch ended")

// awaitCreated waits for the creation of the watch wch, made with
// clientv3.WithCreatedNotify, and returns the revision it was made at:
// every event after it is delivered. The watches start at the current
// revision, never an earlier one: etcd catches a watch that starts in the
// past up with the store in a loop that runs every 100 ms, which would
// delay every wake-up that much on a busy lock.
func awaitCreated(ctx context.Context, wch clientv3.WatchChan) (int64, error) {
	select {
	case wr, ok := <-wch:
		if !ok || wr.Err() != nil || wr.Canceled || !wr.Created {
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			return 0, errWatchEnded
		}
		return wr.Header.Revision, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

var _ driver.HandoffWatcher = (*listener)(nil)

// Watch implements driver.HandoffWatcher: while this Backend has no token
// queued for key, a subscription hears only what leaves the lock free (see
// watch), not the handoffs between other Clients; Watch makes it watch
// every write of the holder's key until Unwatch. It returns once the new
// watch is made. The key must be subscribed.
func (l *listener) Watch(ctx context.Context, key string) error {
	ctx, cancel := l.b.bound(ctx)
	defer cancel()
	done := make(chan error, 1)
	l.mu.Lock()
	s := l.subs[key]
	if l.closed || s == nil {
		l.mu.Unlock()
		return errors.New("etcd: watch of a key not subscribed")
	}
	s.watched++
	s.pending = append(s.pending, done)
	close(s.kick)
	s.kick = make(chan struct{})
	l.mu.Unlock()
	var err error
	select {
	case err = <-done:
	case <-s.done:
		err = errors.New("subscription ended")
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		l.unwatch(s)
		return wrap(err)
	}
	return nil
}

// Unwatch implements driver.HandoffWatcher.
func (l *listener) Unwatch(ctx context.Context, key string) error {
	l.mu.Lock()
	s := l.subs[key]
	l.mu.Unlock()
	if s != nil {
		l.unwatch(s)
	}
	return nil
}

// unwatch undoes one Watch of s.
func (l *listener) unwatch(s *subscription) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s.watched > 0 {
		s.watched--
		if s.watched == 0 {
			close(s.kick)
			s.kick = make(chan struct{})
		}
	}
}

// Unsubscribe implements driver.Listener.
func (l *listener) Unsubscribe(ctx context.Context, key string) error {
	l.mu.Lock()
	s := l.subs[key]
	if s == nil {
		l.mu.Unlock()
		return nil
	}
	if s.n--; s.n > 0 {
		l.mu.Unlock()
		return nil
	}
	delete(l.subs, key)
	l.mu.Unlock()
	s.cancel()
	select {
	case <-s.done:
	case <-ctx.Done():
	}
	return nil
}

// Close implements driver.Listener: it ends every watch and waits for
// their goroutines.
func (l *listener) Close() error {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.cancel()
	l.wg.Wait()
	return nil
}
