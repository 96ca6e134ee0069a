// The subscription core of both release listeners: the table of counted
// subscriptions to release channels, their confirmations and refusals.

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
	"github.com/dlock-go/dlock/internal/ctxend"
)

// subscriptions is the part that both release listeners share and embed
// (listener on one node or through Sentinel, shardedListener on a Cluster):
// the table of subscribed release channels, each counted by its Subscribe
// calls and released once the server has confirmed it, the refusal and the
// closing. What a channel needs on the wire is the listener's: the core
// calls its wire, with mu held, when a channel enters the table and when it
// leaves. X is the listener's own state of each channel (struct{} for
// listener, shardState for shardedListener).
type subscriptions[X any] struct {
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wire   wire[X]

	// mu guards the table and the fields below, and the bookkeeping of the
	// listener that embeds it. The wire is called under it, so that the
	// server is sent each channel's subscribe and unsubscribe commands in
	// the order the table changed (see each listener for how).
	mu     sync.Mutex
	subs   map[string]*subscription[X] // by channel
	closed bool
	// refused is Redis's answer when it refused a SUBSCRIBE or SSUBSCRIBE
	// for lack of rights (see refuse); Subscribe fails with it from then on.
	refused error
}

// wire is how a listener subscribes and unsubscribes a channel for the
// core. Its methods are called with mu held.
type wire[X any] interface {
	// start begins the subscription s to ch, new: s enters the table only
	// when start succeeds. start writes the command, or prepares s for the
	// listener to subscribe once mu is released.
	start(ctx context.Context, ch string, s *subscription[X]) error
	// stop ends the subscription s to ch, which has just left the table.
	// It writes the command and returns its error, or queues it and, with
	// wait, returns a channel that carries the outcome of the write, for
	// the caller to wait on once mu is released.
	stop(ctx context.Context, ch string, s *subscription[X], wait bool) (<-chan error, error)
}

// subscription is one subscribed channel. Its SUBSCRIBE is never followed by
// an UNSUBSCRIBE before the server has confirmed it, so the next "subscribe"
// confirmation for the channel answers that SUBSCRIBE, or go-redis's
// resubscription after a reconnect, which is as good.
//
// One race remains on one node (listener): go-redis resubscribes on a new
// connection before the listener learns of the reconnect, so if within that
// round trip the channel is unsubscribed and subscribed again, the
// resubscription's confirmation can release the new Subscribe a moment
// before the server runs it. The cost is at most one missed wake-up, which
// the client's retry timer covers. (shardedListener never leaves a
// resubscription to go-redis, and takes a confirmation only from the
// connection its SSUBSCRIBE went to.)
type subscription[X any] struct {
	key       string
	refs      int           // Subscribe calls not yet undone
	ready     chan struct{} // closed once the server has confirmed, or refused
	confirmed bool
	err       error // set, before ready is closed, when the server refused
	ext       X     // the listener's own state of the channel
}

// errNotSubscribed is drop's error for a channel no Subscribe holds.
var errNotSubscribed = errors.New("not subscribed")

// setup readies the core of a listener whose wire is w, for a stream that
// lives until ctx is cancelled (by cancel, in Close).
func (c *subscriptions[X]) setup(ctx context.Context, cancel context.CancelFunc, w wire[X]) {
	c.ctx, c.cancel, c.wire = ctx, cancel, w
	c.subs = make(map[string]*subscription[X])
}

// join counts one Subscribe of key, whose release channel is ch: it joins
// the subscription to ch in the table, or makes one, which the wire starts,
// and reports whether it made it. It fails, counting nothing, after Close
// (redis.ErrClosed), after a refusal, and when the wire's start fails (with
// an error wrapping ctx.Err() too when ctx has ended).
func (c *subscriptions[X]) join(ctx context.Context, key, ch string) (s *subscription[X], fresh bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, false, fmt.Errorf("redislock: subscribe %q: %w", key, redis.ErrClosed)
	}
	if c.refused != nil {
		return nil, false, refusedError(key, ch, c.refused)
	}
	s = c.subs[ch]
	if s == nil {
		s = &subscription[X]{key: key, ready: make(chan struct{})}
		if err := c.wire.start(ctx, ch, s); err != nil {
			if cerr := ctxend.Err(ctx); cerr != nil {
				// The write gave up at the caller's deadline: say so.
				return nil, false, fmt.Errorf("redislock: subscribe %q: %w (%w)", key, cerr, err)
			}
			return nil, false, fmt.Errorf("redislock: subscribe %q: %w", key, err)
		}
		c.subs[ch] = s
		fresh = true
	}
	s.refs++
	return s, fresh, nil
}

// await waits until the server has confirmed s, the subscription to key's
// channel ch that join counted, and returns nil, or the refusal. When ctx
// ends first it undoes the join and returns an error wrapping ctx.Err();
// after Close it returns one wrapping redis.ErrClosed.
func (c *subscriptions[X]) await(ctx context.Context, key, ch string, s *subscription[X]) error {
	select {
	case <-s.ready:
		if s.err != nil {
			return refusedError(key, ch, s.err)
		}
		return nil
	case <-ctx.Done():
		_ = c.drop(context.WithoutCancel(ctx), ch, false)
		return fmt.Errorf("redislock: subscribe %q: %w", key, ctx.Err())
	case <-c.ctx.Done():
		return fmt.Errorf("redislock: subscribe %q: %w", key, redis.ErrClosed)
	}
}

// pair counts one Subscribe of key's two channels ch and ho (the release
// channel and the Backend's handoff channel): join joins one, and readies
// it on the wire; both are joined before either is awaited, so that one
// round trip confirms both. A failure undoes what was counted.
func (c *subscriptions[X]) pair(ctx context.Context, key, ch, ho string, join func(ctx context.Context, key, ch string) (*subscription[X], error)) error {
	s, err := join(ctx, key, ch)
	if err != nil {
		return err
	}
	sh, err := join(ctx, key, ho)
	if err != nil {
		_ = c.drop(context.WithoutCancel(ctx), ch, false)
		return err
	}
	if err := c.await(ctx, key, ch, s); err != nil {
		_ = c.drop(context.WithoutCancel(ctx), ho, false)
		return err
	}
	if err := c.await(ctx, key, ho, sh); err != nil {
		_ = c.drop(context.WithoutCancel(ctx), ch, false)
		return err
	}
	return nil
}

// undo undoes one subscription of each of key's channels chs (both of a
// pair for Unsubscribe, the watch channel for Unwatch), waiting for the
// writes (see drop); op names the call in the error.
func (c *subscriptions[X]) undo(ctx context.Context, op, key string, chs ...string) error {
	var errs []error
	for _, ch := range chs {
		errs = append(errs, c.drop(ctx, ch, true))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("redislock: %s %q: %w", op, key, err)
	}
	return nil
}

// drop undoes one Subscribe of channel ch, and has the wire stop ch when it
// was the last. With wait, it then waits, out of mu, for the write the wire
// queued, if any, and returns its error. After Close it does nothing.
func (c *subscriptions[X]) drop(ctx context.Context, ch string, wait bool) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	s := c.subs[ch]
	if s == nil || s.refs == 0 {
		c.mu.Unlock()
		return errNotSubscribed
	}
	s.refs--
	if s.refs > 0 || !s.confirmed {
		// An unconfirmed subscription stays until its confirmation
		// arrives; confirm unsubscribes it then if nobody came back.
		c.mu.Unlock()
		return nil
	}
	delete(c.subs, ch)
	done, err := c.wire.stop(ctx, ch, s, wait)
	c.mu.Unlock()
	if done == nil {
		return err
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-c.ctx.Done():
		return nil
	}
}

// confirm handles the server's first confirmation of s, the subscription to
// ch: it releases the Subscribe calls waiting for it and, when they have all
// given up meanwhile, takes ch out of the table and has the wire stop it.
// The listener has checked that s is in the table, unconfirmed, and that
// the confirmation answers its subscribe command. It returns the error of
// writing that stop, if any. c.mu must be held.
func (c *subscriptions[X]) confirm(ch string, s *subscription[X]) error {
	s.confirmed = true
	close(s.ready)
	if s.refs == 0 { // every waiter gave up before the confirmation
		delete(c.subs, ch)
		_, err := c.wire.stop(c.ctx, ch, s, false)
		return err
	}
	return nil
}

// refuse handles Redis's refusal of a SUBSCRIBE or SSUBSCRIBE (NOPERM): the
// ACL rules are the same for every release channel, so every subscription
// not yet confirmed fails with it, and so will every later Subscribe.
func (c *subscriptions[X]) refuse(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refused = err
	for ch, s := range c.subs {
		if !s.confirmed {
			s.err = err
			close(s.ready)
			delete(c.subs, ch)
		}
	}
}

// keyOf returns the subscribed key whose release channel is ch.
func (c *subscriptions[X]) keyOf(ch string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.subs[ch]; s != nil {
		return s.key, true
	}
	return "", false
}

// sleep waits for d, or reports false if the listener is closed first.
func (c *subscriptions[X]) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.ctx.Done():
		return false
	}
}

// shut marks the core closed, so that Subscribe fails and Unsubscribe does
// nothing from now on, and runs also, when not nil, with mu held. It
// reports false, running nothing, when the core was closed already.
func (c *subscriptions[X]) shut(also func()) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.closed = true
	if also != nil {
		also()
	}
	return true
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
