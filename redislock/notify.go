// Listen, and the release listener on one node or through Sentinel: one
// pub/sub connection (SUBSCRIBE), reconnected with backoff.

package redislock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
)

// The health check of a pub/sub connection, which may go half-open (a
// peer or a middlebox gone without a word: writes vanish and nothing comes
// back) while the command connections are fine: a connection that has
// delivered nothing for pingIdle is sent a PING, and one that then delivers
// nothing, PONG included, for pongWait more is taken for dead and replaced.
// A release announced on a half-open connection is thus noticed missed
// (fn("", "")) at most pingIdle+pongWait after the connection last
// delivered anything, plus the time to reconnect.
const (
	pingIdle = time.Second
	pongWait = 2 * time.Second
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
	l := &listener{b: b, fn: fn, ps: b.rdb.Subscribe(lctx)}
	l.setup(lctx, cancel, l)
	l.wg.Add(1)
	go l.receive()
	return l, nil
}

var (
	_ driver.HandoffWatcher = (*listener)(nil)
	_ driver.HandoffWatcher = (*shardedListener)(nil)
)

// listener is the driver.Listener of a Backend on one node or through
// Sentinel. Its wire writes SUBSCRIBE and UNSUBSCRIBE on the one pub/sub
// connection with the core's mu held, so that the server sees them in the
// order the table changed.
type listener struct {
	subscriptions[struct{}]
	b  *Backend
	fn func(key, next string)
	ps *redis.PubSub  // replaced by receive (see replace); guarded by mu
	wg sync.WaitGroup // the receive goroutine
}

// Subscribe subscribes to key's release channel, or joins the subscription
// already made, and returns once Redis has confirmed it, so that a release
// after the caller's next failed acquire cannot be missed. The confirmation
// comes back through the receive goroutine; after a reconnect it is the one
// for go-redis's resubscription. Each successful Subscribe needs one
// Unsubscribe; a failed one needs none. It returns an error wrapping
// ctx.Err() when ctx ends first, redis.ErrClosed after Close, or the error
// of writing the command.
//
// It subscribes the Backend's handoff channel of key too (see
// Backend.handoffChannel), in the same round trip: a release that hands
// the lock to a queue entry of this Backend publishes there alone.
func (l *listener) Subscribe(ctx context.Context, key string) error {
	return l.pair(ctx, key, l.b.channel(key), l.b.handoffChannel(key), func(ctx context.Context, key, ch string) (*subscription[struct{}], error) {
		s, _, err := l.join(ctx, key, ch)
		return s, err
	})
}

// Watch subscribes key's watch channel (see Backend.watchChannel), on
// which the handoffs of key to other Backends are announced too: see
// driver.HandoffWatcher. Counting and errors are as for Subscribe.
func (l *listener) Watch(ctx context.Context, key string) error {
	ch := l.b.watchChannel(key)
	s, _, err := l.join(ctx, key, ch)
	if err != nil {
		return err
	}
	return l.await(ctx, key, ch, s)
}

// Unwatch undoes one Watch of key.
func (l *listener) Unwatch(ctx context.Context, key string) error {
	return l.undo(ctx, "unwatch", key, l.b.watchChannel(key))
}

// start writes SUBSCRIBE ch (wire). l.mu is held.
func (l *listener) start(ctx context.Context, ch string, _ *subscription[struct{}]) error {
	// go-redis remembers the channel even when the write failed and
	// subscribes it again after a reconnect; confirmed unsubscribes it
	// then, since it is not in l.subs. An UNSUBSCRIBE here would wait,
	// with l.mu held, on the connection that just failed.
	return l.ps.Subscribe(ctx, ch)
}

// stop writes UNSUBSCRIBE ch (wire). l.mu is held.
func (l *listener) stop(ctx context.Context, ch string, _ *subscription[struct{}], _ bool) (<-chan error, error) {
	return nil, l.ps.Unsubscribe(ctx, ch)
}

// Unsubscribe drops one subscription of key and sends UNSUBSCRIBE when it
// was the last. After Close it does nothing.
func (l *listener) Unsubscribe(ctx context.Context, key string) error {
	return l.undo(ctx, "unsubscribe", key, l.b.channel(key), l.b.handoffChannel(key))
}

// confirmed handles the server's "subscribe" confirmation for channel ch.
// It returns the error of the UNSUBSCRIBE it wrote, if any: go-redis has
// then reconnected, or will, within that write, and receive treats it as a
// failure of the connection.
func (l *listener) confirmed(ch string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.subs[ch]
	switch {
	case s == nil:
		// Nobody holds ch: go-redis subscribed it again after a reconnect
		// although the SUBSCRIBE that first named it failed to be written
		// (see start), or just after it left the table. Unsubscribing
		// takes it off the server, and out of go-redis's list of channels
		// to resubscribe; a later Subscribe of ch writes its SUBSCRIBE
		// after this, with l.mu held.
		return l.ps.Unsubscribe(l.ctx, ch)
	case !s.confirmed:
		return l.confirm(ch, s)
	}
	return nil // a resubscription after a reconnect
}

// receive reads the pub/sub connection until Close. It uses ReceiveTimeout
// rather than PubSub.Channel, which hides the subscription confirmations,
// and health-checks the connection (see pingIdle).
func (l *listener) receive() {
	defer l.wg.Done()
	failures := 0
	// failed handles a failure of the connection: go-redis has reconnected,
	// or will on the next Receive, and resubscribes; releases published
	// meanwhile are lost. It reports false once the listener is closed.
	failed := func() bool {
		if failures == 0 {
			l.fn("", "")
		}
		failures++
		return l.sleep(reconnectDelay(failures))
	}
	pinged := false // a PING is out and nothing came back since
	for {
		l.mu.Lock()
		ps := l.ps
		l.mu.Unlock()
		wait := pingIdle
		if pinged {
			wait = pongWait
		}
		msg, err := ps.ReceiveTimeout(l.ctx, wait)
		if err != nil {
			if l.ctx.Err() != nil {
				return // closed
			}
			if isNoPerm(err) {
				// The connection is fine; Redis refused a SUBSCRIBE.
				l.refuse(err)
				continue
			}
			if isTimeout(err) && !pinged {
				pinged = true
				pingPubSub(l.ctx, ps)
				continue
			}
			if isTimeout(err) {
				// Nothing since the PING: half-open. go-redis keeps a
				// connection that only timed out, so replace it.
				if !l.replace(ps) {
					return
				}
			}
			pinged = false
			if !failed() {
				return
			}
			continue
		}
		pinged = false
		if failures > 0 {
			// Back and resubscribed (Redis answers the resubscription
			// before anything else): retry every key once more, since a
			// release may have come between the failure and now.
			failures = 0
			l.fn("", "")
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind != "subscribe" {
				break
			}
			// An UNSUBSCRIBE written here that fails has had go-redis
			// reconnect within the write, out of Receive's sight.
			if err := l.confirmed(m.Channel); err != nil && l.ctx.Err() == nil && !failed() {
				return
			}
		case *redis.Message:
			if key, ok := l.keyOf(m.Channel); ok {
				l.fn(key, nextOf(m.Payload))
			}
		}
	}
}

// replace puts a new pub/sub connection in the place of old, which did not
// answer a PING, subscribes every channel of the table on it, and closes
// old. It reports false, replacing nothing, once the listener is closed.
func (l *listener) replace(old *redis.PubSub) bool {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return false
	}
	ps := l.b.rdb.Subscribe(l.ctx)
	chs := make([]string, 0, len(l.subs))
	for ch := range l.subs {
		chs = append(chs, ch)
	}
	if len(chs) > 0 {
		// When the write fails, go-redis subscribes them on its next
		// connection, as for start.
		ctx, cancel := context.WithTimeout(l.ctx, pongWait)
		_ = ps.Subscribe(ctx, chs...)
		cancel()
	}
	l.ps = ps
	l.mu.Unlock()
	_ = old.Close()
	return true
}

// pingPubSub sends PING on ps, the health check of a pub/sub connection
// that has been idle for pingIdle. Its answer, or the lack of one, is
// read by the receive loop; a failed write has go-redis reconnect.
func pingPubSub(ctx context.Context, ps *redis.PubSub) {
	ctx, cancel := context.WithTimeout(ctx, pongWait)
	defer cancel()
	_ = ps.Ping(ctx)
}

// isTimeout reports whether err is a read or write that timed out.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
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

// Close closes the pub/sub connection and waits for the receive goroutine;
// fn is not called after Close returns. Subscribe calls still waiting return
// an error wrapping redis.ErrClosed. Closing twice is a no-op.
func (l *listener) Close() error {
	// First: it ends a dial in progress, which holds the PubSub (a PING or
	// a resubscription on a connection go-redis makes again), and so lets
	// a Subscribe waiting for the PubSub give up, and shut go on.
	l.cancel()
	var ps *redis.PubSub
	if !l.shut(func() { ps = l.ps }) {
		return nil
	}
	err := ps.Close()
	l.wg.Wait()
	if err != nil {
		return fmt.Errorf("redislock: close listener: %w", err)
	}
	return nil
}
