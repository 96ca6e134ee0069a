// Homing for the Cluster listener: finding the master of each channel's
// slot and subscribing the channel there, at Subscribe and again after a
// connection failed or the slot moved.

package redislock

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// homingTimeout bounds one round of the homing goroutine (refreshing the
// slot map, waiting for the SSUBSCRIBEs it queued to be written), so that a
// node that does not answer only delays the next round.
const homingTimeout = 2 * time.Second

// home looks up the master of ch as the client's slot map has it (out of
// mu: it may reload the slot map), queues SSUBSCRIBE ch on that master's
// shard, which it opens when there is none, records the shard in s, and
// waits until the SSUBSCRIBE has been written. When the shard's connection,
// having worked, fails first (errRehoming), s is the homing goroutine's and
// home returns nil: the caller's wait for the confirmation covers it.
// s.ext.homing must be set; home clears it.
func (l *shardedListener) home(ctx context.Context, ch string, s *shardSub) error {
	node, err := l.cc.MasterForKey(ctx, ch)
	l.mu.Lock()
	s.ext.homing = false
	switch {
	case l.closed:
		err = redis.ErrClosed
	case err == nil:
		done := make(chan error, 1)
		sh := l.shardOf(node)
		s.ext.shard = sh
		l.enqueue(sh, shardOp{ch: ch, done: done})
		l.mu.Unlock()
		select {
		case err := <-done:
			if errors.Is(err, errRehoming) {
				return nil // fail handed s to the homing goroutine
			}
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
	case s.ext.shard != nil:
		// The SSUBSCRIBE is queued or written: its confirmation, or the
		// failure of the shard, will clean up.
	case s.refs == 0:
		delete(l.subs, ch)
	default:
		l.wake()
	}
}

// unhome marks s as subscribed nowhere, for the homing goroutine to
// subscribe again. l.mu must be held.
func (l *shardedListener) unhome(s *shardSub) {
	s.ext.shard = nil
	if s.confirmed {
		s.ext.rehomed = true
	}
}

// wake wakes the homing goroutine.
func (l *shardedListener) wake() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
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
		if s.ext.shard != nil || s.ext.homing {
			continue
		}
		if s.refs == 0 { // abandoned before its confirmation
			delete(l.subs, ch)
			continue
		}
		s.ext.homing = true
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
		j.s.ext.homing = false
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
		j.s.ext.shard = sh
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
