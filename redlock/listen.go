package redlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
)

// Backoff between the attempts to subscribe on a node that failed.
const (
	minResubscribeDelay = 25 * time.Millisecond
	maxResubscribeDelay = time.Second
)

// resubscribeWait bounds an attempt after the first to subscribe on a node
// (see subscribeNode). Nobody waits on it, and the node's listener keeps a
// subscription it has sent (resubscribing it when it reconnects) until it is
// confirmed; an attempt that gave up at the call limit would only leave that
// subscription without a holder during the backoff, to be undone when its
// confirmation comes in. So on a node that confirms later than the call
// limit (a loaded machine, a long link), attempts bounded by it would make
// and undo the subscription again and again, and never keep it.
const resubscribeWait = 30 * time.Second

// Listen opens one notification stream per node (redislock.Backend.Listen)
// and fans them in: fn(key, next) is called when a release of key is
// published on any node, and fn("", "") when any node's stream may have
// missed releases.
//
// One release is published on every node where it released, a moment apart.
// Calling fn for each copy would send a waiter at the lock again and again,
// and its first try could come before a quorum had let go. So the copies are
// merged: fn(key, next) is called once every node has announced a release
// of key, or one coalescing window (a tenth of the node timeout, at least
// 1ms) after the first announcement, whichever comes first. No announcement
// goes unanswered: each is followed by fn(key, next) within the window.
// next is the waiter the nodes' copies named, or "" (anyone may try) when
// they named none or differ; Redlock keeps no fair queues, so its own
// releases name none. ctx bounds only the call.
func (b *Backend) Listen(ctx context.Context, fn func(key, next string)) (driver.Listener, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("redlock: listen: %w", err)
	}
	if fn == nil {
		return nil, errors.New("redlock: listen: nil callback")
	}
	l := &listener{b: b, subs: make(map[string][]*subscription)}
	l.ctx, l.cancel = context.WithCancel(context.WithoutCancel(ctx))
	l.fanIn = &fanIn{fn: fn, n: len(b.nodes), window: max(b.opts.nodeTimeout/10, time.Millisecond), pending: make(map[string]*announced)}
	for _, n := range b.nodes {
		nl, err := n.b.Listen(ctx, func(key, next string) { l.fanIn.announce(n.index, key, next) })
		if err != nil {
			_ = l.Close()
			return nil, fmt.Errorf("redlock: listen: %w", n.nodeError(err))
		}
		l.nodes = append(l.nodes, nl)
	}
	return l, nil
}

// listener is the driver.Listener of a Backend: one listener per node.
type listener struct {
	b      *Backend
	nodes  []driver.Listener // by node index
	fanIn  *fanIn
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // subscribeNode goroutines

	mu     sync.Mutex
	subs   map[string][]*subscription // by key; one entry per successful Subscribe
	closed bool
}

// subscription is one Subscribe call: one subscription attempt per node.
type subscription struct {
	key    string
	ctx    context.Context // cancelled when the subscription is undone
	cancel context.CancelFunc
	first  chan answer[struct{}] // the outcome of each node's first attempt

	mu        sync.Mutex
	undone    bool
	confirmed []bool // by node: subscribed, and to be unsubscribed by undo
}

// Subscribe subscribes to key's releases on every node at once and returns
// once a quorum of nodes has confirmed. A release that frees the lock is
// made on at least a quorum of nodes, and every two quorums share a node,
// so a waiter subscribed on a quorum hears of it. The nodes that have not
// confirmed keep trying in the background, with a backoff, until
// Unsubscribe or Close. When a quorum cannot confirm (the error is then a
// *QuorumError, Op "subscribe") or ctx ends first (the error wraps ctx's),
// the subscriptions made are undone and no Unsubscribe is needed. After
// Close the error wraps redis.ErrClosed.
func (l *listener) Subscribe(ctx context.Context, key string) error {
	n := len(l.b.nodes)
	s := &subscription{key: key, first: make(chan answer[struct{}], n), confirmed: make([]bool, n)}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return fmt.Errorf("redlock: subscribe %q: %w", key, redis.ErrClosed)
	}
	s.ctx, s.cancel = context.WithCancel(l.ctx)
	for i := range l.nodes {
		l.wg.Add(1)
		go l.subscribeNode(s, i)
	}
	l.mu.Unlock()

	q := l.b.Quorum()
	ok, pending := 0, n
	var errs []*NodeError
	for ok < q && ok+pending >= q {
		select {
		case a := <-s.first:
			pending--
			if a.err != nil {
				errs = append(errs, a.node.nodeError(a.err))
			} else {
				ok++
			}
		case <-ctx.Done():
			_ = l.undo(s)
			return fmt.Errorf("redlock: subscribe %q: %w", key, ctx.Err())
		}
	}
	if ok < q {
		_ = l.undo(s)
		return l.b.quorumError(ctx, "subscribe", key, ok, errs)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("redlock: subscribe %q: %w", key, redis.ErrClosed)
	}
	l.subs[key] = append(l.subs[key], s)
	return nil
}

// subscribeNode subscribes s on node i, trying again until it is confirmed,
// s is undone or the listener closed. It reports the first attempt's
// outcome, which Subscribe may wait on: that attempt is bounded by the call
// limit, the ones after it, in the background, by resubscribeWait.
func (l *listener) subscribeNode(s *subscription, i int) {
	defer l.wg.Done()
	nl, n := l.nodes[i], l.b.nodes[i]
	for attempt := 1; ; attempt++ {
		limit := l.b.callLimit()
		if attempt > 1 {
			limit = max(limit, resubscribeWait)
		}
		actx, cancel := context.WithTimeout(s.ctx, limit)
		err := nl.Subscribe(actx, s.key)
		cancel()
		s.mu.Lock()
		undone := s.undone
		if err == nil && !undone {
			s.confirmed[i] = true
		}
		s.mu.Unlock()
		if err == nil && undone {
			// Confirmed after the subscription was undone: undo this node.
			uctx, cancel := context.WithTimeout(context.Background(), l.b.callLimit())
			_ = nl.Unsubscribe(uctx, s.key)
			cancel()
		}
		if attempt == 1 {
			s.first <- answer[struct{}]{node: n, err: err}
		}
		if err == nil || undone || errors.Is(err, driver.ErrNotifyRefused) || !sleep(s.ctx, resubscribeDelay(attempt)) {
			return // a node whose ACL refuses the channel will not change its mind
		}
	}
}

// undo cancels the node attempts of s still running and unsubscribes the
// nodes that confirmed.
func (l *listener) undo(s *subscription) error {
	s.mu.Lock()
	s.undone = true
	confirmed := slices.Clone(s.confirmed)
	s.mu.Unlock()
	s.cancel()
	var errs []error
	for i, ok := range confirmed {
		if !ok {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), l.b.callLimit())
		if err := l.nodes[i].Unsubscribe(ctx, s.key); err != nil {
			errs = append(errs, l.b.nodes[i].nodeError(err))
		}
		cancel()
	}
	return errors.Join(errs...)
}

// Unsubscribe undoes one Subscribe of key: it stops the nodes still trying
// and unsubscribes every node that confirmed. After Close it does nothing.
func (l *listener) Unsubscribe(ctx context.Context, key string) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	list := l.subs[key]
	if len(list) == 0 {
		l.mu.Unlock()
		return fmt.Errorf("redlock: unsubscribe %q: not subscribed", key)
	}
	s := list[len(list)-1]
	if len(list) == 1 {
		delete(l.subs, key)
	} else {
		l.subs[key] = list[:len(list)-1]
	}
	l.mu.Unlock()
	if err := ctx.Err(); err != nil {
		// Undo anyway: a subscription must not outlive its Unsubscribe.
		_ = l.undo(s)
		return fmt.Errorf("redlock: unsubscribe %q: %w", key, err)
	}
	if err := l.undo(s); err != nil {
		return fmt.Errorf("redlock: unsubscribe %q: %w", key, err)
	}
	return nil
}

// Close closes every node's stream and waits for the listener's goroutines;
// fn is not called after Close returns. Closing twice is a no-op.
func (l *listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.mu.Unlock()
	l.cancel()
	var errs []error
	for i, nl := range l.nodes {
		if err := nl.Close(); err != nil {
			errs = append(errs, l.b.nodes[i].nodeError(err))
		}
	}
	l.wg.Wait()
	l.fanIn.close()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("redlock: close listener: %w", err)
	}
	return nil
}

// resubscribeDelay is the pause after the n-th failed attempt in a row.
func resubscribeDelay(n int) time.Duration {
	d := minResubscribeDelay
	for i := 1; i < n && d < maxResubscribeDelay; i++ {
		d *= 2
	}
	return min(d, maxResubscribeDelay)
}

// sleep waits for d, or reports false when ctx ends first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// fanIn merges the nodes' announcements of one release into one call of fn.
type fanIn struct {
	fn     func(key, next string)
	n      int           // nodes
	window time.Duration // longest wait for the other nodes' copies

	mu      sync.Mutex // held while fn runs, so that close waits for it
	closed  bool
	pending map[string]*announced
}

// announced is a release of one key announced by some nodes, not yet passed on.
type announced struct {
	nodes []bool
	count int
	next  string // the waiter the copies named; "" once they differ
	timer *time.Timer
}

// announce handles node's announcement of a release of key naming next
// (key "" from one node's stream: releases may have been missed, passed on
// at once).
func (f *fanIn) announce(node int, key, next string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	if key == "" {
		f.fn("", "")
		return
	}
	a := f.pending[key]
	if a != nil && a.nodes[node] {
		// A second release on the same node: pass the first on now.
		f.fire(key, a)
		a = nil
	}
	if a == nil {
		a = &announced{nodes: make([]bool, f.n), next: next}
		f.pending[key] = a
		a.timer = time.AfterFunc(f.window, func() { f.expire(key, a) })
	} else if a.next != next {
		a.next = "" // the nodes disagree: let every waiter try
	}
	a.nodes[node] = true
	a.count++
	if a.count == f.n {
		f.fire(key, a)
	}
}

// fire passes a on; f.mu is held.
func (f *fanIn) fire(key string, a *announced) {
	a.timer.Stop()
	delete(f.pending, key)
	f.fn(key, a.next)
}

// expire passes a on when the window has passed without every node's copy.
func (f *fanIn) expire(key string, a *announced) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.closed && f.pending[key] == a {
		f.fire(key, a)
	}
}

// close stops the timers; fn is not called afterwards.
func (f *fanIn) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	for _, a := range f.pending {
		a.timer.Stop()
	}
	f.pending = nil
}
