package etcdlock

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/dlock-go/dlock/driver"
	"go.etcd.io/etcd/api/v3/mvccpb"
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
		return errors.New("etcdlock: subscribe on a closed listener")
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
		return wrap("subscribe", key, err)
	case <-ctx.Done():
		l.drop(key, s)
		return wrap("subscribe", key, ctx.Err())
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
			var head bool
			head, err = l.followAhead(ctx, key, token, at, watched, changed, kick)
			if err == nil && head {
				err = l.watchDir(ctx, key, token, from, changed, kick)
			}
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

// followAhead waits while token's entry of create revision at has an entry
// ahead of it, watching that entry alone, until it goes (false), changed
// or kick is closed (false), or the token heads the queue (true). When
// watched (driver.HandoffWatcher) it watches the holder's key's writes
// too, to report handoffs.
func (l *listener) followAhead(ctx context.Context, key, token string, at int64, watched bool, changed, kick <-chan struct{}) (head bool, err error) {
	resp, err := l.b.c.Txn(ctx).Then(
		clientv3.OpGet(l.b.queuePrefix(key), clientv3.WithPrefix(), clientv3.WithKeysOnly(),
			clientv3.WithMaxCreateRev(at-1), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(1)),
		clientv3.OpGet(l.b.queueKey(key, token), clientv3.WithKeysOnly()),
		clientv3.OpGet(l.b.exclKey(key)),
	).Commit()
	if err != nil {
		return false, err
	}
	if mine := rangeKVs(resp, 1); len(mine) == 0 || mine[0].CreateRevision != at {
		// The token left that place: a release handed it the lock (and
		// deleted the entry) since the entry ahead went, which is
		// announced here, as no watch of this Listener saw it; or its
		// entry lapsed, and its next request queues it again, or finds
		// its grant.
		if excl := rangeKVs(resp, 2); len(excl) == 1 && decodeExclusive(excl[0].Value).token == token {
			st := &lockState{}
			if next, wake := st.apply(l.b, key, &clientv3.Event{Type: mvccpb.PUT, Kv: excl[0]}); wake {
				l.fn(key, next)
			}
		}
		l.b.dropQueued(key, token, at)
		return false, nil
	}
	ahead := rangeKVs(resp, 0)
	if len(ahead) == 0 {
		return true, nil
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ak := string(ahead[0].Key)
	wch := l.b.c.Watch(wctx, ak, clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	var hch clientv3.WatchChan // nil unless watched: never ready
	if watched {
		hch = l.b.c.Watch(wctx, l.b.exclKey(key), clientv3.WithFilterDelete())
	}
	if _, err := awaitCreated(ctx, wch); err != nil {
		return false, err
	}
	// Still there once watched: its delete is delivered.
	if n, err := l.b.c.Get(ctx, ak, clientv3.WithCountOnly()); err != nil {
		return false, err
	} else if n.Count == 0 {
		return false, nil
	}
	st := &lockState{}
	for {
		select {
		case <-changed:
			return false, nil
		case <-kick:
			return false, nil
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil || wr.Canceled {
				return false, errWatchEnded
			}
			if len(wr.Events) > 0 {
				return false, nil // the entry ahead is gone: look again
			}
		case wr, ok := <-hch:
			if !ok || wr.Err() != nil || wr.Canceled {
				return false, errWatchEnded
			}
			for _, ev := range wr.Events {
				if next, wake := st.apply(l.b, key, ev); wake && next != "" {
					l.fn(key, next) // a handoff
				}
			}
		}
	}
}

// watchFree watches, for a Listener whose Backend has no token queued for
// key, the deletes of the holder's key, of shared holds and of writer
// intents, and the forced-release record, until changed or kick is closed
// (nil) or a watch ends (an error). When watched (driver.HandoffWatcher)
// it watches every write of the holder's key, to report handoffs. It
// confirms c once the watches are made, and returns the revision from
// which it saw every event.
func (l *listener) watchFree(ctx context.Context, key string, watched bool, changed, kick <-chan struct{}, c *confirmer) (int64, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	exclOpts := []clientv3.OpOption{clientv3.WithCreatedNotify()}
	if !watched {
		exclOpts = append(exclOpts, clientv3.WithFilterPut())
	}
	chans := []clientv3.WatchChan{
		l.b.c.Watch(wctx, l.b.exclKey(key), exclOpts...),
		l.b.c.Watch(wctx, l.b.sharedPrefix(key), clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithCreatedNotify()),
		l.b.c.Watch(wctx, l.b.intentPrefix(key), clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithCreatedNotify()),
		l.b.c.Watch(wctx, l.b.releasedKey(key, forcedToken), clientv3.WithFilterDelete(), clientv3.WithCreatedNotify()),
	}
	var from int64
	for _, ch := range chans {
		rev, err := awaitCreated(ctx, ch)
		if err != nil {
			return 0, err
		}
		from = max(from, rev)
	}
	c.ok()
	st := &lockState{}
	for {
		var (
			wr clientv3.WatchResponse
			ok bool
		)
		select {
		case <-changed:
			return from, nil
		case <-kick:
			return from, nil
		case wr, ok = <-chans[0]:
		case wr, ok = <-chans[1]:
		case wr, ok = <-chans[2]:
		case wr, ok = <-chans[3]:
		}
		if !ok || wr.Err() != nil || wr.Canceled {
			return 0, errWatchEnded
		}
		for _, ev := range wr.Events {
			if next, wake := st.apply(l.b, key, ev); wake {
				l.fn(key, next)
			}
		}
	}
}

// watchDir watches the lock's directory, for a Listener whose Backend's
// token heads the queue, until changed or kick is closed (nil) or the
// watch ends (an error). A release that leaves the lock free names the
// token. A forced release recorded after from (the revision since which
// an earlier watch of this subscription saw every event, or 0) wakes
// everyone: it may have come between the two watches.
func (l *listener) watchDir(ctx context.Context, key, token string, from int64, changed, kick <-chan struct{}) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := l.b.c.Watch(wctx, l.b.dir(key), clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	if _, err := awaitCreated(ctx, wch); err != nil {
		return err
	}
	// Read once watched: the events after the read replayed on its state
	// may wake for nothing, never miss a wake-up.
	// It reads the queue's two oldest entries too: the oldest but the
	// token's is the head that the token's grant, once handed to it,
	// hands the lock to next (see lockState.next).
	resp, err := l.b.c.Txn(ctx).Then(
		clientv3.OpGet(l.b.exclKey(key)),
		clientv3.OpGet(l.b.releasedKey(key, forcedToken), clientv3.WithKeysOnly()),
		clientv3.OpGet(l.b.queuePrefix(key), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(2)),
	).Commit()
	if err != nil {
		return err
	}
	q := rangeKVs(resp, 2)
	if len(q) > 0 && string(q[0].Key) == l.b.queueKey(key, token) {
		q = q[1:]
	}
	st := &lockState{head: token, next: l.b.headOf(q[:min(len(q), 1)])} // nil: nobody else queued
	if excl := rangeKVs(resp, 0); len(excl) == 1 {
		// Held, or handed to the token before the watch: then announced
		// as the watch would have.
		if next, wake := st.apply(l.b, key, &clientv3.Event{Type: mvccpb.PUT, Kv: excl[0]}); wake {
			l.fn(key, next)
		}
	} else {
		l.fn(key, token) // the head, and the lock free: nobody will release it
	}
	if forced := rangeKVs(resp, 1); from > 0 && len(forced) == 1 && forced[0].ModRevision > from {
		l.fn(key, "")
	}
	for {
		select {
		case <-changed:
			return nil
		case <-kick:
			return nil
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil || wr.Canceled {
				return errWatchEnded
			}
			for _, ev := range wr.Events {
				if next, wake := st.apply(l.b, key, ev); wake {
					l.fn(key, next)
				}
			}
		}
	}
}

// lockState is what a Listener knows of one lock: whether it has an
// exclusive holder, and this Backend's token at the head of its queue, if
// any.
type lockState struct {
	excl bool
	head string
	// next is the entry behind head in the queue, as last read (nil for
	// none, unknownHead when not read): when a release hands head the
	// lock, it is the Backend's guess of the new head (see guess).
	next *headHint
}

// apply updates st with ev and says whether it wakes the lock's waiters,
// and whom: next is this Backend's head when the lock is left free to it,
// a handoff, or "" for everyone.
func (st *lockState) apply(b *Backend, key string, ev *clientv3.Event) (next string, wake bool) {
	_, kind, token, ok := b.parseKey(string(ev.Kv.Key))
	if !ok {
		return "", false
	}
	put := ev.Type == mvccpb.PUT
	switch kind {
	case exclSuffix:
		st.excl = put
		if !put {
			return st.head, true
		}
		// A grant that a release handed to the queue's head (see
		// lastHold): its fence is this write's revision.
		if e := decodeExclusive(ev.Kv.Value); e.fence == fencePending {
			if b.isQueued(key, e.token) {
				b.trackHanded(key, e.token, ev.Kv)
				b.setQueued(key, e.token, 0)
				next := unknownHead
				if e.token == st.head {
					next = st.next
				}
				b.setHint(key, next)
			}
			return driver.Handoff{Token: e.token, Fence: uint64(ev.Kv.ModRevision)}.Next(), true
		}
	case queueInfix[:1]:
		// A waiter's entry gone while the lock is free: the head may have
		// changed. Entries written (new waiters) wake nobody.
		return st.head, !put && !st.excl
	case releasedInfix[:1]:
		// A forced release (see forcedMark): everyone.
		return "", put && token == forcedToken
	case sharedInfix[:1], intentInfix[:1]:
		// A released reader or permit, a writer intent gone: everyone.
		return "", !put
	}
	return "", false
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
		return errors.New("etcdlock: watch of a key not subscribed")
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
		err = errors.New("etcdlock: subscription ended")
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		l.unwatch(s)
		return wrap("watch", key, err)
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
