// The holds a Backend tracks on its leases: what renewals extend, what a
// release that lost its answer finds gone, and the revoking of leases
// nobody holds on any more.

package etcdlock

import (
	"context"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// track records a grant (or a re-entry, or a renewal found on the store)
// of key to token on l, wanted until deadline.
func (t *leaseTable) track(l *lease, key, token string, fence, modRev int64, count int, ttl time.Duration, deadline time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.trackLocked(l, key, token, fence, modRev, count, ttl, deadline)
}

func (t *leaseTable) trackLocked(l *lease, key, token string, fence, modRev int64, count int, ttl time.Duration, deadline time.Time) {
	id := holdID{key, token}
	if p := t.pending[id]; p != nil && p.lease == l {
		t.untrackLocked(p) // found on l: tracked from now on
	}
	h := t.holds[id]
	if h != nil && (h.fence != fence || h.lease != l) {
		t.untrackLocked(h)
		h = nil
	}
	if h == nil {
		h = &hold{key: key, token: token, lease: l, fence: fence}
		t.holds[id] = h
		l.holds[h] = struct{}{}
	}
	h.modRev, h.count = modRev, count
	h.ttl = max(h.ttl, ttl)
	h.deadline = later(h.deadline, deadline)
}

// tracked returns a copy of the hold of key by token, if the table has one.
func (t *leaseTable) tracked(key, token string) (hold, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.holds[holdID{key, token}]
	if h == nil {
		return hold{}, false
	}
	return *h, true
}

// untrack forgets the hold of key by token, and its pending grant.
func (t *leaseTable) untrack(key, token string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if h := t.holds[holdID{key, token}]; h != nil {
		t.untrackLocked(h)
	}
	if p := t.pending[holdID{key, token}]; p != nil {
		t.untrackLocked(p)
	}
}

func (t *leaseTable) untrackLocked(h *hold) {
	id := holdID{h.key, h.token}
	if t.holds[id] == h {
		delete(t.holds, id)
	}
	if t.pending[id] == h {
		delete(t.pending, id)
	}
	delete(h.lease.holds, h)
}

// pend records, before a transaction that may put key for token on l is
// sent, that the key may be on l, wanted until deadline (the request's
// send time plus its TTL). The caller resolves it once the outcome is
// known; when it is not (the answer was lost, the call's ctx ended), the
// pending hold stays: if nobody tracks the key by its deadline (a renewal
// or a re-entry that finds it, a release of the token), it counts as
// abandoned and retires l, so that a grant nobody knows of expires with
// l instead of living as long as the Backend's other locks keep l alive.
func (t *leaseTable) pend(l *lease, key, token string, deadline time.Time) *hold {
	t.mu.Lock()
	defer t.mu.Unlock()
	id := holdID{key, token}
	if p := t.pending[id]; p != nil {
		// An earlier grant of unknown outcome: it stays on its lease
		// until its deadline (the map names the latest only).
		delete(t.pending, id)
	}
	p := &hold{key: key, token: token, lease: l, deadline: deadline}
	t.pending[id] = p
	l.holds[p] = struct{}{}
	return p
}

// resolve forgets the pending hold p: its transaction's outcome is known
// (a refusal, or a grant that the caller tracks).
func (t *leaseTable) resolve(p *hold) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.untrackLocked(p)
}

// sweep forgets the retired leases that have surely expired on the server
// by now (a retired lease gets no keep-alive; its expiry is at most one
// TTL after the last answer, which came before expires + ttl). t.mu is
// held.
func (t *leaseTable) sweep(now time.Time) {
	for id, l := range t.byID {
		if l.retired && now.After(l.expires.Add(l.ttl)) {
			for h := range l.holds {
				t.untrackLocked(h)
			}
			delete(t.byID, id)
		}
	}
}

// scanEvery bounds how often revokeIdle looks through every hold for
// abandoned ones (a lease that is extended looks at its own each time).
const scanEvery = 250 * time.Millisecond

// revokeIdle starts the revocation of every lease of t.idle that nobody
// can count on any more: a retired lease with no hold left (each live one
// moved at its next renewal, or was released; the abandoned ones were
// dropped when it retired) once its last promised expiry has passed, and a
// queue lease once past its expiry, superseded or not. Until then the server keeps
// the lease by its own clock, so a revocation changes nothing for anyone
// who trusted it: a holder counts on a lease only until the expiry its
// last answered keep-alive (or grant) promised, never beyond. After it,
// the server would expire the lease by itself, except that every new
// leader extends every lease by its TTL (see the top of this file).
//
// It also retires, at most every scanEvery, the leases that carry an
// abandoned hold but that nothing extends (a Backend that renews nothing
// on them). The revocations run in the background, each bounded by
// t.revokeTimeout; one that fails is tried again on a later call, after a
// backoff. Acquire, Release and RenewBatch call it; when nothing is due it
// costs one lock of t.mu.
func (t *leaseTable) revokeIdle() {
	now := time.Now()
	t.mu.Lock()
	if now.Sub(t.scanned) >= scanEvery {
		t.scanned = now
		// A retired lease is scanned too: a hold can be tracked on it
		// after it retired (a renewal that the lease still covered, a
		// move that failed, an answer that came late) and be abandoned
		// there; left, it would keep the lease from being revoked.
		for _, l := range t.byID {
			if !l.dead && l.ka == nil {
				t.retireIfAbandoned(l, now)
			}
		}
		// An entries lease past its expiry was kept alive by nobody:
		// retire it, as a grant handed on it would otherwise outlive it.
		for _, l := range t.byID {
			if l.entries && !l.retired && !l.dead && l.ka == nil && !now.Before(l.expires) {
				t.retire(l)
			}
		}
		// A queue lease past its expiry is never handed out again (see
		// forQueue): revoke it even when nothing superseded it.
		for b, l := range t.queue {
			if !now.Before(l.expires) {
				delete(t.queue, b)
				t.idle[l] = struct{}{}
			}
		}
	}
	var due []*lease
	for l := range t.idle {
		if l.revoking || l.ka != nil || len(l.holds) > 0 || now.Before(l.expires) || now.Before(l.retryAt) {
			continue
		}
		l.revoking = true
		due = append(due, l)
	}
	if len(due) > 0 {
		t.revokes.Add(len(due))
	}
	t.mu.Unlock()
	for _, l := range due {
		go t.revoke(l)
	}
}

// revoke revokes l (see revokeIdle).
func (t *leaseTable) revoke(l *lease) {
	defer t.revokes.Done()
	ctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(context.Background()), t.revokeTimeout)
	defer cancel()
	_, err := t.kv.Revoke(ctx, l.id)
	t.mu.Lock()
	defer t.mu.Unlock()
	l.revoking = false
	if err == nil || isLeaseNotFound(err) {
		l.dead, l.retired = true, true
		t.dropLease(l)
		return
	}
	l.backoff = min(max(2*l.backoff, 100*time.Millisecond), 2*time.Second)
	l.retryAt = time.Now().Add(l.backoff)
}

// liveAndGone reports whether the table tracks a hold of key by token on a
// lease that lives now (by its lower bound), while kvs, a read of the key
// made after the hold's last write, shows it gone or changed: a key leaves
// a live lease only by a write, so a release (or handoff) of the hold
// landed. (A forced release, dlock release --force, looks the same.)
func (t *leaseTable) liveAndGone(key, token string, kvs []*mvccpb.KeyValue) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.holds[holdID{key, token}]
	if h == nil || h.lease.dead || !time.Now().Before(h.lease.expires) {
		return false
	}
	return len(kvs) == 0 || kvs[0].ModRevision > h.modRev
}
