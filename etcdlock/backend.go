package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/ctxend"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

var (
	_ driver.Backend       = (*Backend)(nil)
	_ driver.Capabler      = (*Backend)(nil)
	_ driver.BatchRenewer  = (*Backend)(nil)
	_ driver.Notifier      = (*Backend)(nil)
	_ driver.Withdrawer    = (*Backend)(nil)
	_ driver.Inspector     = (*Backend)(nil)
	_ driver.Breaker       = (*Backend)(nil)
	_ driver.GrantReleaser = (*Backend)(nil)
	_ driver.GrantRenewer  = (*Backend)(nil)
)

// DefaultNamespace is the prefix of every etcd key the backend writes,
// unless WithNamespace sets another.
const DefaultNamespace = "dlock/"

// Option configures a Backend.
type Option interface{ apply(*Backend) }

type optionFunc func(*Backend)

func (f optionFunc) apply(b *Backend) { f(b) }

// WithNamespace sets the prefix of every etcd key the backend writes, so
// that several applications can share a cluster. Backends must agree on it
// to see each other's locks. The default is DefaultNamespace, "dlock/".
//
// A namespace other than "" must end with '/': the lock's name follows it directly, so
// that namespace "app/x" and name "y" would share their keys with
// namespace "app/" and name "xy". Acquire refuses to work, with
// dlock.ErrInvalid, under a namespace that does not end with '/'.
func WithNamespace(ns string) Option { return optionFunc(func(b *Backend) { b.ns = ns }) }

// WithTimeout bounds every call to the store whose context has no earlier
// deadline: etcd's client waits for a reachable member for as long as the
// context lets it, and a store that is down must fail a call (an Unlock
// after a loss, a release at Close) rather than hang it. The default is 3s,
// more than a leader election takes with etcd's default timings.
func WithTimeout(d time.Duration) Option { return optionFunc(func(b *Backend) { b.timeout = d }) }

// defaultTimeout is WithTimeout's default.
const defaultTimeout = 3 * time.Second

// WithHandoff turns the direct handoff (see handoff.go) on or off; it is
// on by default. With it off, the Backend does not report
// driver.CapHandoff, so its Clients' fair waiters queue as before the
// handoff (plain queue entries), and no release, this Backend's or
// another's, hands them the lock: every grant they get is a key they
// create, whose fence is its create revision.
//
// Turn it off on every process of a namespace while any process on it runs
// a version of etcdlock without the handoff (see docs/ETCD.md, "Upgrading
// to the handoff"): such a version reads a handed grant's fence as the
// create revision of the lock's key, which is an earlier holder's fence.
func WithHandoff(on bool) Option { return optionFunc(func(b *Backend) { b.noHandoff = !on }) }

// Backend is a dlock backend on an etcd cluster. Make one with New; it is
// safe for concurrent use. It holds no long-lived goroutine of its own: a
// Listener's watches end with Close, its leases expire on the server when
// nothing renews them, and the revocation of a lease it no longer needs
// (see leases.go) runs in the background for at most the call timeout.
type Backend struct {
	c       *clientv3.Client
	ns      string
	nsErr   error // a namespace that does not end with '/' (see WithNamespace)
	timeout time.Duration
	// attempt bounds one call to the store (see attemptFor).
	attempt time.Duration
	leases  *leaseTable
	// noHandoff: WithHandoff(false).
	noHandoff bool

	// queued holds the (key, token) pairs this Backend queued in a fair
	// queue and has not seen leave it, with their entries' create
	// revisions (their places): their next fair acquire reads first, the
	// others try a grant at once (see acquireFair). A Listener watches the
	// entry ahead of the oldest of them (see notify.go), and is told of
	// changes on queuedCh.
	queuedMu sync.Mutex
	queued   map[holdID]int64
	queuedCh chan struct{}
	// hints holds, per lock, the head of its fair queue as this Backend
	// last saw it, for a release to hand the lock to (see lastHold).
	hints map[string]headHint
}

// maxQueued bounds queued; past it the set starts over (a forgotten
// waiter's next attempt costs one more round trip).
const maxQueued = 4096

// setQueued records that token is queued for key with an entry of create
// revision at, or (at 0) that it left the queue; leaving also forgets the
// entry's hold on its lease (see leaseTable.forEntries).
func (b *Backend) setQueued(key, token string, at int64) {
	b.queuedMu.Lock()
	id := holdID{key, token}
	old, had := b.queued[id]
	switch {
	case at == 0:
		delete(b.queued, id)
	case len(b.queued) >= maxQueued && !had:
		clear(b.queued)
		fallthrough
	default:
		b.queued[id] = at
	}
	changed := old != at
	ch := b.queuedCh
	if changed {
		b.queuedCh = make(chan struct{})
	}
	b.queuedMu.Unlock()
	if changed {
		close(ch)
	}
	if at == 0 && had {
		b.leases.untrack(b.queueKey(key, token), token)
	}
}

// dropQueued is setQueued(key, token, 0) when token's place is still at.
func (b *Backend) dropQueued(key, token string, at int64) {
	b.queuedMu.Lock()
	same := b.queued[holdID{key, token}] == at
	b.queuedMu.Unlock()
	if same {
		b.setQueued(key, token, 0)
	}
}

// queuedAt returns the create revision of token's entry in key's queue as
// this Backend last saw it, or 0 when it has not queued it.
func (b *Backend) queuedAt(key, token string) int64 {
	b.queuedMu.Lock()
	defer b.queuedMu.Unlock()
	return b.queued[holdID{key, token}]
}

func (b *Backend) isQueued(key, token string) bool { return b.queuedAt(key, token) > 0 }

// oldestQueued returns the token of this Backend's that is queued for key
// with the oldest entry, with its place, and a channel closed at the next
// change of the queued set.
func (b *Backend) oldestQueued(key string) (token string, at int64, changed <-chan struct{}) {
	b.queuedMu.Lock()
	defer b.queuedMu.Unlock()
	for id, rev := range b.queued {
		if id.key == key && (at == 0 || rev < at) {
			token, at = id.token, rev
		}
	}
	return token, at, b.queuedCh
}

// bound limits ctx to the backend's call timeout.
//
// Every call also requires a leader (clientv3.WithRequireLeader): a member
// that knows it has none (cut off from the majority) answers at once with
// an error, instead of holding the call until its own request timeout.
func (b *Backend) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx = clientv3.WithRequireLeader(ctx)
	if b.timeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, b.timeout)
}

// New returns a backend on the cluster that c reaches. The caller keeps
// ownership of c and closes it after the dlock Client that uses the
// backend. Make c from a config passed through Configure, so that a
// frozen or half-open member's connection is closed (see docs/ETCD.md,
// "Gray failures").
func New(c *clientv3.Client, opts ...Option) *Backend {
	b := &Backend{c: c, ns: DefaultNamespace, timeout: defaultTimeout, queued: make(map[holdID]int64), queuedCh: make(chan struct{}), hints: make(map[string]headHint)}
	for _, o := range opts {
		o.apply(b)
	}
	if b.ns != "" && !strings.HasSuffix(b.ns, "/") {
		b.nsErr = fmt.Errorf("%w: etcd namespace %q must end with '/' (names follow it directly: %q with name \"y\" would be the keys of another namespace's names)", driver.ErrInvalid, b.ns, b.ns)
	}
	b.attempt = attemptFor(b.timeout)
	b.leases = newLeaseTable(c.Lease, b.term)
	b.leases.attempt = b.attempt
	b.leases.revokeTimeout = b.timeout
	if b.timeout <= 0 {
		b.leases.revokeTimeout = defaultTimeout // a revocation is never unbounded
	}
	return b
}

// Supports implements driver.Capabler: etcdlock has read-write locks,
// semaphores, fair locks, overtake reports (with which the client lets a
// plain Mutex's starving waiters join the fair queue) and the direct
// handoff (see handoff.go), unless WithHandoff turned it off. It has no
// claims or lock-delay: the client refuses lock-delay with ErrInvalid.
func (b *Backend) Supports(c driver.Capability) bool {
	switch c {
	case driver.CapShared, driver.CapSemaphore, driver.CapFair, driver.CapOvertook:
		return true
	case driver.CapHandoff:
		return !b.noHandoff
	}
	return false
}

// maxAttempts bounds the optimistic retries of one call whose transaction
// found the lock changed since it read it.
const maxAttempts = 32

// wrap names the operation and the lock in err, marked transient when it
// may heal (see markTransient).
func wrap(op, key string, err error) error {
	return fmt.Errorf("etcdlock: %s %q: %w", op, key, markTransient(context.Background(), err))
}

// wrapCtx is wrap, saying also that the caller's ctx ended when it did: a
// deadline that reached the server comes back as etcd's "request timed
// out", which does not tell that the caller gave up.
//
// A deadline counts once it has passed, even before ctx's timer has run
// (on a loaded machine the answer can come first).
//
// The error is marked transient only while ctx is alive: the end of the
// caller's own ctx is no store failure.
func wrapCtx(ctx context.Context, op, key string, err error) error {
	cerr := ctxend.Err(ctx)
	if cerr == nil {
		return wrap(op, key, err)
	}
	if !errors.Is(err, cerr) {
		err = fmt.Errorf("%w: %w", cerr, err)
	}
	return fmt.Errorf("etcdlock: %s %q: %w", op, key, err)
}

// Acquire implements driver.Backend. A new grant is one transaction that
// puts the holder's key on a lease of the backend's; its fence is that
// transaction's revision, the create revision of the key.
func (b *Backend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	if b.nsErr != nil {
		return driver.AcquireResult{}, wrap("acquire", req.Key, b.nsErr)
	}
	if req.LockDelay > 0 || req.Claim || (req.Handoff && (b.noHandoff || !req.Fair || !req.Wait || req.Reentrant || req.Mode != driver.Exclusive)) {
		return driver.AcquireResult{}, wrap("acquire", req.Key, fmt.Errorf("%w: lock-delay and claims are not supported by etcdlock, handoff only with a fair exclusive wait and WithHandoff on", driver.ErrInvalid))
	}
	b.leases.revokeIdle()
	caller := ctx
	ctx, cancel := b.bound(ctx)
	defer cancel()
	var (
		res driver.AcquireResult
		err error
	)
	pause := 25 * time.Millisecond
	retried := false // an earlier attempt of this call failed: it may have landed
	for range maxAttempts {
		var retry bool
		switch req.Mode {
		case driver.Exclusive:
			if req.Fair {
				res, retry, err = b.acquireFair(ctx, req, retried)
			} else {
				res, retry, err = b.acquireExclusive(ctx, req, retried)
			}
		case driver.Shared:
			res, retry, err = b.acquireShared(ctx, req, retried)
		default:
			return driver.AcquireResult{}, wrap("acquire", req.Key, fmt.Errorf("%w: unknown mode %v", driver.ErrInvalid, req.Mode))
		}
		if err != nil {
			// Start over after a transient error: a grant that the
			// failed attempt made is found under req.Token and claimed
			// (see claimGrant). Not for a reentrant token, whose grant
			// may be another call's, nor after a write that must not be
			// repeated (onceError).
			if req.Reentrant || !mayRepeat(ctx, err) || !sleep(ctx, pause/2+rand.N(pause)) {
				return driver.AcquireResult{}, wrapCtx(caller, "acquire", req.Key, err)
			}
			pause = min(2*pause, 250*time.Millisecond)
			retried = true
			continue
		}
		if !retry {
			return res, nil
		}
	}
	return res, nil // changed under us every time: refused, try again later
}

// txn runs one transaction, as one attempt (see attemptFor): a write that
// its caller starts over, or repeats, after a transient error.
func (b *Backend) txn(ctx context.Context, cmps []clientv3.Cmp, then, els []clientv3.Op) (resp *clientv3.TxnResponse, err error) {
	err = attempt(ctx, b.attempt, func(ctx context.Context) error {
		resp, err = b.c.Txn(ctx).If(cmps...).Then(then...).Else(els...).Commit()
		return err
	})
	return resp, err
}

// txnFull runs one transaction bounded by ctx alone, for a write that
// nothing repeats: its operation ends with its error, and a shorter bound
// would only leave more outcomes unknown.
func (b *Backend) txnFull(ctx context.Context, cmps []clientv3.Cmp, then, els []clientv3.Op) (*clientv3.TxnResponse, error) {
	return b.c.Txn(ctx).If(cmps...).Then(then...).Else(els...).Commit()
}

// txnOnce is txnFull for a write that must not be repeated (see
// onceError): a transient error of it ends the operation.
func (b *Backend) txnOnce(ctx context.Context, cmps []clientv3.Cmp, then, els []clientv3.Op) (*clientv3.TxnResponse, error) {
	resp, err := b.txnFull(ctx, cmps, then, els)
	return resp, once(err)
}

// read runs a transaction that writes nothing, or nothing but what a
// repeat writes again unchanged, repeated after transient errors while ctx
// lasts.
func (b *Backend) read(ctx context.Context, cmps []clientv3.Cmp, then, els []clientv3.Op) (resp *clientv3.TxnResponse, err error) {
	err = repeatCall(ctx, b.attempt, func(ctx context.Context) error {
		resp, err = b.c.Txn(ctx).If(cmps...).Then(then...).Else(els...).Commit()
		return err
	})
	return resp, err
}

// get is a Get repeated after transient errors while ctx lasts.
func (b *Backend) get(ctx context.Context, key string, opts ...clientv3.OpOption) (resp *clientv3.GetResponse, err error) {
	err = repeatCall(ctx, b.attempt, func(ctx context.Context) error {
		resp, err = b.c.Get(ctx, key, opts...)
		return err
	})
	return resp, err
}

func rangeKVs(resp *clientv3.TxnResponse, i int) []*mvccpb.KeyValue {
	return resp.Responses[i].GetResponseRange().GetKvs()
}

func (b *Backend) acquireExclusive(ctx context.Context, req driver.AcquireRequest, retried bool) (driver.AcquireResult, bool, error) {
	sent := time.Now()
	l, err := b.leases.forTTL(ctx, req.TTL)
	if err != nil {
		return driver.AcquireResult{}, false, err
	}
	ek, sp, ip := b.exclKey(req.Key), b.sharedPrefix(req.Key), b.intentPrefix(req.Key)
	resp, retry, err := b.grantTxn(ctx, l, ek, req, sent, []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(ek), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(sp), "=", 0).WithPrefix(),
		clientv3.Compare(clientv3.CreateRevision(b.releasedKey(req.Key, req.Token)), "=", 0),
	},
		[]clientv3.Op{
			clientv3.OpPut(ek, exclusive{token: req.Token, holds: 1, ttl: req.TTL, owner: req.Owner}.encode(), clientv3.WithLease(l.id)),
			clientv3.OpDelete(b.intentKey(req.Key, req.Token)),
			clientv3.OpDelete(b.queueKey(req.Key, req.Token)),
			// Overtook: is anyone queued (two keys tell whether another
			// than Token is)?
			clientv3.OpGet(b.queuePrefix(req.Key), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(2)),
		},
		[]clientv3.Op{
			clientv3.OpGet(ek),
			clientv3.OpGet(sp, clientv3.WithPrefix()),
			clientv3.OpGet(ip, clientv3.WithPrefix()),
			clientv3.OpGet(b.releasedKey(req.Key, req.Token), clientv3.WithCountOnly()),
			// QueueLive: is anyone queued?
			clientv3.OpGet(b.queuePrefix(req.Key), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1)),
		})
	if err != nil || retry {
		return driver.AcquireResult{}, retry, err
	}
	rev := resp.Header.Revision
	if resp.Succeeded {
		b.leases.track(l, ek, req.Token, rev, rev, 1, req.TTL, sent.Add(req.TTL))
		overtook := false
		for _, kv := range rangeKVs(resp, 3) {
			if _, _, token, _ := b.parseKey(string(kv.Key)); token != req.Token {
				overtook = true
			}
		}
		return driver.AcquireResult{Acquired: true, Fence: uint64(rev), Holds: 1, Overtook: overtook}, false, nil
	}
	excl, shared, intents := rangeKVs(resp, 0), rangeKVs(resp, 1), rangeKVs(resp, 2)
	var res driver.AcquireResult
	res.Shared = len(shared)
	// A waiter refused while others are queued joins the queue (see
	// driver.AcquireResult.QueueLive): a Client with no queued token does
	// not hear the handoffs between them (see watchFree).
	res.QueueLive = req.Wait && len(rangeKVs(resp, 4)) > 0
	if len(excl) == 1 {
		kv := excl[0]
		e := decodeExclusive(kv.Value)
		if e.token == req.Token && req.Reentrant {
			return b.reenter(ctx, req, kv, e, sent)
		}
		if e.token == req.Token && ownAttempt(retried, req, e.owner) {
			return b.claimGrant(ctx, req, kv, e, sent) // an earlier attempt's
		}
		res.Holder = e.owner
		res.HolderTTL = min(b.remaining(ctx, req.Wait, kv.Lease), e.ttl)
	} else if len(shared) > 0 {
		// The hold that expires last is not known without asking for
		// each lease; the newest is the best guess.
		last := shared[len(shared)-1]
		for _, kv := range shared {
			if kv.CreateRevision > last.CreateRevision {
				last = kv
			}
		}
		_, _, res.Holder = decodeShared(last.Value)
	} else if resp.Responses[3].GetResponseRange().GetCount() > 0 {
		return res, false, nil // released already: see releasedTTL
	} else {
		return res, true, nil // gone between the compare and the read: cannot be, but try again
	}
	if !req.Wait || req.QueueTTL <= 0 {
		return res, false, nil
	}
	// A writer refused by shared holds records its intent, unless another
	// token's is live; one that has an intent keeps it.
	mine, others := false, false
	for _, kv := range intents {
		if _, _, token, _ := b.parseKey(string(kv.Key)); token == req.Token {
			mine = true
		} else {
			others = true
		}
	}
	if others || (!mine && len(excl) == 1) {
		return res, false, nil
	}
	qid, err := b.leases.forQueue(ctx, req.QueueTTL)
	if err != nil {
		return driver.AcquireResult{}, false, err
	}
	put, err := b.txn(ctx,
		append(b.notLeftSince(req.Key, req.Token, rev), clientv3.Compare(clientv3.ModRevision(ip), "<", rev+1).WithPrefix()),
		[]clientv3.Op{clientv3.OpPut(b.intentKey(req.Key, req.Token), req.Owner, clientv3.WithLease(qid))},
		nil)
	if err != nil {
		return driver.AcquireResult{}, false, err
	}
	res.Queued = put.Succeeded
	return res, false, nil
}

// grantTxn runs a transaction that may grant key to req.Token on lease l:
// the grant counts as pending on l (see pend) until the answer, and stays
// so when the outcome is unknown (err). retry reports that the server no
// longer had l, which is forgotten: the caller tries again with another.
func (b *Backend) grantTxn(ctx context.Context, l *lease, key string, req driver.AcquireRequest, sent time.Time, cmps []clientv3.Cmp, then, els []clientv3.Op) (resp *clientv3.TxnResponse, retry bool, err error) {
	p := b.leases.pend(l, key, req.Token, sent.Add(req.TTL))
	resp, err = b.txn(ctx, cmps, then, els)
	if err != nil {
		if isLeaseNotFound(err) {
			b.leases.forget(l)
			return nil, true, nil
		}
		return nil, false, err // outcome unknown: p stays (see pend)
	}
	b.leases.resolve(p)
	return resp, false, nil
}

// reenter adds a hold to token's exclusive grant kv.
func (b *Backend) reenter(ctx context.Context, req driver.AcquireRequest, kv *mvccpb.KeyValue, e exclusive, sent time.Time) (driver.AcquireResult, bool, error) {
	ek := string(kv.Key)
	// The grant must live req.TTL from now, never less than it did: keep
	// its lease alive first, or, when that lease is ours and too short for
	// req.TTL, move the grant to a lease of req.TTL's.
	//
	// A grant on another Backend's lease (an owner ID shared with another
	// process) moves to a lease of ours: that lease's TTL is not ours to
	// trust, and keeping it alive would keep alive whatever else its
	// Backend left on it. The new lease covers the longest TTL the grant's
	// holders asked for, so that the other process's holder, whose next
	// renewal moves the key back to its own lease, keeps it meanwhile.
	leaseOpt := clientv3.WithIgnoreLease()
	l := b.leases.mine(clientv3.LeaseID(kv.Lease))
	foreign := l == nil
	moved := true
	switch {
	case l == nil:
		nl, err := b.leases.forTTL(ctx, max(req.TTL, e.ttl))
		if err != nil {
			return driver.AcquireResult{}, false, err
		}
		l, leaseOpt = nl, clientv3.WithLease(nl.id)
	case bucketOf(req.TTL) > l.bucket:
		nl, err := b.leases.forTTL(ctx, req.TTL)
		if err != nil {
			return driver.AcquireResult{}, false, err
		}
		l, leaseOpt = nl, clientv3.WithLease(nl.id)
	default:
		switch err := b.leases.extend(ctx, l, sent.Add(req.TTL)); {
		case err == errRetired:
			nl, err := b.leases.forTTL(ctx, req.TTL)
			if err != nil {
				return driver.AcquireResult{}, false, err
			}
			l, leaseOpt = nl, clientv3.WithLease(nl.id)
		case isLeaseNotFound(err):
			return driver.AcquireResult{}, true, nil
		case err != nil:
			return driver.AcquireResult{}, false, err
		default:
			moved = false
		}
	}
	fence := fenceOf(kv)
	e = e.rewritten(kv)
	e.holds++
	e.ttl = max(e.ttl, req.TTL)
	// A key moving to l may be left there by a re-entry of unknown
	// outcome: see pend.
	var p *hold
	if moved {
		p = b.leases.pend(l, ek, req.Token, sent.Add(req.TTL))
	}
	// The key's mod revision stands for its create revision (the grant)
	// and its lease too: any write of the key changes it.
	resp, err := b.txnOnce(ctx,
		[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(ek), "=", kv.ModRevision)},
		[]clientv3.Op{
			clientv3.OpPut(ek, e.encode(), leaseOpt),
			clientv3.OpDelete(b.intentKey(req.Key, req.Token)),
		}, nil)
	if err != nil {
		if moved && isLeaseNotFound(err) {
			b.leases.forget(l)
			return driver.AcquireResult{}, true, nil
		}
		return driver.AcquireResult{}, false, err
	}
	if p != nil {
		b.leases.resolve(p)
	}
	if !resp.Succeeded {
		return driver.AcquireResult{}, true, nil
	}
	if foreign {
		b.leases.coverMoved(ctx, l, ek, req.Token, fence, resp.Header.Revision, e.holds, e.ttl, sent.Add(req.TTL))
	} else {
		b.leases.track(l, ek, req.Token, fence, resp.Header.Revision, e.holds, req.TTL, sent.Add(req.TTL))
	}
	return driver.AcquireResult{Acquired: true, Fence: uint64(fence), Holds: e.holds}, false, nil
}

func (b *Backend) acquireShared(ctx context.Context, req driver.AcquireRequest, retried bool) (driver.AcquireResult, bool, error) {
	sent := time.Now()
	ek, sp, ip := b.exclKey(req.Key), b.sharedPrefix(req.Key), b.intentPrefix(req.Key)
	sk := b.sharedKey(req.Key, req.Token)
	// Read first: the limit needs the count of live shared holds, which no
	// compare of etcd's gives; the transaction then checks that no shared
	// hold came since the read (a release since only leaves more room).
	read, err := b.read(ctx, nil, []clientv3.Op{
		clientv3.OpGet(ek),
		clientv3.OpGet(sp, clientv3.WithPrefix()),
		clientv3.OpGet(ip, clientv3.WithPrefix()),
	}, nil)
	if err != nil {
		return driver.AcquireResult{}, false, err
	}
	rev := read.Header.Revision
	excl, shared, intents := rangeKVs(read, 0), rangeKVs(read, 1), rangeKVs(read, 2)
	res := driver.AcquireResult{Shared: len(shared)}
	for _, kv := range shared {
		if string(kv.Key) == sk {
			_, _, owner := decodeShared(kv.Value)
			if ownAttempt(retried, req, owner) {
				// The hold is this request's, granted to an earlier
				// attempt whose answer was lost.
				return b.claimShared(ctx, req, kv, sent)
			}
			res.Holder = owner
			return res, false, nil
		}
	}
	for _, kv := range shared {
		if limit, _, _ := decodeShared(kv.Value); limit != max(req.Limit, 0) {
			// The live shared holds bind the name's kind and limit (a
			// semaphore of another size, a reader on a semaphore's name,
			// a permit beside readers): see driver.AcquireRequest.Limit.
			newest := kv
			for _, o := range shared {
				if o.CreateRevision > newest.CreateRevision {
					newest = o
				}
			}
			_, ttl, owner := decodeShared(newest.Value)
			res.Holder, res.HolderTTL = owner, min(b.remaining(ctx, req.Wait, newest.Lease), ttl)
			res.Conflict, res.HeldLimit = true, limit
			return res, false, nil
		}
	}
	if len(excl) == 1 {
		e := decodeExclusive(excl[0].Value)
		res.Holder = e.owner
		res.HolderTTL = min(b.remaining(ctx, req.Wait, excl[0].Lease), e.ttl)
		return res, false, nil
	}
	if len(intents) > 0 {
		res.Holder, res.WriterWaiting = string(intents[0].Value), true
		res.HolderTTL = b.remaining(ctx, req.Wait, intents[0].Lease)
		return res, false, nil
	}
	if req.Limit > 0 && len(shared) >= req.Limit {
		first := shared[0]
		for _, kv := range shared {
			if kv.CreateRevision < first.CreateRevision {
				first = kv
			}
		}
		_, ttl, owner := decodeShared(first.Value)
		res.Holder = owner
		res.HolderTTL = min(b.remaining(ctx, req.Wait, first.Lease), ttl)
		return res, false, nil
	}
	l, err := b.leases.forTTL(ctx, req.TTL)
	if err != nil {
		return driver.AcquireResult{}, false, err
	}
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(ek), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(ip), "=", 0).WithPrefix(),
		clientv3.Compare(clientv3.CreateRevision(b.releasedKey(req.Key, req.Token)), "=", 0),
	}
	// No shared hold came since the read: a permit needs the count, and
	// every shared request needs the kind and limit the read saw to be
	// the holds' (a permit and a reader that both read an empty name
	// must not both get in).
	cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(sp), "<", rev+1).WithPrefix())
	if req.Limit == 0 {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(sk), "=", 0))
	}
	resp, retry, err := b.grantTxn(ctx, l, sk, req, sent, cmps,
		[]clientv3.Op{clientv3.OpPut(sk, sharedValue(req.Limit, req.TTL, req.Owner), clientv3.WithLease(l.id))}, nil)
	if err != nil || retry {
		return driver.AcquireResult{}, retry, err
	}
	if !resp.Succeeded {
		if n, err := b.get(ctx, b.releasedKey(req.Key, req.Token), clientv3.WithCountOnly()); err == nil && n.Count > 0 {
			return res, false, nil // released already: see releasedTTL
		}
		return res, true, nil
	}
	r := resp.Header.Revision
	b.leases.track(l, sk, req.Token, r, r, 1, req.TTL, sent.Add(req.TTL))
	return driver.AcquireResult{Acquired: true, Fence: uint64(r), Holds: 1}, false, nil
}

// remaining returns the time to live of lease id, or 0 when unknown. It
// costs a round trip, so it is asked for a TryLock's refusal only: a
// waiter needs no time to poll at, as the watch tells it of the expiry.
func (b *Backend) remaining(ctx context.Context, waiting bool, id int64) time.Duration {
	if id == 0 || waiting {
		return 0
	}
	var resp *clientv3.LeaseTimeToLiveResponse
	err := repeatCall(ctx, b.attempt, func(ctx context.Context) (err error) {
		resp, err = b.c.TimeToLive(ctx, clientv3.LeaseID(id))
		return err
	})
	if err != nil || resp.TTL <= 0 {
		return 0
	}
	return time.Duration(resp.TTL) * time.Second
}

// notLeftSince compares that token has neither released key (its r
// record) nor withdrawn from key's queue (its x record) since revision rev,
// the read that a queue entry or writer intent of token follows: such a
// write, sent before its caller gave up and run by the server after the
// clean-up (a cancelled call), would otherwise stay behind, heading the
// queue of a lock that nobody waits for under that token. A request read
// after the record is not held back.
func (b *Backend) notLeftSince(key, token string, rev int64) []clientv3.Cmp {
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(b.releasedKey(key, token)), "<", rev+1),
		clientv3.Compare(clientv3.ModRevision(b.withdrawnKey(key, token)), "<", rev+1),
	}
}

// term returns the cluster's Raft term, by a linearizable read of a key in
// the namespace (which a user with rights on the namespace may read).
func (b *Backend) term(ctx context.Context) (uint64, error) {
	var resp *clientv3.GetResponse
	err := attempt(ctx, b.attempt, func(ctx context.Context) (err error) {
		resp, err = b.c.Get(ctx, b.ns+sep+"term", clientv3.WithCountOnly())
		return err
	})
	if err != nil {
		return 0, err
	}
	return resp.Header.RaftTerm, nil
}

// forget retires l after the server refused it as unknown.
func (t *leaseTable) forget(l *lease) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l.dead, l.retired = true, true
	t.dropLease(l)
}

// claimShared answers a shared request with the hold kv of its token,
// which an earlier attempt of the request made when its answer was lost
// (a token is drawn per shared request): it moves the key to a lease of
// req.TTL, as claimGrant does. The fence is the key's create revision.
func (b *Backend) claimShared(ctx context.Context, req driver.AcquireRequest, kv *mvccpb.KeyValue, sent time.Time) (driver.AcquireResult, bool, error) {
	sk := string(kv.Key)
	l, err := b.leases.forTTL(ctx, req.TTL)
	if err != nil {
		return driver.AcquireResult{}, false, err
	}
	resp, retry, err := b.grantTxn(ctx, l, sk, req, sent, []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(sk), "=", kv.ModRevision)},
		[]clientv3.Op{clientv3.OpPut(sk, "", clientv3.WithIgnoreValue(), clientv3.WithLease(l.id))}, nil)
	if err != nil || retry {
		return driver.AcquireResult{}, retry, err
	}
	if !resp.Succeeded {
		return driver.AcquireResult{}, true, nil // changed since the read: read again
	}
	b.leases.track(l, sk, req.Token, kv.CreateRevision, resp.Header.Revision, 1, req.TTL, sent.Add(req.TTL))
	return driver.AcquireResult{Acquired: true, Fence: uint64(kv.CreateRevision), Holds: 1}, false, nil
}

// ownAttempt reports whether a grant of req's token, written for owner,
// may be one that an earlier attempt of the same Acquire call made
// (retried) when its answer was lost. A token is not always drawn per
// call: another process with the same owner ID (not reentrant) holds its
// own grant of the token, which is not this call's to take.
func ownAttempt(retried bool, req driver.AcquireRequest, owner string) bool {
	return retried && owner == req.Owner
}
