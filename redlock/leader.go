package redlock

import (
	"hash/fnv"
	"time"
)

// Leader first. Under contention, sending an acquire to every node at once
// makes the contenders' requests arrive at the nodes in different orders:
// with three or more contenders the nodes are split between them, none wins
// a quorum, all undo what they won and back off (see busyResult), and the
// lock sits free meanwhile. Every release of a hot key wakes every waiting
// Client, so such collisions are the rule, not the exception.
//
// So while a key is contended, an exclusive acquire of a caller that waits
// (driver.AcquireRequest.Wait: dlock's Lock) goes to one node first,
// the key's leader, and to the others only once the leader has granted it
// (or failed). The leader serialises the contenders: only the one it grants
// goes on to the other nodes, so they are not split, and a contender that
// the leader refuses costs one round trip instead of N. Nothing else
// changes: the grant still needs a quorum, its validity is counted from the
// moment the leader's request went out, and its fence is the highest of
// the quorum's. A leader that fails or does not answer in time lets the
// other nodes be asked at once, and is passed over for a while.
//
// A key is contended for contendedFor after an attempt on it was refused.
// An uncontended acquire is not slowed by the extra round trip.
//
// The leader may refuse with a hold that no quorum backs: a contender that
// won only the leader and died before undoing it leaves its hold there
// until its TTL. Asking only the leader would keep the waiters out all
// that time while a quorum of the other nodes is free. So when the leader
// has refused a Backend's waiters for one and the same holder for
// fullEvery, the next waiter's attempt asks every node at once (and so
// once every fullEvery while that lasts), which wins the free nodes. Under
// a hot key the holder changes far more often, and no such attempt races
// the queue's head.
const (
	contendedFor  = time.Second
	fullEvery     = time.Second
	leaderFailFor = time.Second
	maxContended  = 4096
)

// contention is what a Backend knows of a contended key.
type contention struct {
	at     time.Time // last refusal
	holder string    // the holder the leader last refused with, or ""
	since  time.Time // when the leader first refused with holder, or the last full attempt
}

// contend records that an attempt on key was refused.
func (b *Backend) contend(key string) {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.contended == nil || len(b.contended) >= maxContended {
		b.contended = make(map[string]*contention) // forget: keys only lose the leader for a moment
	}
	if c := b.contended[key]; c != nil {
		c.at = now
	} else {
		b.contended[key] = &contention{at: now}
	}
}

// heldOnLeader records that the leader refused a waiter's attempt on key
// with holder ("": free, but promised to the head of its queue).
func (b *Backend) heldOnLeader(key, holder string) {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if c := b.contended[key]; c != nil && c.holder != holder {
		c.holder, c.since = holder, now
	}
}

// leaderFor returns the index of the node an attempt on key asks first, or
// -1 when it asks every node at once: an exclusive acquire of a key
// contended within contendedFor, by a caller that waits (eligible: Wait
// set, not a re-entry), goes to the key's leader. A request that does not
// wait (TryLock) asks every node at once: it has one attempt, and must not
// be refused a lock that a quorum has let go because the leader happens to
// be the node whose release has not landed yet. Nor does a waiter's
// attempt when the leader has refused with one holder for fullEvery (see
// above). The leader is
// chosen by rendezvous hashing of the key with the nodes' addresses, so
// that every Client that lists the same addresses, in any order, picks the
// same node, and the next in that ranking when a node failed within
// leaderFailFor.
func (b *Backend) leaderFor(key string, eligible bool) int {
	if !eligible || len(b.nodes) < 2 {
		return -1
	}
	now := time.Now()
	b.mu.Lock()
	c := b.contended[key]
	contended := c != nil && now.Sub(c.at) <= contendedFor
	full := contended && c.holder != "" && now.Sub(c.since) >= fullEvery
	if full {
		c.since = now
	}
	b.mu.Unlock()
	if !contended || full {
		return -1
	}
	return b.leaderOf(key)
}

// leaderOf returns key's leader whether or not the key is contended: the
// first node in the rendezvous ranking that has not failed within
// leaderFailFor, or -1 when all have.
func (b *Backend) leaderOf(key string) int {
	now := time.Now().UnixNano()
	lead, best := -1, uint64(0)
	for _, n := range b.nodes {
		if n.failedUntil.Load() >= now {
			continue
		}
		h := fnv.New64a()
		_, _ = h.Write([]byte(key))
		_, _ = h.Write([]byte{0})
		_, _ = h.Write([]byte(n.addr))
		if s := h.Sum64(); lead < 0 || s > best {
			lead, best = n.index, s
		}
	}
	return lead
}

// failed passes n over as a leader for leaderFailFor.
func (n *node) failed() {
	n.failedUntil.Store(time.Now().Add(leaderFailFor).UnixNano())
}

// The leader's queue. Leader first alone still wakes every waiting Client
// at each release, and each tries. So a waiting request (Wait, the Lock of
// a dlock client) also queues on the leader, and only there: the leader
// asks it as a fair request (driver.AcquireRequest.Fair), which it grants
// only to the head of its queue, and the other nodes are asked as before.
// A release then names the head on the leader, and a Client's listener
// passes on a release that names a waiter only when that waiter is one of
// this Backend's (see queuedHere): one Client tries per release instead of
// all of them. The order is kept by one node, so the nodes never disagree
// on it: the queue decides only which contender goes first, never whether
// a grant is safe, which still takes a quorum. Requests without Wait
// (TryLock), shared ones, and those of a Client that does not see the key
// as contended ignore the queue, as plain requests do on one node.
//
// A head that does not come (its process died) keeps the lock free until
// its entry lapses (QueueTTL). A Backend that finds the key free but
// promised to another head answers "held" with a HolderTTL of
// promisedRetry, so that its waiter looks again soon, and once it has seen
// that for promisedGrace, its next request ignores the queue.
const (
	promisedRetry = 20 * time.Millisecond
	promisedGrace = 100 * time.Millisecond
	maxQueued     = 4096
)

// queued records that token's request on key is queued on the leader,
// until expires (the entry's end).
func (b *Backend) queued(key, token string, expires time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.waiters == nil || len(b.waiters) >= maxQueued {
		b.waiters = make(map[string]map[string]time.Time) // forget: those waiters then go by their retries until they queue again
	}
	m := b.waiters[key]
	if m == nil {
		m = make(map[string]time.Time)
		b.waiters[key] = m
	}
	m[token] = expires
}

// unqueued forgets token's entry on key: granted, released or gone.
func (b *Backend) unqueued(key, token string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if m := b.waiters[key]; m != nil {
		delete(m, token)
		if len(m) == 0 {
			delete(b.waiters, key)
		}
	}
}

// headHere reports whether a release of key that names token (the head
// of the leader's queue) concerns this Backend's waiters: token is queued
// by this Backend as far as it knows. If so, it remembers that token was
// named, so that its next attempt asks every node at once (see named).
func (b *Backend) headHere(key, token string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	exp, ok := b.waiters[key][token]
	if !ok || !time.Now().Before(exp) {
		return false
	}
	if b.heads == nil || len(b.heads) >= maxQueued {
		b.heads = make(map[string]string)
	}
	b.heads[key] = token
	return true
}

// named reports whether the last release of key that named a waiter of
// this Backend named token, and forgets it. Such a waiter is the one the
// leader lets in, and nobody else is woken: its attempt asks every node at
// once, which saves the round trip to the leader first.
func (b *Backend) named(key, token string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.heads[key] != token {
		return false
	}
	delete(b.heads, key)
	return true
}

// promise records whether an attempt on key found it free but promised
// to another head, and reports how long that has been so (0: not now).
func (b *Backend) promise(key string, promised bool) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !promised {
		delete(b.promised, key)
		return 0
	}
	if b.promised == nil || len(b.promised) >= maxQueued {
		b.promised = make(map[string]time.Time)
	}
	since, ok := b.promised[key]
	if !ok {
		b.promised[key] = time.Now()
		return time.Nanosecond
	}
	return max(time.Since(since), time.Nanosecond)
}

// promisedFor reports how long key has been seen free but promised to
// another head, or 0.
func (b *Backend) promisedFor(key string) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	since, ok := b.promised[key]
	if !ok {
		return 0
	}
	return max(time.Since(since), time.Nanosecond)
}
