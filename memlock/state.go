package memlock

import (
	"sort"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// lockState is everything the store keeps for one key besides its fence
// counter: the exclusive holder, the shared holds, the fair queue and the
// writer intent. It is dropped once none of them is live.
type lockState struct {
	excl   *entry                 // exclusive holder, or nil
	shared map[string]*sharedHold // token → live shared hold
	limit  int                    // Limit of the newest shared grant
	queue  []*waiter              // fair queue, in arrival order
	intent *waiter                // writer intent, or nil
}

type entry struct {
	holds    map[string]int // token → hold count
	acquired time.Time
	owner    string
	fence    uint64
	pseq     uint64        // the Seq of the last proclaim applied (driver.Proclaimer)
	expires  time.Time     // when the lease expires
	delay    time.Duration // lock-delay: the entry outlives expires by this much
}

// expired reports whether the lease has expired; the entry then only keeps
// others out until its lock-delay ends.
func (e *entry) expired(now time.Time) bool { return !now.Before(e.expires) }

// free is when the lock becomes free if nobody renews or releases it.
func (e *entry) free() time.Time { return e.expires.Add(e.delay) }

// ttl is the time left until the entry stops keeping others out.
func (e *entry) ttl(now time.Time) time.Duration {
	if e.expired(now) {
		return e.free().Sub(now)
	}
	return e.expires.Sub(now)
}

// sharedHold is one reader or semaphore permit: a lease of its own.
type sharedHold struct {
	owner    string
	fence    uint64
	acquired time.Time
	expires  time.Time
}

// waiter is a fair queue entry or a writer intent.
type waiter struct {
	token   string
	owner   string
	expires time.Time
}

func newState() *lockState { return &lockState{shared: make(map[string]*sharedHold)} }

// prune drops what has lapsed by now.
func (st *lockState) prune(now time.Time) {
	if st.excl != nil && !now.Before(st.excl.free()) {
		st.excl = nil
	}
	for token, h := range st.shared {
		if !now.Before(h.expires) {
			delete(st.shared, token)
		}
	}
	q := st.queue[:0]
	for _, w := range st.queue {
		if now.Before(w.expires) {
			q = append(q, w)
		}
	}
	clear(st.queue[len(q):])
	st.queue = q
	if st.intent != nil && !now.Before(st.intent.expires) {
		st.intent = nil
	}
}

// empty reports whether nothing is left to keep.
func (st *lockState) empty() bool {
	return st.excl == nil && len(st.shared) == 0 && len(st.queue) == 0 && st.intent == nil
}

// held reports whether the lock has an exclusive holder or shared holds.
func (st *lockState) held() bool { return st.excl != nil || len(st.shared) > 0 }

// position returns token's 1-based place in the queue, or 0.
func (st *lockState) position(token string) int {
	for i, w := range st.queue {
		if w.token == token {
			return i + 1
		}
	}
	return 0
}

// othersAhead reports whether another token's entry is ahead of token (any
// entry, when token is not queued).
func (st *lockState) othersAhead(token string) bool {
	return len(st.queue) > 0 && st.queue[0].token != token
}

// enqueue puts token at the tail, or refreshes its entry in place.
func (st *lockState) enqueue(token, owner string, expires time.Time) {
	if i := st.position(token); i > 0 {
		w := st.queue[i-1]
		w.owner, w.expires = owner, later(w.expires, expires)
		return
	}
	st.queue = append(st.queue, &waiter{token: token, owner: owner, expires: expires})
}

// dequeue removes token's queue entry and reports whether it was the head.
func (st *lockState) dequeue(token string) (found, head bool) {
	i := st.position(token)
	if i == 0 {
		return false, false
	}
	st.queue = append(st.queue[:i-1], st.queue[i:]...)
	return true, i == 1
}

// leave removes token's queue entry and writer intent, reporting whether that
// may let another waiter in: the intent went, or the queue head went while
// the lock has no exclusive holder.
func (st *lockState) leave(token string) (wake bool) {
	if st.intent != nil && st.intent.token == token {
		st.intent = nil
		wake = true
	}
	if _, head := st.dequeue(token); head && st.excl == nil {
		wake = true
	}
	return wake
}

// next is the token a notification of the release of an exclusive hold or
// of a queue entry names: the queue head when the lock has no exclusive
// holder and the queue is not empty, else "".
func (st *lockState) next() string {
	if st.excl == nil && len(st.queue) > 0 {
		return st.queue[0].token
	}
	return ""
}

// sharedByExpiry returns the shared holds, the first to expire first.
func (st *lockState) sharedByExpiry() []*sharedHold {
	hs := make([]*sharedHold, 0, len(st.shared))
	for _, h := range st.shared {
		hs = append(hs, h)
	}
	sort.Slice(hs, func(i, j int) bool { return hs[i].expires.Before(hs[j].expires) })
	return hs
}

// info describes the lock at now.
func (st *lockState) info(key string, now time.Time) driver.LockInfo {
	info := driver.LockInfo{Key: key, Queued: len(st.queue), WriterWaiting: st.intent != nil}
	if e := st.excl; e != nil {
		holds := 0
		for _, n := range e.holds {
			holds += n
		}
		info.Owner, info.Fence, info.Holds = e.owner, e.fence, holds
		info.TTL, info.HeldFor = e.ttl(now), now.Sub(e.acquired)
		info.Delayed = e.expired(now)
	}
	if len(st.shared) > 0 {
		info.Limit = st.limit
		hs := st.sharedByExpiry()
		sort.Slice(hs, func(i, j int) bool { return hs[i].fence < hs[j].fence })
		for _, h := range hs {
			info.Shared = append(info.Shared, driver.SharedHold{Owner: h.owner, Fence: h.fence, TTL: h.expires.Sub(now)})
		}
	}
	return info
}

// later returns the later of a and b: renewals extend, never shorten.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
