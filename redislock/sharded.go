package redislock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// homingTimeout bounds one round of the homing goroutine (refreshing the
// slot map, waiting for the SSUBSCRIBEs it queued to be written), so that a
// node that does not answer only delays the next round.
const homingTimeout = 2 * time.Second

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
	cc     *redis.ClusterClient
	b      *Backend
	fn     func(key, next string)
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	kick   chan struct{} // capacity 1: wakes the homing goroutine
	wg     sync.WaitGroup

	// mu guards the bookkeeping below, shards' queues included, so that
	// each node is sent its SSUBSCRIBEs and SUNSUBSCRIBEs in the order the
	// maps changed. It is never held across a network call.
	mu     sync.Mutex
	subs   map[string]*shardSub // by channel
	shards map[string]*shard    // by master address
	lost   bool                 // a connection failed since the last fn("", "")
	closed bool
	// refused is a master's answer when it refused an SSUBSCRIBE for lack
	// of rights; Subscribe fails with it from then on (see listener.refuse).
	refused error
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

// shardSub is one subscribed channel; see subscription for the counting.
type shardSub struct {
	key       string
	refs      int
	ready     chan struct{} // closed once a master has confirmed, or refused
	confirmed bool
	err       error  // set, before ready is closed, when a master refused
	shard     *shard // where the SSUBSCRIBE went; nil until homed again
	homing    bool   // its master is being looked up, out of mu
	rehomed   bool   // confirmed before, lost since: report key when confirmed again
}

// errShardFailed answers the writes still queued on a shard that failed.
var errShardFailed = errors.New("connection to the master failed")

// listenSharded is Listen on a Cluster.
func (b *Backend) listenSharded(ctx context.Context, cancel context.CancelFunc, cc *redis.ClusterClient, fn func(key, next string)) *shardedListener {
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
	if l.refused != nil {
		l.mu.Unlock()
		return refusedError(key, ch, l.refused)
	}
	s := l.subs[ch]
	fresh := s == nil
	if fresh {
		s = &shardSub{key: key, ready: make(chan struct{}), homing: true}
		l.subs[ch] = s
	}
	s.refs++
	ready := s.ready
	l.mu.Unlock()

	if fresh {
		if err := l.home(ctx, ch, s); err != nil {
			l.abandon(ch, s)
			return fmt.Errorf("redislock: subscribe %q: %w", key, err)
		}
	}
	select {
	case <-ready:
		if s.err != nil {
			return refusedError(key, ch, s.err)
		}
		return nil
	case <-ctx.Done():
		_ = l.drop(context.WithoutCancel(ctx), ch, false)
		return fmt.Errorf("redislock: subscribe %q: %w", key, ctx.Err())
	case <-l.ctx.Done():
		return fmt.Errorf("redislock: subscribe %q: %w", key, redis.ErrClosed)
	}
}

// home looks up the master of ch as the client's slot map has it (out of
// mu: it may reload the slot map), queues SSUBSCRIBE ch on that master's
// shard, which it opens when there is none, records the shard in s, and
// waits until the SSUBSCRIBE has been written. s.homing must be set; home
// clears it.
func (l *shardedListener) home(ctx context.Context, ch string, s *shardSub) error {
	node, err := l.cc.MasterForKey(ctx, ch)
	l.mu.Lock()
	s.homing = false
	switch {
	case l.closed:
		err = redis.ErrClosed
	case err == nil:
		done := make(chan error, 1)
		sh := l.shardOf(node)
		s.shard = sh
		l.enqueue(sh, shardOp{ch: ch, done: done})
		l.mu.Unlock()
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-l.ctx.Done():
			return redis.ErrClosed
		}
	}
	l.mu.Unlock()
	return err
}

// abandon undoes the Subscribe of ch whose homing failed. A subscription
// joined meanwhile is left to the homing goroutine.
func (l *shardedListener) abandon(ch string, s *shardSub) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.subs[ch] != s {
		return
	}
	s.refs--
	switch {
	case s.shard != nil:
		// The SSUBSCRIBE is queued or written: its confirmation, or the
		// failure of the shard, will clean up.
	case s.refs == 0:
		delete(l.subs, ch)
	default:
		l.wake()
	}
}

// Unsubscribe drops one subscription of key and sends SUNSUBSCRIBE when it
// was the last. After Close it does nothing.
func (l *shardedListener) Unsubscribe(ctx context.Context, key string) error {
	if err := l.drop(ctx, l.b.channel(key), true); err != nil {
		return fmt.Errorf("redislock: unsubscribe %q: %w", key, err)
	}
	return nil
}

// drop undoes one Subscribe of channel ch. With wait, it waits for the
// SUNSUBSCRIBE it queues, if any, to be written, and returns its error.
func (l *shardedListener) drop(ctx context.Context, ch string, wait bool) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	s := l.subs[ch]
	if s == nil || s.refs == 0 {
		l.mu.Unlock()
		return errNotSubscribed
	}
	s.refs--
	if s.refs > 0 || !s.confirmed {
		l.mu.Unlock()
		return nil // as in listener.drop
	}
	delete(l.subs, ch)
	if s.shard == nil {
		l.mu.Unlock()
		return nil // waiting to be homed again: subscribed nowhere
	}
	var done chan error
	if wait {
		done = make(chan error, 1)
	}
	l.sunsubscribe(s.shard, ch, done)
	l.mu.Unlock()
	if !wait {
		return nil
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-l.ctx.Done():
		return nil
	}
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
		switch {
		case err != nil:
			l.fail(sh)
		case !sh.live && !sh.failed:
			sh.live = true
			l.wg.Add(1)
			go l.receive(sh)
		}
		l.mu.Unlock()
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
		if op.done != nil {
			op.done <- errShardFailed
		}
	}
	sh.ops = nil
	select {
	case sh.kick <- struct{}{}: // the writer sees sh.failed
	default:
	}
	for _, s := range l.subs {
		if s.shard == sh {
			l.unhome(s)
		}
	}
	if sh.live {
		l.lost = true
	}
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
				key = l.confirm(sh, m.Channel)
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

// refuse handles a master's refusal of an SSUBSCRIBE (NOPERM), as
// listener.refuse does: every subscription not yet confirmed fails with it,
// and so will every later Subscribe.
func (l *shardedListener) refuse(err error) {
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
		l.sunsubscribe(sh, ch, nil)
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
			l.fn("", "")
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
// whether none is left and every SSUBSCRIBE it queued was written. It looks
// up all the masters first, so that the channels of one master share one
// shard and a master that fails is dialed once a round.
func (l *shardedListener) homeAll() bool {
	ctx, cancel := context.WithTimeout(l.ctx, homingTimeout)
	defer cancel()
	type job struct {
		ch   string
		s    *shardSub
		node *redis.Client
	}
	var jobs []job
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return true
	}
	for ch, s := range l.subs {
		if s.shard != nil || s.homing {
			continue
		}
		if s.refs == 0 { // abandoned before its confirmation
			delete(l.subs, ch)
			continue
		}
		s.homing = true
		jobs = append(jobs, job{ch: ch, s: s})
	}
	l.mu.Unlock()

	ok := true
	for i := range jobs {
		node, err := l.cc.MasterForKey(ctx, jobs[i].ch)
		if err != nil {
			ok = false
		}
		jobs[i].node = node
	}
	var waits []chan error
	l.mu.Lock()
	for _, j := range jobs {
		j.s.homing = false
		if l.subs[j.ch] != j.s {
			continue // dropped meanwhile
		}
		if j.s.refs == 0 {
			delete(l.subs, j.ch)
			continue
		}
		if j.node == nil || l.closed {
			continue // MasterForKey failed: the next round tries again
		}
		done := make(chan error, 1)
		sh := l.shardOf(j.node)
		j.s.shard = sh
		l.enqueue(sh, shardOp{ch: j.ch, done: done})
		waits = append(waits, done)
	}
	l.mu.Unlock()
	for _, done := range waits {
		select {
		case err := <-done:
			if err != nil {
				ok = false
			}
		case <-ctx.Done():
			// A write is still stuck; the shard fails if it does.
			return false
		}
	}
	return ok
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
	l.cancel() // first: it ends a dial in progress
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	shards := make([]*shard, 0, len(l.shards))
	for _, sh := range l.shards {
		sh.failed = true
		shards = append(shards, sh)
	}
	clear(l.shards)
	l.mu.Unlock()
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
