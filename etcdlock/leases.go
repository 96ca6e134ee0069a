package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The grants of one Backend share etcd leases: one lease per TTL bucket
// (the TTL rounded up to whole seconds, as etcd's leases count), so that
// keeping a thousand locks alive costs one LeaseKeepAlive per bucket and
// interval, not one per lock.
//
// A shared lease must not keep alive a lock that its holder stopped
// renewing (WithAutoRenew(false), a holder whose renewals failed past its
// deadline): etcd cannot extend one key of a lease and not another. So the
// table remembers, for every hold on its leases, until when its holder
// asked to keep it (the last acquire or renewal, plus its TTL). Before a
// keep-alive it looks for holds past that time; when it finds one, it
// retires the lease instead: the lease gets no more keep-alives and
// expires with the abandoned holds, and each live hold moves to a fresh
// lease at its next renewal, in one transaction that checks that the key
// is still the same grant on the old lease (its create revision, which is
// its fence, stays). Moving costs one write per live lock, and only then.
//
// A retired lease is then revoked, once no live hold is left on it and the
// last expiry its keep-alives promised has passed (see revokeIdle), and so
// is a queue lease once past its expiry: etcd extends every
// lease by its full TTL when a new leader takes office, so while leaders
// change faster than a lease's TTL no lease expires by itself, and a grant
// left on one (an orphan, an abandoned hold) would outlive its TTL for as
// long as the elections go on.

// leaseSlack is how much longer than its bucket a lease lives (half of it,
// at least a second), so that a lease that was kept alive a moment ago can
// take a new grant of the bucket's full TTL without another keep-alive.
func leaseSeconds(bucket int64) int64 { return bucket + max(1, (bucket+1)/2) }

// StoreTTL returns how long, at most, the store keeps a lock of the given
// TTL after its holder's last acquire or renewal, when nothing releases it:
// the TTL of the lease it sits on, ttl rounded up to whole seconds plus
// half of that (at least a second). While etcd's leader changes, every new
// leader extends every lease by its TTL once more; the Backend revokes the
// leases it no longer needs (see docs/ETCD.md).
func StoreTTL(ttl time.Duration) time.Duration {
	return time.Duration(leaseSeconds(bucketOf(ttl))) * time.Second
}

// bucketOf is the TTL rounded up to whole seconds.
func bucketOf(ttl time.Duration) int64 {
	return max(1, int64(math.Ceil(ttl.Seconds())))
}

// lease is one etcd lease of the table.
type lease struct {
	id      clientv3.LeaseID
	bucket  int64
	ttl     time.Duration // as granted by the server
	expires time.Time     // lower bound of the server's expiry: send time of the last grant or keep-alive + ttl
	retired bool          // takes no new grants and gets no keep-alives
	// entries: a lease of fair queue entries (see forEntries), keyed by
	// the negated bucket in the table's current and granting.
	entries bool
	dead    bool // the server no longer has it
	holds   map[*hold]struct{}
	ka      *call // keep-alive in flight
	// revoking: a revocation is in flight (see revokeIdle); a failed one
	// is tried again from retryAt, after backoff.
	revoking bool
	retryAt  time.Time
	backoff  time.Duration
}

// hold is one grant on a lease of the table.
type hold struct {
	key      string // the etcd key
	token    string
	lease    *lease
	fence    int64 // create revision of the key
	modRev   int64 // mod revision of our last write of the key
	count    int   // hold count of an exclusive hold as of our last write
	ttl      time.Duration
	deadline time.Time // until when its holder asked to keep it
	// handed: a grant a release handed to token, as its Listener saw it
	// (see adopt), not yet claimed or moved.
	handed bool
}

type holdID struct{ key, token string }

type leaseTable struct {
	kv clientv3.Lease
	// attempt bounds one call (see attempts).
	attempt *attempts
	// term returns the cluster's Raft term by a linearizable read, which
	// only a leader that a majority follows can answer (see keepAlive).
	term func(ctx context.Context) (uint64, error)

	mu      sync.Mutex
	current map[int64]*lease // bucket → the lease that takes new grants
	// granting holds the grant in flight of each bucket, by whether it is
	// patient (see leaseFor).
	granting map[grantKey]*call
	byID     map[clientv3.LeaseID]*lease
	holds    map[holdID]*hold
	pending  map[holdID]*hold // grants on their way to the store (see pend)
	queue    map[int64]*lease // queue-TTL bucket → lease for writer intents (never kept alive)
	// idle holds the leases to revoke (see revokeIdle): retired TTL leases
	// and queue leases that take no more entries.
	idle map[*lease]struct{}
	// scanned is when revokeIdle last looked for abandoned holds.
	scanned time.Time
	// revokeTimeout bounds a revocation; revokes counts those in flight,
	// for tests to wait for.
	revokeTimeout time.Duration
	revokes       sync.WaitGroup
}

func newLeaseTable(l clientv3.Lease, term func(ctx context.Context) (uint64, error)) *leaseTable {
	return &leaseTable{
		kv:       l,
		term:     term,
		current:  make(map[int64]*lease),
		granting: make(map[grantKey]*call),
		byID:     make(map[clientv3.LeaseID]*lease),
		holds:    make(map[holdID]*hold),
		pending:  make(map[holdID]*hold),
		queue:    make(map[int64]*lease),
		idle:     make(map[*lease]struct{}),
	}
}

// errLeaseGone reports that the server no longer has a lease.
var errLeaseGone = errors.New("lease gone")

func isLeaseNotFound(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, errLeaseGone)
}

// forTTL returns a lease that takes grants of ttl and lives at least until
// now + ttl.
func (t *leaseTable) forTTL(ctx context.Context, ttl time.Duration) (*lease, error) {
	b := bucketOf(ttl)
	return t.leaseFor(ctx, b, leaseSeconds(b), ttl, false, false)
}

// forWaitingTTL is forTTL for a request of a waiting call: a grant it
// makes is bounded by ctx alone, not by one attempt (see leaseFor).
func (t *leaseTable) forWaitingTTL(ctx context.Context, ttl time.Duration) (*lease, error) {
	b := bucketOf(ttl)
	return t.leaseFor(ctx, b, leaseSeconds(b), ttl, false, true)
}

// forEntries returns the lease for fair queue entries of queueTTL, which
// lives at least until now + queueTTL. Unlike writer intents and records,
// entries are kept alive with their lease: a queued waiter's request keeps
// its entry by a keep-alive of the lease (one per lease, shared by every
// entry on it), not by writing the entry again, so that it wakes nobody.
// Each entry is tracked on the lease as a hold wanted until its last
// request's send time + queueTTL; an entry past that (a waiter gone whose
// clean-up failed) retires the lease, as an abandoned grant does, and the
// live entries move to a fresh lease at their next request (a put that
// keeps their place). The lease lives a second longer than queueTTL: a
// grant handed over on it (see handoff.go) lives as long, so a longer one
// would hold the lock up longer for a head that died.
func (t *leaseTable) forEntries(ctx context.Context, queueTTL time.Duration) (*lease, error) {
	b := bucketOf(queueTTL)
	return t.leaseFor(ctx, -b, b+1, queueTTL, true, true)
}

// leaseFor returns the current lease of table key b, granted for secs
// seconds, that lives at least until now + ttl.
//
// The bound is taken from the call's start, which is before the send time
// of the request that relies on it. One answer that came late (a loaded
// member) moves the bound to that answer + ttl once, so that the lease still
// covers the caller's next refresh; only once: a member slower than the
// lease's slack over ttl would otherwise be sent keep-alive after
// keep-alive, each answer short of its own bound.
//
// The grant of a patient call (a request of a waiting call) is bounded by
// ctx alone: a loaded member answers a crowd of grants late, and each one
// cut short at one attempt and sent again is one more Raft proposal, and
// one more lease, for the member to make (1,000 fair waiters joining at
// once sent some 1,500 grants a second, and none joined). A grant that
// hangs on a frozen member fails the request, which its waiting call
// tries again.
func (t *leaseTable) leaseFor(ctx context.Context, b, secs int64, ttl time.Duration, entries, patient bool) (*lease, error) {
	need := time.Now().Add(ttl)
	moved := false
	// late moves need to now + ttl after a store call, once.
	late := func() {
		if now := time.Now(); !moved && need.Before(now.Add(ttl)) {
			need, moved = now.Add(ttl), true
		}
	}
	for {
		t.mu.Lock()
		l := t.current[b]
		if l != nil && !l.retired && !l.dead {
			fresh := !l.expires.Before(need)
			t.mu.Unlock()
			if fresh {
				return l, nil
			}
			// A lease retired (abandoned holds) or gone takes no grant:
			// the next round grants a fresh one.
			if err := t.extend(ctx, l, need); err != nil && err != errRetired && !isLeaseNotFound(err) {
				return nil, err
			}
			late()
			t.mu.Lock()
			if t.current[b] == l && (l.retired || l.dead) {
				delete(t.current, b)
			}
			t.mu.Unlock()
			continue
		}
		if c := t.granting[grantKey{b, false}]; c != nil {
			t.mu.Unlock()
			if err := wait(ctx, c); err != nil {
				return nil, err
			}
			continue
		}
		if c := t.granting[grantKey{b, true}]; c != nil {
			t.mu.Unlock()
			if patient {
				if err := wait(ctx, c); err != nil {
					return nil, err
				}
				continue
			}
			// A patient grant that hangs on a frozen member hangs for its
			// caller's whole call: a call bounded by attempts waits one
			// attempt for it, then grants a lease itself.
			if err := waitFor(ctx, c, t.attempt.bound()); err != errWaitedEnough {
				if err != nil {
					return nil, err
				}
				continue
			}
			t.mu.Lock()
			if cur := t.current[b]; t.granting[grantKey{b, false}] != nil || (cur != nil && !cur.retired && !cur.dead) {
				t.mu.Unlock()
				continue
			}
		}
		gk := grantKey{b, patient}
		c := &call{done: make(chan struct{})}
		t.granting[gk] = c
		t.mu.Unlock()

		sent := time.Now()
		var resp *clientv3.LeaseGrantResponse
		// A grant whose answer was lost leaves a lease that nothing
		// uses: it expires by itself.
		grant := func(ctx context.Context) (err error) {
			sent = time.Now()
			resp, err = t.kv.Grant(ctx, secs)
			return err
		}
		var err error
		if patient {
			err = repeat(ctx, grant)
		} else {
			err = t.attempt.repeat(ctx, grant)
		}
		t.mu.Lock()
		delete(t.granting, gk)
		t.sweep(time.Now())
		if cur := t.current[b]; err == nil && (cur == nil || cur.retired || cur.dead) {
			// (A lease granted while another grant of the bucket took
			// its place is left to expire unused.)
			ttl := time.Duration(resp.TTL) * time.Second
			l = &lease{id: resp.ID, bucket: b, ttl: ttl, expires: sent.Add(ttl), entries: entries, holds: make(map[*hold]struct{})}
			t.current[b] = l
			t.byID[l.id] = l
		}
		c.err, c.callerGone = err, err != nil && ctx.Err() != nil
		close(c.done)
		t.mu.Unlock()
		if err != nil {
			return nil, err
		}
		late()
	}
}

// forQueue returns a lease for writer intents that lives at least until
// now + queueTTL. Intents are never kept alive: a request that keeps one
// writes it again on a lease of its own time.
func (t *leaseTable) forQueue(ctx context.Context, queueTTL time.Duration) (clientv3.LeaseID, error) {
	b := bucketOf(queueTTL)
	now := time.Now()
	t.mu.Lock()
	l := t.queue[b]
	t.mu.Unlock()
	if l != nil && !l.expires.Before(now.Add(queueTTL)) {
		return l.id, nil
	}
	sent := time.Now()
	// One second more than the entry needs: the lease is shared by the
	// entries written in its first second, and a grant handed over on an
	// entry's lease (see handoff.go) lives as long as the lease, so a
	// longer one would hold the lock up longer for a head that died.
	var resp *clientv3.LeaseGrantResponse
	err := t.attempt.repeat(ctx, func(ctx context.Context) (err error) {
		sent = time.Now()
		resp, err = t.kv.Grant(ctx, b+1)
		return err
	})
	if err != nil {
		return 0, err
	}
	ttl := time.Duration(resp.TTL) * time.Second
	t.mu.Lock()
	if old := t.queue[b]; old != nil {
		t.idle[old] = struct{}{} // revoked once past its expiry
	}
	t.queue[b] = &lease{id: resp.ID, bucket: b, ttl: ttl, expires: sent.Add(ttl)}
	t.mu.Unlock()
	return resp.ID, nil
}

// forgetQueue drops queue lease id after the server refused it as
// unknown (revoked, or expired sooner than its lower bound said): the next
// forQueue grants another.
func (t *leaseTable) forgetQueue(id clientv3.LeaseID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for b, l := range t.queue {
		if l.id == id {
			delete(t.queue, b)
		}
	}
}

// extend makes l live until need, with one keep-alive shared by every
// caller that needs one at the same time. It returns errLeaseGone when the
// server no longer has l, and errRetired when l has abandoned holds.
func (t *leaseTable) extend(ctx context.Context, l *lease, need time.Time) error {
	for {
		t.mu.Lock()
		switch {
		case l.dead:
			t.mu.Unlock()
			return errLeaseGone
		case !l.expires.Before(need):
			t.mu.Unlock()
			return nil
		case l.retired:
			t.mu.Unlock()
			return errRetired
		}
		if c := l.ka; c != nil {
			t.mu.Unlock()
			if err := wait(ctx, c); err != nil && !isLeaseNotFound(err) {
				return err
			}
			continue
		}
		if t.retireIfAbandoned(l, time.Now()) {
			t.mu.Unlock()
			return errRetired
		}
		c := &call{done: make(chan struct{})}
		l.ka = c
		t.mu.Unlock()

		var sent time.Time
		var resp *clientv3.LeaseKeepAliveResponse
		err := repeat(ctx, func(ctx context.Context) (err error) {
			sent = time.Now()
			resp, err = t.keepAlive(ctx, l.id)
			return err
		})
		t.mu.Lock()
		l.ka = nil
		switch {
		case err == nil:
			l.expires = later(l.expires, sent.Add(time.Duration(resp.TTL)*time.Second))
		case isLeaseNotFound(err):
			l.dead, l.retired = true, true
			t.dropLease(l)
		}
		c.err, c.callerGone = err, err != nil && ctx.Err() != nil
		close(c.done)
		t.mu.Unlock()
		if err != nil && !isLeaseNotFound(err) {
			return err
		}
	}
}

var errRetired = errors.New("lease retired")

// errUnconfirmed reports a keep-alive that a member answered in a Raft
// term that is no longer the cluster's.
var errUnconfirmed = errors.New("lease keep-alive answered by a former leader: not counted")

// keepAlive sends one keep-alive of lease id and counts it only when it
// was served by the cluster's leader. etcd renews leases outside Raft, in
// the leader's memory: a leader that was paused (or cut off) and comes back
// believes it leads until it hears of the new term, and renews a lease in
// that moment, while the real leader keeps the old expiry and revokes the
// lease at it; a holder that trusted the renewal would then meet the next
// holder (etcd 3.4.23 did this in the leader-pause soak: 6 overlaps in
// 10,000 grants). So the keep-alive's term is compared with the term of a
// linearizable read made after it, which a former leader cannot serve: the
// same term means the member that renewed still led after the renewal.
//
// Each of its two calls is one attempt (see attemptFor); extend repeats the
// pair after a transient error.
func (t *leaseTable) keepAlive(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseKeepAliveResponse, error) {
	var resp *clientv3.LeaseKeepAliveResponse
	err := t.attempt.run(ctx, func(ctx context.Context) (err error) {
		resp, err = t.kv.KeepAliveOnce(ctx, id)
		return err
	})
	if err != nil {
		return nil, err
	}
	term, err := t.term(ctx)
	if err != nil {
		return nil, err
	}
	if resp.ResponseHeader == nil || resp.RaftTerm != term {
		return nil, fmt.Errorf("%w (term %d, cluster in term %d)", errUnconfirmed, resp.ResponseHeader.GetRaftTerm(), term)
	}
	return resp, nil
}

// retireIfAbandoned retires l when one of its holds is past the time its
// holder asked to keep it, and forgets those holds. t.mu is held.
func (t *leaseTable) retireIfAbandoned(l *lease, now time.Time) bool {
	abandoned := false
	for h := range l.holds {
		if h.deadline.Before(now) {
			abandoned = true
			t.untrackLocked(h)
		}
	}
	if abandoned {
		t.retire(l)
	}
	return abandoned
}

// retire makes l take no new grants and get no keep-alives, and revoked
// once nobody counts on it (see revokeIdle). t.mu is held.
func (t *leaseTable) retire(l *lease) {
	l.retired = true
	t.idle[l] = struct{}{}
	if t.current[l.bucket] == l {
		delete(t.current, l.bucket)
	}
}

// dropLease forgets l and its holds. t.mu is held.
func (t *leaseTable) dropLease(l *lease) {
	delete(t.idle, l)
	for h := range l.holds {
		t.untrackLocked(h)
	}
	if t.current[l.bucket] == l {
		delete(t.current, l.bucket)
	}
	delete(t.byID, l.id)
}

// mine returns the table's lease with the given id, or nil.
func (t *leaseTable) mine(id clientv3.LeaseID) *lease {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byID[id]
}
