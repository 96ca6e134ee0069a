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
// So while a key is contended, an exclusive acquire goes to one node first,
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
const (
	contendedFor  = time.Second
	leaderFailFor = time.Second
	maxContended  = 4096
)

// contend records that an attempt on key was refused.
func (b *Backend) contend(key string) {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.contended == nil || len(b.contended) >= maxContended {
		b.contended = make(map[string]time.Time) // forget: keys only lose the leader for a moment
	}
	b.contended[key] = now
}

// leaderFor returns the index of the node an attempt on key asks first, or
// -1 when it asks every node at once: an exclusive acquire of a key
// contended within contendedFor goes to the key's leader. The leader is
// chosen by rendezvous hashing of the key with the nodes' addresses, so
// that every Client that lists the same addresses, in any order, picks the
// same node, and the next in that ranking when a node failed within
// leaderFailFor.
func (b *Backend) leaderFor(key string, exclusive bool) int {
	if !exclusive || len(b.nodes) < 2 {
		return -1
	}
	b.mu.Lock()
	t, ok := b.contended[key]
	b.mu.Unlock()
	if !ok || time.Since(t) > contendedFor {
		return -1
	}
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
