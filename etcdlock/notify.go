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

// watch runs the watch of key until ctx ends, and watches again (after
// telling the client that it may have missed releases) when etcd ends it.
// The first creation's outcome goes to created.
//
// It reads the lock's directory first and watches from the revision after
// that read, keeping the lock's state (whether it has an exclusive holder,
// and its fair queue) up to date with the events, so that a release can
// name the queue's head as next: only that waiter is woken.
func (l *listener) watch(ctx context.Context, key string, s *subscription, created chan<- error) {
	defer l.wg.Done()
	defer close(s.done)
	dir := l.b.dir(key)
	backoff := 10 * time.Millisecond
	for ctx.Err() == nil {
		st, rev, err := l.read(ctx, dir)
		ok := false
		if err == nil {
			wch := l.b.c.Watch(ctx, dir, clientv3.WithPrefix(), clientv3.WithCreatedNotify(), clientv3.WithRev(rev+1))
			for resp := range wch {
				if resp.Created {
					if created != nil {
						created <- nil
						created = nil
					}
					ok = true
					continue
				}
				if err := resp.Err(); err != nil || resp.Canceled {
					break
				}
				for _, ev := range resp.Events {
					if next, wake := st.apply(l.b, ev); wake {
						l.fn(key, next)
					}
				}
				l.b.setHint(key, st.headHint())
			}
		}
		if ctx.Err() != nil {
			break
		}
		if created != nil && !ok {
			// Not created: let Subscribe fail rather than wait.
			if err == nil {
				err = errors.New("watch not created")
			}
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

// read returns the state of the lock whose directory is dir, and the
// revision it was read at.
func (l *listener) read(ctx context.Context, dir string) (*lockState, int64, error) {
	resp, err := l.b.c.Get(ctx, dir, clientv3.WithPrefix())
	if err != nil {
		return nil, 0, err
	}
	st := &lockState{queue: make(map[string]*mvccpb.KeyValue)}
	for _, kv := range resp.Kvs {
		st.apply(l.b, &clientv3.Event{Type: mvccpb.PUT, Kv: kv})
	}
	return st, resp.Header.Revision, nil
}

// lockState is what a Listener knows of one lock: whether it has an
// exclusive holder, and its fair queue (token → the entry's latest write).
type lockState struct {
	excl  bool
	queue map[string]*mvccpb.KeyValue
}

// head returns the token at the head of the queue, or "".
func (st *lockState) head() string {
	head, at := "", int64(0)
	for token, kv := range st.queue {
		if head == "" || kv.CreateRevision < at {
			head, at = token, kv.CreateRevision
		}
	}
	return head
}

// headHint returns the head of the queue for a release to hand the lock
// to (see lastHold), or nil.
func (st *lockState) headHint() *headHint {
	token := st.head()
	if token == "" {
		return nil
	}
	kv := st.queue[token]
	return &headHint{token: token, createRev: kv.CreateRevision, lease: kv.Lease, value: kv.Value}
}

// apply updates st with ev and says whether it wakes the lock's waiters,
// and whom: next is the queue's head when the lock is left free to it, ""
// for everyone.
func (st *lockState) apply(b *Backend, ev *clientv3.Event) (next string, wake bool) {
	_, kind, token, ok := b.parseKey(string(ev.Kv.Key))
	if !ok {
		return "", false
	}
	put := ev.Type == mvccpb.PUT
	switch kind {
	case exclSuffix:
		st.excl = put
		if !put {
			return st.head(), true
		}
		// A grant that a release handed to the queue's head (see
		// lastHold): its fence is this write's revision.
		if e := decodeExclusive(ev.Kv.Value); e.fence == fencePending {
			return driver.Handoff{Token: e.token, Fence: uint64(ev.Kv.ModRevision)}.Next(), true
		}
	case queueInfix[:1]:
		if put {
			st.queue[token] = ev.Kv
			return "", false
		}
		wasHead := st.head() == token
		delete(st.queue, token)
		if wasHead && !st.excl {
			return st.head(), true
		}
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
