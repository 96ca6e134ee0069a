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
	s := &subscription{n: 1, cancel: cancel, done: make(chan struct{})}
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
// entry among them, wake nobody. Otherwise (no token queued, or the
// token heads the queue) it watches the lock's directory: a release, a
// handoff, an expiry, a forced release, a shared hold or writer intent
// gone. A watch that etcd ends (no leader, compaction) is made again,
// after telling the client that it may have missed releases.
func (l *listener) watch(ctx context.Context, key string, s *subscription, created chan<- error) {
	defer l.wg.Done()
	defer close(s.done)
	backoff := 10 * time.Millisecond
	for ctx.Err() == nil {
		token, at, changed := l.b.oldestQueued(key)
		var err error
		if token != "" {
			var head bool
			head, err = l.followAhead(ctx, key, token, at, changed, &created)
			if err == nil && !head {
				continue // the entry ahead went, or the token's place changed
			}
		}
		if err == nil {
			err = l.watchDir(ctx, key, token, changed, &created)
		}
		if ctx.Err() != nil {
			break
		}
		if err == nil {
			continue // the token's place changed: watch anew
		}
		if created != nil {
			// Not created: let Subscribe fail rather than wait.
			created <- err
			return
		}
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
	if created != nil {
		created <- ctx.Err()
	}
}

// confirm tells Subscribe that its key is watched, once the read that a
// watch starts after is done: the watch delivers every event after that
// read's revision, whenever etcd creates it, and a watch that fails is
// reported as missed releases (fn("", "")).
func confirm(created *chan<- error) {
	if *created != nil {
		*created <- nil
		*created = nil
	}
}

// errWatchEnded reports a watch that etcd ended or never created.
var errWatchEnded = errors.New("watch ended")

// followAhead waits while token's entry of create revision at has an entry
// ahead of it, watching that entry alone, until it goes (false), changed
// is closed (false), or the token heads the queue (true). A head that
// finds the lock free is woken: nobody may release it to it.
func (l *listener) followAhead(ctx context.Context, key, token string, at int64, changed <-chan struct{}, created *chan<- error) (head bool, err error) {
	resp, err := l.b.c.Txn(ctx).Then(
		clientv3.OpGet(l.b.queuePrefix(key), clientv3.WithPrefix(), clientv3.WithKeysOnly(),
			clientv3.WithMaxCreateRev(at-1), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(1)),
		clientv3.OpGet(l.b.queueKey(key, token), clientv3.WithKeysOnly()),
	).Commit()
	if err != nil {
		return false, err
	}
	if mine := rangeKVs(resp, 1); len(mine) == 0 || mine[0].CreateRevision != at {
		// The token left that place (its entry lapsed): its next request
		// queues it again, or finds its grant.
		l.b.dropQueued(key, token, at)
		return false, nil
	}
	ahead := rangeKVs(resp, 0)
	if len(ahead) == 0 {
		return true, nil
	}
	confirm(created)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := l.b.c.Watch(wctx, string(ahead[0].Key), clientv3.WithFilterPut(), clientv3.WithCreatedNotify(), clientv3.WithRev(resp.Header.Revision+1))
	for {
		select {
		case <-changed:
			return false, nil
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil || wr.Canceled {
				return false, errWatchEnded
			}
			if wr.Created {
				continue
			}
			if len(wr.Events) > 0 {
				return false, nil // the entry ahead is gone: look again
			}
		}
	}
}

// watchDir watches the lock's directory until changed is closed (nil) or
// the watch ends (an error). token, when set, is this Backend's token at
// the head of the queue: a release that leaves the lock free names it.
func (l *listener) watchDir(ctx context.Context, key, token string, changed <-chan struct{}, created *chan<- error) error {
	resp, err := l.b.c.Get(ctx, l.b.exclKey(key), clientv3.WithKeysOnly())
	if err != nil {
		return err
	}
	st := &lockState{excl: len(resp.Kvs) == 1, head: token}
	if token != "" && !st.excl {
		l.fn(key, token) // the head, and the lock free: nobody will release it
	}
	confirm(created)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := l.b.c.Watch(wctx, l.b.dir(key), clientv3.WithPrefix(), clientv3.WithCreatedNotify(), clientv3.WithRev(resp.Header.Revision+1))
	for {
		select {
		case <-changed:
			return nil
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil || wr.Canceled {
				return errWatchEnded
			}
			if wr.Created {
				continue
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
				b.setQueued(key, e.token, 0)
				b.setHint(key, unknownHead)
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
