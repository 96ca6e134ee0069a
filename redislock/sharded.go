package redislock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// homingTimeout bounds one attempt of the homing goroutine to reach a node
// (refreshing the slot map, dialing, writing SSUBSCRIBE), so that Close and
// Subscribe are never held up for long by a node that does not answer.
const homingTimeout = 2 * time.Second

// shardedListener is the driver.Listener of a Backend on a Redis Cluster,
// where a release is announced with SPUBLISH on the master of the lock's
// slot and only reaches clients subscribed there with SSUBSCRIBE. It keeps
// one pub/sub connection per master that serves a channel it waits on, each
// read by a goroutine of its own, and one homing goroutine that subscribes
// channels again after a failure.
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
type shardedListener struct {
	cc     *redis.ClusterClient
	b      *Backend
	fn     func(key string)
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	kick   chan struct{} // capacity 1: wakes the homing goroutine
	wg     sync.WaitGroup

	// mu orders SSUBSCRIBE and SUNSUBSCRIBE writes with the bookkeeping
	// below, so that each node sees them in the order the maps changed.
	mu     sync.Mutex
	subs   map[string]*shardSub // by channel
	shards map[string]*shard    // by master address
	lost   bool                 // a connection failed since the last fn("")
	closed bool
}

// shard is the pub/sub connection to one master.
type shard struct {
	addr    string
	ps      *redis.PubSub
	pending map[string]int // SUNSUBSCRIBEs sent and not yet answered, by channel
	failed  bool           // closed and out of shardedListener.shards
}

// shardSub is one subscribed channel; see subscription for the counting.
type shardSub struct {
	key       string
	refs      int
	ready     chan struct{} // closed once a master has confirmed
	confirmed bool
	shard     *shard // where the SSUBSCRIBE went; nil until homed again
	rehomed   bool   // confirmed before, lost since: report key when confirmed again
}

// listenSharded is Listen on a Cluster.
func (b *Backend) listenSharded(ctx context.Context, cancel context.CancelFunc, cc *redis.ClusterClient, fn func(key string)) *shardedListener {
	l := &shardedListener{
		cc:     cc,
		b:      b,
		fn:     fn,
		ctx:    ctx,
		cancel: cancel,
		kick:   make(chan struct{}, 1),
		subs:   make(map[string]*shardSub),
		shards: make(map[string]*shard),
	}
	l.wg.Add(1)
	go l.homing()
	return l
}

// Subscribe subscribes to key's release channel on the master of its slot,
// or joins the subscription already made, and returns once that master has
// confirmed it. Errors and counting are as for the single-node listener.
func (l *shardedListener) Subscribe(ctx context.Context, key string) error {
	ch := l.b.channel(key)
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return fmt.Errorf("redislock: subscribe %q: %w", key, redis.ErrClosed)
	}
	s := l.subs[ch]
	if s == nil {
		s = &shardSub{key: key, ready: make(chan struct{})}
		if _, err := l.home(ctx, ch, s, nil); err != nil {
			l.mu.Unlock()
			return fmt.Errorf("redislock: subscribe %q: %w", key, err)
		}
		l.subs[ch] = s
	}
	s.refs++
	ready := s.ready
	l.mu.Unlock()

	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		_ = l.drop(context.WithoutCancel(ctx), ch)
		return fmt.Errorf("redislock: subscribe %q: %w", key, ctx.Err())
	case <-l.ctx.Done():
		return fmt.Errorf("redislock: subscribe %q: %w", key, redis.ErrClosed)
	}
}

// Unsubscribe drops one subscription of key and sends SUNSUBSCRIBE when it
// was the last. After Close it does nothing.
func (l *shardedListener) Unsubscribe(ctx context.Context, key string) error {
	if err := l.drop(ctx, l.b.channel(key)); err != nil {
		return fmt.Errorf("redislock: unsubscribe %q: %w", key, err)
	}
	return nil
}

// drop undoes one Subscribe of channel ch.
func (l *shardedListener) drop(ctx context.Context, ch string) error {
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
		return nil // as in listener.drop
	}
	delete(l.subs, ch)
	if s.shard == nil {
		return nil // waiting to be homed again: subscribed nowhere
	}
	return l.sunsubscribe(ctx, s.shard, ch)
}

// sunsubscribe sends SUNSUBSCRIBE ch on sh. l.mu must be held.
func (l *shardedListener) sunsubscribe(ctx context.Context, sh *shard, ch string) error {
	if err := sh.ps.SUnsubscribe(ctx, ch); err != nil {
		l.fail(sh)
		return err
	}
	sh.pending[ch]++
	return nil
}

// home sends SSUBSCRIBE for ch to the master of its slot as the client's
// slot map has it, on that master's connection, which it opens when there
// is none, and records where it went in s. When the write fails the
// connection is closed as failed. It returns the master's address, "" when
// it is not known. l.mu must be held.
func (l *shardedListener) home(ctx context.Context, ch string, s *shardSub, down map[string]bool) (string, error) {
	node, err := l.cc.MasterForKey(ctx, ch)
	if err != nil {
		return "", err
	}
	addr := node.Options().Addr
	if down[addr] {
		return addr, errNodeDown
	}
	sh := l.shards[addr]
	fresh := sh == nil
	if fresh {
		sh = &shard{addr: addr, ps: node.SSubscribe(l.ctx), pending: make(map[string]int)}
	}
	if err := sh.ps.SSubscribe(ctx, ch); err != nil {
		if fresh {
			_ = sh.ps.Close()
		} else {
			l.fail(sh)
		}
		return addr, err
	}
	if fresh {
		l.shards[addr] = sh
		l.wg.Add(1)
		go l.receive(sh)
	}
	s.shard = sh
	return addr, nil
}

// errNodeDown marks a master not tried again in the same homing round.
var errNodeDown = errors.New("master unreachable")

// fail closes sh after an error of its connection: every channel on it is
// handed to the homing goroutine, which reports the possible loss. It does
// nothing when sh has failed already. l.mu must be held.
func (l *shardedListener) fail(sh *shard) {
	if sh.failed {
		return
	}
	sh.failed = true
	delete(l.shards, sh.addr)
	_ = sh.ps.Close() // ends sh's receive goroutine
	for _, s := range l.subs {
		if s.shard == sh {
			l.unhome(s)
		}
	}
	l.lost = true
	l.wake()
}

// unhome marks s as subscribed nowhere, for the homing goroutine to
// subscribe again. l.mu must be held.
func (l *shardedListener) unhome(s *shardSub) {
	s.shard = nil
	if s.confirmed {
		s.rehomed = true
	}
}

// wake wakes the homing goroutine.
func (l *shardedListener) wake() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// receive reads sh's connection until it fails or the listener is closed.
func (l *shardedListener) receive(sh *shard) {
	defer l.wg.Done()
	for {
		msg, err := sh.ps.Receive(l.ctx)
		if err != nil {
			// A broken connection, an error reply (MOVED when the slot map
			// was stale), or Close.
			l.mu.Lock()
			l.fail(sh)
			l.mu.Unlock()
			return
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			var key string
			switch m.Kind {
			case "ssubscribe":
				key = l.confirm(sh, m.Channel)
			case "sunsubscribe":
				l.unsubscribed(sh, m.Channel)
			}
			if key != "" {
				l.fn(key)
			}
		case *redis.Message:
			if key, ok := l.keyOf(m.Channel); ok {
				l.fn(key)
			}
		}
	}
}

// confirm handles sh's "ssubscribe" confirmation for channel ch. It returns
// the channel's key when the subscription was taken up again after a
// failure, for a release may have been missed meanwhile.
func (l *shardedListener) confirm(sh *shard, ch string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.subs[ch]
	if s == nil || s.shard != sh {
		return ""
	}
	if s.confirmed {
		if s.rehomed {
			s.rehomed = false
			return s.key
		}
		return ""
	}
	s.confirmed = true
	close(s.ready)
	if s.refs == 0 { // every waiter gave up before the confirmation
		delete(l.subs, ch)
		_ = l.sunsubscribe(l.ctx, sh, ch)
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
	if s := l.subs[ch]; s != nil && s.shard == sh {
		l.unhome(s)
		l.wake()
	}
}

// keyOf returns the subscribed key whose release channel is ch.
func (l *shardedListener) keyOf(ch string) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.subs[ch]; s != nil {
		return s.key, true
	}
	return "", false
}

// homing subscribes again, each on its master of the moment, the channels
// whose connection failed or whose slot moved, until Close. After a failure
// it first reports "" and waits a little, longer after each failure in a
// row, so that a node that stays down is not dialed in a tight loop and a
// slot map that is slow to settle is not followed in one either.
func (l *shardedListener) homing() {
	defer l.wg.Done()
	var (
		failures    int // in a row: none more than failureMemory apart
		lastFailure time.Time
		retry       bool // the last round left channels subscribed nowhere
	)
	for {
		select {
		case <-l.kick:
		case <-l.ctx.Done():
			return
		}
		l.mu.Lock()
		lost := l.lost
		l.lost = false
		l.mu.Unlock()
		if lost {
			l.fn("")
		}
		if lost || retry {
			if time.Since(lastFailure) > failureMemory {
				failures = 0
			}
			failures++
			lastFailure = time.Now()
			if !l.sleep(reconnectDelay(failures)) {
				return
			}
		}
		l.refreshSlots()
		if retry = !l.homeAll(); retry {
			l.wake() // try again after the next pause
		}
	}
}

// failureMemory is how long the homing goroutine remembers a failure when
// it paces the next: longer than the longest pause.
const failureMemory = 2 * maxReconnectDelay

// refreshSlots makes the client reload the slot map now rather than on its
// own schedule: ForEachMaster reloads it before it runs (go-redis v9).
func (l *shardedListener) refreshSlots() {
	ctx, cancel := context.WithTimeout(l.ctx, homingTimeout)
	defer cancel()
	_ = l.cc.ForEachMaster(ctx, func(context.Context, *redis.Client) error { return nil })
}

// homeAll subscribes every channel that is subscribed nowhere, and reports
// whether none is left. A master that fails is not tried again in the same
// round.
func (l *shardedListener) homeAll() bool {
	ctx, cancel := context.WithTimeout(l.ctx, homingTimeout)
	defer cancel()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return true
	}
	done := true
	down := make(map[string]bool)
	for ch, s := range l.subs {
		if s.shard != nil {
			continue
		}
		if s.refs == 0 { // abandoned before its confirmation
			delete(l.subs, ch)
			continue
		}
		if addr, err := l.home(ctx, ch, s, down); err != nil {
			if addr != "" {
				down[addr] = true
			}
			done = false
		}
	}
	return done
}

// sleep waits for d, or reports false if the listener is closed first.
func (l *shardedListener) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-l.ctx.Done():
		return false
	}
}

// Close closes every connection and waits for the goroutines; fn is not
// called after Close returns. Subscribe calls still waiting return an error
// wrapping redis.ErrClosed. Closing twice is a no-op.
func (l *shardedListener) Close() error {
	l.cancel() // first: it ends a dial in progress under l.mu
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	var firstErr error
	for _, sh := range l.shards {
		sh.failed = true
		if err := sh.ps.Close(); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	clear(l.shards)
	l.mu.Unlock()
	l.wg.Wait()
	if firstErr != nil {
		return fmt.Errorf("redislock: close listener: %w", firstErr)
	}
	return nil
}
