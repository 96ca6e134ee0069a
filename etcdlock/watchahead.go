// What a queued waiter watches: the entry ahead of it, the lock coming
// free, or the lock's whole directory, and the lock state those watches
// follow.

package etcdlock

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/driver"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// followAhead waits while token's entry of create revision at has an entry
// ahead of it, watching that entry alone, until it goes (false, with
// aheadGone), changed or kick is closed (false), or the token heads the
// queue (true). When watched (driver.HandoffWatcher) it watches the
// holder's key's writes too, to report handoffs.
//
// After the entry ahead went (wasHead: the last call returned aheadGone),
// the token most likely heads the queue: it reads the queue's two oldest
// entries instead of the one ahead of its own, and when it heads the
// queue, next is the entry behind it (nil: none) for watchDir, which then
// reads no queue; a new head reads the queue once, as a waiter of
// concurrency.Mutex does. Otherwise (and on a waiter's first call: most
// are not the head) it reads the entry ahead of its own.
func (l *listener) followAhead(ctx context.Context, key, token string, at int64, wasHead, watched bool, changed, kick <-chan struct{}) (head bool, next **headHint, aheadGone bool, err error) {
	qp, qk := l.b.queuePrefix(key), l.b.queueKey(key, token)
	aheadOp := clientv3.OpGet(qp, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithMaxCreateRev(at-1), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(1))
	if wasHead {
		aheadOp = clientv3.OpGet(qp, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(2))
	}
	resp, err := l.b.c.Txn(ctx).Then(aheadOp, clientv3.OpGet(qk, clientv3.WithKeysOnly()), clientv3.OpGet(l.b.exclKey(key))).Commit()
	if err != nil {
		return false, nil, false, err
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
		return false, nil, false, nil
	}
	ahead := rangeKVs(resp, 0)
	if wasHead {
		// The two oldest: the token heads the queue, or is second, or
		// neither (read the entry ahead of it).
		switch {
		case len(ahead) > 0 && string(ahead[0].Key) == qk:
			n := l.b.headOf(ahead[1:])
			if n != nil {
				n.skip, n.skipRev = token, at
			}
			return true, &n, false, nil
		case len(ahead) > 1 && string(ahead[1].Key) == qk:
			ahead = ahead[:1]
		default:
			return l.followAhead(ctx, key, token, at, false, watched, changed, kick)
		}
	}
	if len(ahead) == 0 {
		return true, nil, false, nil
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
		return false, nil, false, err
	}
	// Still there once watched: its delete is delivered.
	if n, err := l.b.c.Get(ctx, ak, clientv3.WithCountOnly()); err != nil {
		return false, nil, false, err
	} else if n.Count == 0 {
		return false, nil, true, nil
	}
	st := &lockState{}
	for {
		select {
		case <-changed:
			return false, nil, false, nil
		case <-kick:
			return false, nil, false, nil
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil || wr.Canceled {
				return false, nil, false, errWatchEnded
			}
			if len(wr.Events) > 0 {
				return false, nil, true, nil // the entry ahead is gone: look again
			}
		case wr, ok := <-hch:
			if !ok || wr.Err() != nil || wr.Canceled {
				return false, nil, false, errWatchEnded
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
// everyone: it may have come between the two watches. A non-nil next is
// the entry behind the token's as followAhead read it (*next nil: none);
// then watchDir reads no queue.
func (l *listener) watchDir(ctx context.Context, key, token string, from int64, next **headHint, changed, kick <-chan struct{}) error {
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
	// The entry behind the token's is a hint only (a release checks
	// it): read before the watch, by followAhead, it does as well.
	ops := []clientv3.Op{
		clientv3.OpGet(l.b.exclKey(key)),
		clientv3.OpGet(l.b.releasedKey(key, forcedToken), clientv3.WithKeysOnly()),
	}
	if next == nil {
		ops = append(ops, clientv3.OpGet(l.b.queuePrefix(key), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(2)))
	}
	resp, err := l.b.c.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return err
	}
	st := &lockState{head: token}
	if next != nil {
		st.next = *next
	} else {
		q := rangeKVs(resp, 2)
		var skipRev int64
		if len(q) > 0 && string(q[0].Key) == l.b.queueKey(key, token) {
			skipRev, q = q[0].CreateRevision, q[1:]
		}
		st.next = l.b.headOf(q[:min(len(q), 1)]) // nil: nobody else queued
		if st.next != nil && skipRev != 0 {
			st.next.skip, st.next.skipRev = token, skipRev
		}
	}
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
