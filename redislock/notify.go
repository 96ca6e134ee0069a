package redislock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
)

// Backoff between attempts to reach Redis while the notification connection
// is down. go-redis reconnects on the first attempt; these only pace retries
// while Redis stays unreachable.
const (
	minReconnectDelay = 25 * time.Millisecond
	maxReconnectDelay = time.Second
)

// Listen opens one pub/sub connection on which every key the dlock client
// waits on is multiplexed, and one goroutine that reads it and calls fn with
// the key of each release and the waiter it names: the token at the head of
// the lock's fair queue when the release left the lock free with a live
// queue, else "" (any waiter). fn is called with ("", "") when releases may
// have been missed: when the connection fails, and again once it is back
// and resubscribed (go-redis resubscribes by itself). fn must not block.
//
// ctx bounds only the call; the stream lives until Listener.Close. The
// goroutine connects in the background, so Listen does not fail when Redis
// is down: the stream keeps trying, and Subscribe reports the error.
//
// On a Cluster, where releases are announced with SPUBLISH on the master of
// the lock's slot, the stream is one SSUBSCRIBE connection per master that
// serves a key being waited on. fn is called with "" when one of them
// fails, and with a key when its subscription has been taken up again after
// a failure or after its slot moved to another master (Redis tells
// subscribers with an unsolicited "sunsubscribe"), since a release may have
// been missed meanwhile; next is "" then.
func (b *Backend) Listen(ctx context.Context, fn func(key, next string)) (driver.Listener, error) {
	if b.err != nil {
		return nil, b.err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("redislock: listen: %w", err)
	}
	if fn == nil {
		return nil, errors.New("redislock: listen: nil callback")
	}
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	if cc, ok := b.rdb.(*redis.ClusterClient); ok && b.sharded {
		return b.listenSharded(lctx, cancel, cc, fn), nil
	}
	l := &listener{
		b:      b,
		fn:     fn,
		ctx:    lctx,
		cancel: cancel,
		ps:     b.rdb.Subscribe(lctx),
		subs:   make(map[string]*subscription),
	}
	l.wg.Add(1)
	go l.receive()
	return l, nil
}

// listener is the driver.Listener of a Backend.
type listener struct {
	b      *Backend
	fn     func(key, next string)
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	ps     *redis.PubSub
	wg     sync.WaitGroup // the receive goroutine

	// mu orders SUBSCRIBE and UNSUBSCRIBE writes with the bookkeeping below,
	// so that the server sees them in the order the map changed.
	mu     sync.Mutex
	subs   map[string]*subscription // by channel
	closed bool
	// refused is Redis's answer when it refused a SUBSCRIBE for lack of
	// rights (see refuse); Subscribe fails with it from then on.
	refused error
}

// subscription is one subscribed channel. Its SUBSCRIBE is never followed by
// an UNSUBSCRIBE before the server has confirmed it, so the next "subscribe"
// confirmation for the channel answers that SUBSCRIBE, or go-redis's
// resubscription after a reconnect, which is as good.
//
// One race remains: go-redis resubscribes on a new connection before this
// listener learns of the reconnect, so if within that round trip the channel
// is unsubscribed and subscribed again, the resubscription's confirmation
// can release the new Subscribe a moment before the server runs it. The cost
// is at most one missed wake-up, which the client's retry timer covers.
type subscription struct {
	key       string
	refs      int           // Subscribe calls not yet undone
	ready     chan struct{} // closed once the server has confirmed, or refused
	confirmed bool
	err       error // set, before ready is closed, when the server refused
}

// Subscribe subscribes to key's release channel, or joins the subscription
// already made, and returns once Redis has confirmed it, so that a release
// after the caller's next failed acquire cannot be missed. The confirmation
// comes back through the receive goroutine; after a reconnect it is the one
// for go-redis's resubscription. Each successful Subscribe needs one
// Unsubscribe; a failed one needs none. It returns an error wrapping
// ctx.Err() when ctx ends first, redis.ErrClosed after Close, or the error
// of writing the command.
func (l *listener) Subscribe(ctx context.Context, key string) error {
	ch := l.b.channel(key)
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return fmt.Errorf("redislock: subscribe %q: %w", key, redis.ErrClosed)
	}
	if l.refused != nil {
		l.mu.Unlock()
		return refusedError(key, ch, l.refused)
	}
	s := l.subs[ch]
	if s == nil {
		if err := l.ps.Subscribe(ctx, ch); err != nil {
			// go-redis remembers the channel even when the write failed and
			// subscribes it again after a reconnect. That is harmless (a
			// release on a channel not in l.subs is ignored, and its
			// confirmation too), while an UNSUBSCRIBE here would wait, with
			// l.mu held, on the connection that just failed.
			l.mu.Unlock()
			return fmt.Errorf("redislock: subscribe %q: %w", key, err)
		}
		s = &subscription{key: key, ready: make(chan struct{})}
		l.subs[ch] = s
	}
	s.refs++
	ready := s.ready
	l.mu.Unlock()

	select {
	case <-ready:
		if s.err != nil {
			return refusedError(key, ch, s.err)
		}
		return nil
	case <-ctx.Done():
		_ = l.drop(context.WithoutCancel(ctx), ch)
		return fmt.Errorf("redislock: subscribe %q: %w", key, ctx.Err())
	case <-l.ctx.Done():
		return fmt.Errorf("redislock: subscribe %q: %w", key, redis.ErrClosed)
	}
}

// isNoPerm reports whether err is Redis refusing a command for lack of
// rights (an ACL error), as opposed to a failed connection.
func isNoPerm(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "NOPERM")
}

// refusedError is the error of a subscription to key (on channel ch) that
// Redis refused with err: it wraps driver.ErrNotifyRefused and says which
// ACL rule is missing.
func refusedError(key, ch string, err error) error {
	return fmt.Errorf("redislock: subscribe %q: %w: %w (the Redis user needs the channel rule &%s or allchannels, and SUBSCRIBE, SSUBSCRIBE and PUBLISH, SPUBLISH in its commands; see docs/REDIS.md)",
		key, driver.ErrNotifyRefused, err, channelPattern(ch))
}

// channelPattern is the ACL channel pattern that covers ch: the namespace
// followed by "*".
func channelPattern(ch string) string {
	if i := strings.Index(ch, ":{"); i >= 0 {
		return ch[:i] + ":*"
	}
	return ch
}

// refuse handles Redis's refusal of a SUBSCRIBE (NOPERM): the ACL rules are
// the same for every release channel, so every subscription not yet
// confirmed fails with it, and so will every later Subscribe.
func (l *listener) refuse(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refused = err
	for ch, s := range l.subs {
		if !s.confirmed {
			s.err = err
			close(s.ready)
			delete(l.subs, ch)
		}
	}
}

// Unsubscribe drops one subscription of key and sends UNSUBSCRIBE when it
// was the last. After Close it does nothing.
func (l *listener) Unsubscribe(ctx context.Context, key string) error {
	if err := l.drop(ctx, l.b.channel(key)); err != nil {
		return fmt.Errorf("redislock: unsubscribe %q: %w", key, err)
	}
	return nil
}

var errNotSubscribed = errors.New("not subscribed")

// drop undoes one Subscribe of channel ch.
func (l *listener) drop(ctx context.Context, ch string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	s := l.subs[ch]
	if s == nil || s.refs == 0 {
		return errNotSubscribed
	}
	s.refs--
	if s.refs > 0 || !s.confirmed {
		// An unconfirmed subscription stays until its confirmation
		// arrives; confirm unsubscribes it then if nobody came back.
		return nil
	}
	delete(l.subs, ch)
	return l.ps.Unsubscribe(ctx, ch)
}

// confirm handles the server's "subscribe" confirmation for channel ch.
func (l *listener) confirm(ch string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.subs[ch]
	if s == nil || s.confirmed {
		return // a resubscription after a reconnect
	}
	s.confirmed = true
	close(s.ready)
	if s.refs == 0 { // every waiter gave up before the confirmation
		delete(l.subs, ch)
		_ = l.ps.Unsubscribe(l.ctx, ch)
	}
}

// keyOf returns the subscribed key whose release channel is ch.
func (l *listener) keyOf(ch string) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.subs[ch]; s != nil {
		return s.key, true
	}
	return "", false
}

// receive reads the pub/sub connection until Close. It uses Receive rather
// than PubSub.Channel, which hides the subscription confirmations.
func (l *listener) receive() {
	defer l.wg.Done()
	failures := 0
	for {
		msg, err := l.ps.Receive(l.ctx)
		if err != nil {
			if l.ctx.Err() != nil {
				return // closed
			}
			if isNoPerm(err) {
				// The connection is fine; Redis refused a SUBSCRIBE.
				l.refuse(err)
				continue
			}
			// go-redis has reconnected, or will on the next Receive, and
			// resubscribes; releases published meanwhile are lost.
			if failures == 0 {
				l.fn("", "")
			}
			failures++
			if !l.sleep(reconnectDelay(failures)) {
				return
			}
			continue
		}
		if failures > 0 {
			// Back and resubscribed (Redis answers the resubscription
			// before anything else): retry every key once more, since a
			// release may have come between the failure and now.
			failures = 0
			l.fn("", "")
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				l.confirm(m.Channel)
			}
		case *redis.Message:
			if key, ok := l.keyOf(m.Channel); ok {
				l.fn(key, nextOf(m.Payload))
			}
		}
	}
}

// nextPrefix begins every release announcement; the rest is the token of
// the fair waiter the release lets in, or nothing when any waiter may try.
const nextPrefix = "next:"

// nextOf returns the waiter a release announcement names, or "" for any
// waiter, which is also the answer to a payload without nextPrefix (the
// lock's name, which releases of earlier versions published).
func nextOf(payload string) string {
	if next, ok := strings.CutPrefix(payload, nextPrefix); ok {
		return next
	}
	return ""
}

// reconnectDelay is the pause after the n-th failure in a row.
func reconnectDelay(n int) time.Duration {
	d := minReconnectDelay
	for i := 1; i < n && d < maxReconnectDelay; i++ {
		d *= 2
	}
	return min(d, maxReconnectDelay)
}

// sleep waits for d, or reports false if the listener is closed first.
func (l *listener) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-l.ctx.Done():
		return false
	}
}

// Close closes the pub/sub connection and waits for the receive goroutine;
// fn is not called after Close returns. Subscribe calls still waiting return
// an error wrapping redis.ErrClosed. Closing twice is a no-op.
func (l *listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.mu.Unlock()

	l.cancel()
	err := l.ps.Close()
	l.wg.Wait()
	if err != nil {
		return fmt.Errorf("redislock: close listener: %w", err)
	}
	return nil
}
