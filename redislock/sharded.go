// The release listener on a Redis Cluster: one SSUBSCRIBE connection per
// master, with its writer and reader goroutines and its failure handling.

package redislock

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// shardedListener is the driver.Listener of a Backend on a Redis Cluster,
// where a release is announced with SPUBLISH on the master of the lock's
// slot and only reaches clients subscribed there with SSUBSCRIBE. It keeps
// one pub/sub connection per master that serves a channel it waits on, each
// written by a goroutine of its own and read by another, and one homing
// goroutine that subscribes channels again after a failure.
//
// go-redis cannot be left to resubscribe a broken connection: it sends all
// of a PubSub's shard channels in one SSUBSCRIBE, which Redis refuses
// (CROSSSLOT) when they are in different slots, and it would send it to the
// old node after the slot map changed. So at the first error of a node's
// connection the listener closes it, reports "" (releases may have been
// missed) and hands every channel of it to the homing goroutine, which
// refreshes the slot map and subscribes each channel, one command each, on
// its master as of now. An error reply counts as a failure too: MOVED, when
// the client's slot map was stale. A subscription taken up again reports its
// key once its master has confirmed it, since a release between the failure
// and then would have been missed.
//
// Redis pushes an unsolicited "sunsubscribe" when a channel's slot moves to
// another node; the channel is homed again the same way.
//
// No network call is made under mu: the master of a channel is looked up
// before, and SSUBSCRIBE and SUNSUBSCRIBE are queued on the node's shard
// under mu and written, dial included, by the shard's writer goroutine in
// queue order. So a node that hangs holds up only its own channels, never
// the releases announced on the others or the Subscribe calls for them.
type shardedListener struct {
	subscriptions[shardState]
	cc   *redis.ClusterClient
	b    *Backend
	fn   func(key, next string)
	kick chan struct{} // capacity 1: wakes the homing goroutine
	wg   sync.WaitGroup

	// The core's mu also guards the bookkeeping below, shards' queues
	// included, so that each node is sent its SSUBSCRIBEs and SUNSUBSCRIBEs
	// in the order the maps changed. It is never held across a network
	// call.
	shards map[string]*shard // by master address
	lost   bool              // a connection failed since the last fn("", "")
}

// shard is the pub/sub connection to one master.
type shard struct {
	addr    string
	ps      *redis.PubSub
	pending map[string]int // SUNSUBSCRIBEs queued and not yet answered, by channel
	ops     []shardOp      // writes queued for the writer goroutine, in order
	kick    chan struct{}  // capacity 1: wakes the writer goroutine
	live    bool           // a write went through; the receive goroutine runs
	failed  bool           // closed and out of shardedListener.shards
}

// shardOp is one write queued on a shard.
type shardOp struct {
	unsub bool // SUNSUBSCRIBE, else SSUBSCRIBE
	ch    string
	done  chan error // capacity 1: the write's outcome; nil when nobody waits
}

// shardSub is one subscribed channel of a shardedListener; see subscription
// for the counting.
type shardSub = subscription[shardState]

// shardState is a shardSub's own part: where it is subscribed.
type shardState struct {
	shard   *shard // where the SSUBSCRIBE went; nil until homed again
	homing  bool   // its master is being looked up, out of mu
	rehomed bool   // confirmed before, lost since: report key when confirmed again
}

// errNoPong is the failure of a shard's connection that answered no PING.
var errNoPong = errors.New("no answer to PING on the pub/sub connection")

// errShardFailed answers the writes still queued on a shard that failed.
var errShardFailed = errors.New("connection to the master failed")

// errRehoming answers an SSUBSCRIBE queued on, or being written to, a shard
// whose connection had worked and then failed, by an error or by a MOVED
// answer to another SSUBSCRIBE: its channel is the homing goroutine's to
// subscribe again, and the Subscribe waits for that confirmation, as it
// does for a channel written before the failure.
var errRehoming = errors.New("connection to the master failed; subscribing again")

// listenSharded is Listen on a Cluster.
func (b *Backend) listenSharded(ctx context.Context, cancel context.CancelFunc, cc *redis.ClusterClient, fn func(key, next string)) *shardedListener {
	l := &shardedListener{
		cc:     cc,
		b:      b,
		fn:     fn,
		kick:   make(chan struct{}, 1),
		shards: make(map[string]*shard),
	}
	l.setup(ctx, cancel, l)
	l.wg.Add(1)
	go l.homing()
	return l
}

// Subscribe subscribes to key's release channel on the master of its slot,
// or joins the subscription already made, and returns once that master has
// confirmed it. Errors and counting are as for the single-node listener.
//
// It subscribes the Backend's handoff channel of key too, as the
// single-node listener does (its slot is the key's).
func (l *shardedListener) Subscribe(ctx context.Context, key string) error {
	return l.pair(ctx, key, l.b.channel(key), l.b.handoffChannel(key), l.joinHomed)
}

// Watch subscribes key's watch channel on the master of its slot, as the
// single-node listener does.
func (l *shardedListener) Watch(ctx context.Context, key string) error {
	ch := l.b.watchChannel(key)
	s, err := l.joinHomed(ctx, key, ch)
	if err != nil {
		return err
	}
	return l.await(ctx, key, ch, s)
}

// Unwatch undoes one Watch of key.
func (l *shardedListener) Unwatch(ctx context.Context, key string) error {
	return l.undo(ctx, "unwatch", key, l.b.watchChannel(key))
}

// joinHomed joins the subscription to ch of key and, when it made it,
// homes it on the master of its slot.
func (l *shardedListener) joinHomed(ctx context.Context, key, ch string) (*shardSub, error) {
	s, fresh, err := l.join(ctx, key, ch)
	if err != nil {
		return nil, err
	}
	if fresh {
		if err := l.home(ctx, ch, s); err != nil {
			l.abandon(ch, s)
			return nil, fmt.Errorf("redislock: subscribe %q: %w", key, err)
		}
	}
	return s, nil
}

// start marks s, new, as being homed: Subscribe homes it once l.mu is
// released (wire). l.mu is held.
func (l *shardedListener) start(_ context.Context, _ string, s *shardSub) error {
	s.ext.homing = true
	return nil
}

// stop queues SUNSUBSCRIBE ch on the shard of s, if it has one (wire).
// l.mu is held.
func (l *shardedListener) stop(_ context.Context, ch string, s *shardSub, wait bool) (<-chan error, error) {
	if s.ext.shard == nil {
		return nil, nil // waiting to be homed again: subscribed nowhere
	}
	var done chan error
	if wait {
		done = make(chan error, 1)
	}
	l.sunsubscribe(s.ext.shard, ch, done)
	return done, nil
}

// Unsubscribe drops one subscription of key and sends SUNSUBSCRIBE when it
// was the last. After Close it does nothing.
func (l *shardedListener) Unsubscribe(ctx context.Context, key string) error {
	return l.undo(ctx, "unsubscribe", key, l.b.channel(key), l.b.handoffChannel(key))
}

// sunsubscribe queues SUNSUBSCRIBE ch on sh. l.mu must be held.
func (l *shardedListener) sunsubscribe(sh *shard, ch string, done chan error) {
	sh.pending[ch]++
	l.enqueue(sh, shardOp{unsub: true, ch: ch, done: done})
}

// shardOf returns the shard of node, which it opens, with its writer
// goroutine, when there is none. The connection is dialed by the first
// write. l.mu must be held.
func (l *shardedListener) shardOf(node *redis.Client) *shard {
	addr := node.Options().Addr
	if sh := l.shards[addr]; sh != nil {
		return sh
	}
	sh := &shard{
		addr:    addr,
		ps:      node.SSubscribe(l.ctx), // no channel: nothing is sent yet
		pending: make(map[string]int),
		kick:    make(chan struct{}, 1),
	}
	l.shards[addr] = sh
	l.wg.Add(1)
	go l.write(sh)
	return sh
}

// enqueue queues op on sh and wakes its writer. When sh has failed, op is
// answered with errShardFailed at once. l.mu must be held.
func (l *shardedListener) enqueue(sh *shard, op shardOp) {
	if sh.failed {
		if op.done != nil {
			op.done <- errShardFailed
		}
		return
	}
	sh.ops = append(sh.ops, op)
	select {
	case sh.kick <- struct{}{}:
	default:
	}
}

// write writes sh's queued SSUBSCRIBEs and SUNSUBSCRIBEs in order, out of
// l.mu, until sh fails or the listener is closed. After the first write
// that goes through, which dials the connection, it starts sh's receive
// goroutine. A write that fails fails sh.
func (l *shardedListener) write(sh *shard) {
	defer l.wg.Done()
	for {
		l.mu.Lock()
		if sh.failed {
			l.mu.Unlock()
			return
		}
		if len(sh.ops) == 0 {
			l.mu.Unlock()
			select {
			case <-sh.kick:
				continue
			case <-l.ctx.Done():
				return
			}
		}
		op := sh.ops[0]
		sh.ops[0] = shardOp{}
		sh.ops = sh.ops[1:]
		l.mu.Unlock()

		var err error
		if op.unsub {
			err = sh.ps.SUnsubscribe(l.ctx, op.ch)
		} else {
			err = sh.ps.SSubscribe(l.ctx, op.ch)
		}
		l.mu.Lock()
		live := sh.live
		switch {
		case err != nil:
			l.fail(sh)
		case !sh.live && !sh.failed:
			sh.live = true
			l.wg.Add(1)
			go l.receive(sh)
		}
		l.mu.Unlock()
		if err != nil && live && !op.unsub {
			err = fmt.Errorf("%w: %w", errRehoming, err)
		}
		if op.done != nil {
			op.done <- err
		}
		if err != nil {
			_ = sh.ps.Close()
			return
		}
	}
}

// fail takes sh out after an error of its connection: every channel on it
// is handed to the homing goroutine, which reports the possible loss when
// the connection had worked, and the writes still queued are answered with
// errRehoming (an SSUBSCRIBE on a connection that had worked) or
// errShardFailed. The caller closes sh.ps once l.mu is released: Close
// waits for a write, or a dial, in progress. It does nothing when sh has
// failed already. l.mu must be held.
func (l *shardedListener) fail(sh *shard) {
	if sh.failed {
		return
	}
	sh.failed = true
	if l.shards[sh.addr] == sh {
		delete(l.shards, sh.addr)
	}
	for _, op := range sh.ops {
		switch {
		case op.done == nil:
		case sh.live && !op.unsub:
			op.done <- errRehoming
		default:
			op.done <- errShardFailed
		}
	}
	sh.ops = nil
	select {
	case sh.kick <- struct{}{}: // the writer sees sh.failed
	default:
	}
	for _, s := range l.subs {
		if s.ext.shard == sh {
			l.unhome(s)
		}
	}
	if sh.live {
		l.lost = true
	}
	l.wake()
}

// receive reads sh's connection until it fails or the listener is closed,
// and health-checks it as the single-node listener does.
func (l *shardedListener) receive(sh *shard) {
	defer l.wg.Done()
	pinged := false // a PING is out and nothing came back since (see pingIdle)
	for {
		wait := pingIdle
		if pinged {
			wait = pongWait
		}
		msg, err := sh.ps.ReceiveTimeout(l.ctx, wait)
		if err != nil && isTimeout(err) && l.ctx.Err() == nil {
			if !pinged {
				pinged = true
				pingPubSub(l.ctx, sh.ps)
				continue
			}
			err = errNoPong // half-open: fail sh, as for a broken connection
		}
		pinged = false
		if err != nil && isNoPerm(err) && l.ctx.Err() == nil {
			// The connection is fine; the master refused an SSUBSCRIBE.
			l.refuse(err)
			continue
		}
		if err != nil {
			// A broken connection, an error reply (MOVED when the slot map
			// was stale), or Close.
			l.mu.Lock()
			l.fail(sh)
			l.mu.Unlock()
			_ = sh.ps.Close() // ends a write in progress
			return
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			var key string
			switch m.Kind {
			case "ssubscribe":
				key = l.confirmed(sh, m.Channel)
			case "sunsubscribe":
				l.unsubscribed(sh, m.Channel)
			}
			if key != "" {
				l.fn(key, "")
			}
		case *redis.Message:
			if key, ok := l.keyOf(m.Channel); ok {
				l.fn(key, nextOf(m.Payload))
			}
		}
	}
}

// confirmed handles sh's "ssubscribe" confirmation for channel ch. It
// returns the channel's key when the subscription was taken up again after
// a failure, for a release may have been missed meanwhile.
func (l *shardedListener) confirmed(sh *shard, ch string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.subs[ch]
	switch {
	case s == nil || s.ext.shard != sh:
		// Not subscribed, or not through sh any more.
	case !s.confirmed:
		_ = l.confirm(ch, s) // its stop only queues the write
	case s.ext.rehomed:
		s.ext.rehomed = false
		return s.key
	}
	return ""
}

// unsubscribed handles a "sunsubscribe" for channel ch on sh: the answer to
// a SUNSUBSCRIBE, or, unasked, the news that ch's slot has moved to another
// node, which the homing goroutine follows.
func (l *shardedListener) unsubscribed(sh *shard, ch string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := sh.pending[ch]; n > 0 {
		if n == 1 {
			delete(sh.pending, ch)
		} else {
			sh.pending[ch] = n - 1
		}
		return
	}
	if s := l.subs[ch]; s != nil && s.ext.shard == sh {
		l.unhome(s)
		l.wake()
	}
}

// Close closes every connection and waits for the goroutines; fn is not
// called after Close returns. Subscribe calls still waiting return an error
// wrapping redis.ErrClosed. Closing twice is a no-op.
func (l *shardedListener) Close() error {
	l.cancel() // first: it ends a dial in progress
	var shards []*shard
	if !l.shut(func() {
		shards = make([]*shard, 0, len(l.shards))
		for _, sh := range l.shards {
			sh.failed = true
			shards = append(shards, sh)
		}
		clear(l.shards)
	}) {
		return nil
	}
	var firstErr error
	for _, sh := range shards {
		select {
		case sh.kick <- struct{}{}:
		default:
		}
		if err := sh.ps.Close(); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	l.wg.Wait()
	if firstErr != nil {
		return fmt.Errorf("redislock: close listener: %w", firstErr)
	}
	return nil
}
