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
	// attempt bounds one call to the store (see attempts).
	attempt *attempts
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
	b.attempt = newAttempts(b.timeout)
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

// wrap adds to err what the Backend alone knows, its store ("etcd: err"),
// marked transient when it may heal (see markTransient): the caller names
// the operation and the lock.
func wrap(err error) error {
	return fmt.Errorf("etcd: %w", markTransient(context.Background(), err))
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
func wrapCtx(ctx context.Context, err error) error {
	cerr := ctxend.Err(ctx)
	if cerr == nil {
		return wrap(err)
	}
	if !errors.Is(err, cerr) {
		err = fmt.Errorf("%w: %w", cerr, err)
	}
	return fmt.Errorf("etcd: %w", err)
}

// Acquire implements driver.Backend. A new grant is one transaction that
// puts the holder's key on a lease of the backend's; its fence is that
// transaction's revision, the create revision of the key.
func (b *Backend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	if b.nsErr != nil {
		return driver.AcquireResult{}, wrap(b.nsErr)
	}
	if req.LockDelay > 0 || req.Claim || (req.Handoff && (b.noHandoff || !req.Fair || !req.Wait || req.Reentrant || req.Mode != driver.Exclusive)) {
		return driver.AcquireResult{}, wrap(fmt.Errorf("%w: lock-delay and claims are not supported by etcdlock, handoff only with a fair exclusive wait and WithHandoff on", driver.ErrInvalid))
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
			return driver.AcquireResult{}, wrap(fmt.Errorf("%w: unknown mode %v", driver.ErrInvalid, req.Mode))
		}
		if err != nil {
			// Start over after a transient error: a grant that the
			// failed attempt made is found under req.Token and claimed
			// (see claimGrant). Not for a reentrant token, whose grant
			// may be another call's, nor after a write that must not be
			// repeated (onceError).
			if req.Reentrant || !mayRepeat(ctx, err) || !sleep(ctx, pause/2+rand.N(pause)) {
				return driver.AcquireResult{}, wrapCtx(caller, err)
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
	err = b.attempt.run(ctx, func(ctx context.Context) error {
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
	err = b.attempt.repeat(ctx, func(ctx context.Context) error {
		resp, err = b.c.Txn(ctx).If(cmps...).Then(then...).Else(els...).Commit()
		return err
	})
	return resp, err
}

// get is a Get repeated after transient errors while ctx lasts.
func (b *Backend) get(ctx context.Context, key string, opts ...clientv3.OpOption) (resp *clientv3.GetResponse, err error) {
	err = b.attempt.repeat(ctx, func(ctx context.Context) error {
		resp, err = b.c.Get(ctx, key, opts...)
		return err
	})
	return resp, err
}

func rangeKVs(resp *clientv3.TxnResponse, i int) []*mvccpb.KeyValue {
	return resp.Responses[i].GetResponseRange().GetKvs()
}

// remaining returns the time to live of lease id, or 0 when unknown. It
// costs a round trip, so it is asked for a TryLock's refusal only: a
// waiter needs no time to poll at, as the watch tells it of the expiry.
func (b *Backend) remaining(ctx context.Context, waiting bool, id int64) time.Duration {
	if id == 0 || waiting {
		return 0
	}
	var resp *clientv3.LeaseTimeToLiveResponse
	err := b.attempt.repeat(ctx, func(ctx context.Context) (err error) {
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
	err := b.attempt.run(ctx, func(ctx context.Context) (err error) {
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
