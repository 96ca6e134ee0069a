// The SQL Backend and its lock operations (New, Acquire, Renew, Release,
// Withdraw) through the dialect's engine, and the checks of keys and requests.

package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/ctxend"
)

var (
	_ driver.Backend      = (*Backend)(nil)
	_ driver.BatchRenewer = (*Backend)(nil)
	_ driver.Inspector    = (*Backend)(nil)
	_ driver.Capabler     = (*Backend)(nil)
	_ driver.Withdrawer   = (*Backend)(nil)
)

// Limits on what the table holds, in bytes. The dlock client already keeps
// names within MaxKeyLength; the checks here protect direct callers.
const (
	MaxKeyLength   = 255  // lock names, key prefix included
	MaxTokenLength = 255  // owner tokens (32 hex digits, or a WithOwnerID value)
	MaxOwnerLength = 2048 // owner descriptions (host, pid, time and metadata)
)

// Backend is a dlock store in one table of a SQL database. It is safe for
// concurrent use. It does not own the *sql.DB: close that yourself, after the
// dlock client that uses the Backend is closed.
type Backend struct {
	db      *sql.DB
	dialect Dialect
	table   string     // as given to WithTable
	names   tableNames // quoted for the dialect
	eng     engine
	tx      *txs
	err     error // a bad dialect or table name, returned by every call

	create   bool
	createMu sync.Mutex
	created  atomic.Bool

	// wake, when set (NewSQLite), wakes the host's listeners after a
	// release that may let a waiter in.
	wake *localWake
	// gate, on a SQLiteBackend, paces its lock operations (writeGate).
	gate *writeGate
	// peekFair: a fair waiter's request reads before it writes (see
	// txs.fairFirst); off where releases wake the waiters (NewPostgres).
	peekFair bool
	polls    pollers
}

// pollers remembers the fair waiters that a Backend answered with a queue
// place (see acquirePolled), until their token is granted, released or
// withdrawn. A waiter that vanished without either is forgotten once
// pollersMax are remembered and it has not asked for pollersIdle: every
// waiter asks at least every third of its entry's time to live (at most
// 5 s by default), and one forgotten too soon only costs its next request
// the read. The sweep runs at most every pollersSweep: with more than
// pollersMax live waiters, a sweep on every answer would scan them all
// each time, under mu.
type pollers struct {
	mu    sync.Mutex
	m     map[pollerKey]time.Time
	swept time.Time // the last sweep
}

type pollerKey struct{ key, token string }

const (
	pollersMax   = 4096
	pollersIdle  = time.Minute
	pollersSweep = time.Second
	// busyFor is how long after a request on a key was queued a first
	// request on it goes to the transaction at once (see busy).
	busyFor = time.Second
)

// busy reports whether a fair request on key was answered with a queue
// place within busyFor: a first request there would only be queued, and
// the UPDATE that takes a lock nobody waits for (acquirePolled) would be a
// statement more. (The mark is kept as the waiter of token "", which no
// request has.)
func (p *pollers) busy(key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := p.m[pollerKey{key, ""}]
	return ok && time.Since(at) < busyFor
}

// waiting reports whether token is a waiter on key that was answered with
// a queue place.
func (p *pollers) waiting(key, token string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.m[pollerKey{key, token}]
	return ok
}

// answered records the answer to req, a fair request with Wait.
func (p *pollers) answered(req driver.AcquireRequest, res driver.AcquireResult, err error) {
	if err != nil {
		return
	}
	k := pollerKey{req.Key, req.Token}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !res.Queued || res.Acquired {
		delete(p.m, k)
		return
	}
	now := time.Now()
	if p.m == nil {
		p.m = make(map[pollerKey]time.Time)
	}
	if len(p.m) >= pollersMax && now.Sub(p.swept) >= pollersSweep {
		p.swept = now
		for k, at := range p.m {
			if now.Sub(at) > pollersIdle {
				delete(p.m, k)
			}
		}
	}
	p.m[k] = now
	p.m[pollerKey{req.Key, ""}] = now
}

// forget drops token's record on key: it released or withdrew.
func (p *pollers) forget(key, token string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.m, pollerKey{key, token})
}

// engine is one dialect's single statements for the common operations on
// exclusive holds; what takes a transaction, or is alike in every dialect,
// is in txs.
type engine interface {
	// acquire makes or refuses a plain exclusive grant (not Fair). Refused
	// with Wait because of shared holds, it records the writer intent.
	acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error)
	// acquireShared makes or refuses a shared grant where the dialect has
	// a shorter way than txs.acquireShared; ok false leaves it to that.
	acquireShared(ctx context.Context, req driver.AcquireRequest) (res driver.AcquireResult, ok bool, err error)
	// renew renews an exclusive lease, of the grant of fence when it is not
	// 0; more reports, when it was not held, that token may have a shared
	// hold (for txs.renew).
	renew(ctx context.Context, key, token string, fence uint64, ttl time.Duration) (held, more bool, err error)
	// renewBatch renews at most batchSize exclusive leases with distinct
	// key and token pairs in one statement where it can, and reports which
	// were held, and which of the others may be shared holds. A request
	// with a Fence renews only the grant of that fence.
	renewBatch(ctx context.Context, reqs []driver.RenewRequest) (held, more []bool, err error)
	// release drops one exclusive hold, of the grant of fence when it is
	// not 0; more reports, when token held none, that it may have a shared
	// hold, a queue entry or an intent (for txs.release).
	release(ctx context.Context, key, token string, fence uint64) (res driver.ReleaseResult, more bool, err error)
}

// New returns a Backend that keeps its locks in a table of db, which must be
// a database of dialect d. It does no I/O: the table is created, if missing,
// before the first operation (see WithoutCreateTable). A bad dialect or
// table name is reported by every call.
//
// On PostgreSQL, NewPostgres returns the same Backend with LISTEN/NOTIFY
// wake-ups for waiters.
func New(db *sql.DB, d Dialect, opts ...Option) *Backend {
	o := options{table: DefaultTable, create: true}
	for _, opt := range opts {
		opt.apply(&o)
	}
	// Where releases are not announced, fair waiters poll: each poll reads
	// first (see txs.fairFirst). NewPostgres turns that off.
	b := &Backend{db: db, dialect: d, table: o.table, create: o.create, peekFair: true}
	b.names, b.err = quoteTables(d, o.table)
	if b.err == nil && db == nil {
		b.err = errors.New("nil *sql.DB")
	}
	if b.err != nil {
		return b
	}
	b.tx = newTxs(db, d, b.names)
	switch d {
	case MySQL:
		b.eng = newMySQL(db, b.tx)
	case PostgreSQL:
		b.eng = newPostgres(db, b.tx)
	case SQLite:
		b.eng = newSQLite(db, b.tx)
	}
	return b
}

// Dialect returns the dialect the Backend was made for.
func (b *Backend) Dialect() Dialect { return b.dialect }

// Table returns the lock table's name, as given to WithTable.
func (b *Backend) Table() string { return b.table }

// Acquire grants the lock to req.Token, or reports who keeps it out, with a
// nil error.
//
// A plain exclusive request is one statement when the row is free or
// expired (a new fence, one more than the row's last) or held by req.Token
// with req.Reentrant (one more hold, the same fence); the row also carries
// what a writer must know about shared holds (shared_until, the latest
// expiry of the name's shared holds) and waiting writers (the intent), so
// that row locking alone keeps the grant exact. Refused with Wait because
// of shared holds, it records req.Token's writer intent with one more
// statement. Shared requests, and Fair ones, run in a transaction that
// locks the row first (on PostgreSQL a reader without Limit is one
// statement too); where waiters poll (not NewPostgres), a fair waiter's
// later requests read first, one statement while the lock is not theirs
// yet (see acquirePolled). The package documentation lists the round
// trips. Errors
// come from the database, or from a key, token or owner over its limit, or
// a request the contract does not allow (an unknown Mode, a negative
// Limit, Wait without a QueueTTL).
//
// When ctx ends while its statement is on the way, Acquire still waits up to
// 200ms for the answer, so that a grant the server makes anyway is not left
// behind unknown (see acquireInFlight).
func (b *Backend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	err := b.check(ctx, req.Key, req.Token)
	if err == nil && len(req.Owner) > MaxOwnerLength {
		err = fmt.Errorf("%w: owner is %d bytes, over %d", driver.ErrInvalid, len(req.Owner), MaxOwnerLength)
	}
	if err == nil {
		err = checkRequest(req)
	}
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return driver.AcquireResult{}, b.opError(ctx, err)
	}
	res, err := b.acquire(ctx, req)
	if err != nil {
		return driver.AcquireResult{}, b.opError(ctx, err)
	}
	return res, nil
}

// checkRequest refuses what the contract does not allow.
func checkRequest(req driver.AcquireRequest) error {
	switch {
	case req.Mode != driver.Exclusive && req.Mode != driver.Shared:
		return fmt.Errorf("unknown mode %v", req.Mode)
	case req.Limit < 0:
		return fmt.Errorf("limit %d, want >= 0", req.Limit)
	case req.Wait && req.QueueTTL <= 0:
		return fmt.Errorf("wait with queue TTL %v, want > 0", req.QueueTTL)
	}
	return nil
}

// acquire runs the acquire (again while SQLite finds the file locked). A
// plain refusal without a holder means that the row was granted, released
// or expired while the statements ran: the lock may well be free now, so it
// tries once more, while ctx lasts, rather than report an unknown holder.
// MySQL's acquire already tries again itself when the row changes between
// its statements; a Fair request refused without a holder waits for the
// queue, and the transaction that said so saw it right.
func (b *Backend) acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	if req.Claim && req.Wait && !req.Fair && req.Mode == driver.Exclusive && b.dialect != PostgreSQL {
		res, decided, err := retryBusy3(ctx, b.dialect, func() (driver.AcquireResult, bool, error) { return b.tx.claimFirst(ctx, req) })
		if err != nil || decided {
			return res, err
		}
	}
	if req.Fair && req.Mode == driver.Exclusive && (b.dialect == MySQL || b.dialect == PostgreSQL) &&
		!b.polls.waiting(req.Key, req.Token) && !b.polls.busy(req.Key) {
		// A first request (a Lock's first attempt, or a TryLock) on a name
		// where this Backend has queued nobody of late: one UPDATE takes a
		// free lock that nobody waits for; else the statements below
		// answer.
		if res, ok, err := b.takeHead(ctx, req, true); err != nil || ok {
			return res, err
		}
	}
	if req.Fair && req.Wait && req.Mode == driver.Exclusive && b.peekFair {
		res, err := b.acquirePolled(ctx, req)
		b.polls.answered(req, res, err)
		return res, err
	}
	res, err := b.acquireWritten(ctx, req)
	if req.Fair && req.Wait && req.Mode == driver.Exclusive {
		b.polls.answered(req, res, err) // marks the name busy (see pollers.busy)
	}
	return res, err
}

// acquirePolled is acquire for an exclusive fair request with Wait where
// waiters poll: the request of a waiter that this Backend has answered with
// a queue place reads first (txs.fairFirst), and goes on to the
// transaction only when the read cannot answer it (on MySQL, a head that
// finds the lock free takes it with txs.takeHead first); a first request,
// which would find no entry of its token, goes to the transaction at once
// (acquire has tried the one-UPDATE take where it may).
func (b *Backend) acquirePolled(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	if b.polls.waiting(req.Key, req.Token) {
		// Like the transaction's (acquireInFlight), the read's answer is
		// waited for a while after ctx ends: it changed nothing, and an
		// error would leave the caller an outcome it must take as unknown.
		type peeked struct {
			res           driver.AcquireResult
			decided, free bool
		}
		p, err := inFlight(ctx, func(ctx context.Context) (peeked, error) {
			return retryBusy(ctx, b.dialect, func() (p peeked, err error) {
				p.res, p.decided, p.free, err = b.tx.fairFirst(ctx, req)
				return p, err
			})
		})
		if err != nil || p.decided {
			return p.res, err
		}
		if err := ctx.Err(); err != nil {
			return driver.AcquireResult{}, err // no writes once the caller gave up
		}
		if p.free && b.dialect == MySQL {
			// The head of a polled queue finding the lock free: two
			// statements, where the transaction takes six (txs.takeHead).
			if res, ok, err := b.takeHead(ctx, req, false); err != nil || ok {
				return res, err
			}
		}
	}
	return b.acquireWritten(ctx, req)
}

// takeHead runs txs.takeHead as Acquire runs its statements: through
// deadlocks, and for a while after ctx ends (acquireInFlight).
func (b *Backend) takeHead(ctx context.Context, req driver.AcquireRequest, first bool) (driver.AcquireResult, bool, error) {
	type taken struct {
		res driver.AcquireResult
		ok  bool
	}
	tk, err := inFlight(ctx, func(ctx context.Context) (taken, error) {
		return retryBusy(ctx, b.dialect, func() (tk taken, err error) {
			tk.res, tk.ok, err = b.tx.takeHead(ctx, req, first)
			return tk, err
		})
	})
	return tk.res, tk.ok, err
}

// acquireWritten is acquire by the statements that may write.
func (b *Backend) acquireWritten(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	try := func() (driver.AcquireResult, error) { return b.acquireInFlight(ctx, req) }
	run := func() (driver.AcquireResult, error) {
		if req.Fair {
			return retryGated(ctx, b, false, try)
		}
		// Plain requests, claims included, are paced by SQLite's busy
		// handler: woken at once, they cost more statements than they
		// save (see writeGate).
		return retryBusy(ctx, b.dialect, try)
	}
	res, err := run()
	if err == nil && !res.Acquired && res.Holder == "" && !res.Queued && !req.Fair && b.dialect != MySQL && ctx.Err() == nil {
		res, err = run()
	}
	return res, err
}

// retryBusy3 is retryBusy for an operation with two results.
func retryBusy3[T any](ctx context.Context, d Dialect, op func() (T, bool, error)) (T, bool, error) {
	type pair struct {
		v  T
		ok bool
	}
	p, err := retryBusy(ctx, d, func() (pair, error) {
		v, ok, err := op()
		return pair{v, ok}, err
	})
	return p.v, p.ok, err
}

// acquireOnce sends req the way its kind takes.
func (b *Backend) acquireOnce(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	switch {
	case req.Mode == driver.Shared:
		if res, ok, err := b.eng.acquireShared(ctx, req); ok || err != nil {
			return res, err
		}
		return b.tx.acquireShared(ctx, req)
	case req.Fair:
		return b.tx.acquireFair(ctx, req)
	}
	return b.eng.acquire(ctx, req)
}

// Supports reports that every dialect has read-write locks (shared holds
// with writer intents), semaphores and fair locks (driver.Capabler). On
// MySQL and SQLite, which have no notifications, fair waiters are woken by
// the dlock client's polling.
func (b *Backend) Supports(c driver.Capability) bool {
	switch c {
	case driver.CapShared, driver.CapSemaphore, driver.CapFair, driver.CapClaim:
		return true
	}
	return false
}

// Renew extends the lease of key to ttl from now, by the database's clock,
// if token holds it and it has not expired; it never shortens it. An
// exclusive lease is one statement; a shared hold, which that statement
// does not find, is renewed in a transaction that also raises the name's
// shared_until. It reports false, with a nil error, when token holds
// neither.
func (b *Backend) Renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	return b.renew(ctx, key, token, 0, ttl)
}

// RenewGrant is Renew tied to the grant it extends (driver.GrantRenewer):
// when token holds the lock under another fence (its owner ID was granted
// the lock again after this grant expired), it extends nothing and
// reports false.
func (b *Backend) RenewGrant(ctx context.Context, key, token string, fence uint64, ttl time.Duration) (bool, error) {
	return b.renew(ctx, key, token, fence, ttl)
}

func (b *Backend) renew(ctx context.Context, key, token string, fence uint64, ttl time.Duration) (bool, error) {
	if err := b.check(ctx, key, token); err != nil {
		return false, b.opError(ctx, err)
	}
	held, err := retryGated(ctx, b, true, func() (bool, error) {
		held, more, err := b.eng.renew(ctx, key, token, fence, ttl)
		if err != nil || held || !more {
			return held, err
		}
		ok, err := b.tx.renew(ctx, []driver.RenewRequest{{Key: key, Token: token, TTL: ttl, Fence: fence}})
		return err == nil && ok[0], err
	})
	if err != nil {
		return false, b.opError(ctx, err)
	}
	return held, nil
}

// Release drops one hold of token. An exclusive hold is one statement: the
// last hold frees the row (its token becomes NULL; the row and its fence
// stay) and, on PostgreSQL, notifies listeners in the same statement, naming
// the head of the lock's fair queue. When token holds no exclusive hold, its
// shared hold, queue entry and writer intent are removed in a transaction,
// which recomputes the name's shared_until from the shared holds left and
// notifies. Held is false, with a nil error, when token held nothing live
// (a queue entry or an intent is not a hold).
func (b *Backend) Release(ctx context.Context, key, token string) (driver.ReleaseResult, error) {
	return b.release(ctx, key, token, 0)
}

// ReleaseGrant is Release tied to the grant it ends (driver.GrantReleaser):
// when token holds the lock under another fence (its owner ID was granted
// the lock again after this grant expired), it changes no hold and answers
// as for a token that held nothing.
func (b *Backend) ReleaseGrant(ctx context.Context, key, token string, fence uint64) (driver.ReleaseResult, error) {
	return b.release(ctx, key, token, fence)
}

func (b *Backend) release(ctx context.Context, key, token string, fence uint64) (driver.ReleaseResult, error) {
	if err := b.check(ctx, key, token); err != nil {
		return driver.ReleaseResult{}, b.opError(ctx, err)
	}
	queued := b.polls.waiting(key, token)
	b.polls.forget(key, token)
	var head *string
	res, err := retryGated(ctx, b, fence > 0, func() (driver.ReleaseResult, error) {
		var res driver.ReleaseResult
		var more bool
		var err error
		if n, ok := b.eng.(namingReleaser); ok && b.wake != nil {
			res, head, more, err = n.releaseNaming(ctx, key, token, fence)
		} else {
			res, more, err = b.eng.release(ctx, key, token, fence)
		}
		// A release without a fence that found no exclusive hold may be
		// the clean-up of a request still on its way: it records the
		// token (see goneTTL).
		record := fence == 0 && b.recordsGone()
		if err != nil || res.Held || (!more && !record) {
			return res, err
		}
		return b.tx.release(ctx, key, token, false, record)
	})
	if err == nil && res.Held && fence == 0 && queued && b.dialect == MySQL {
		// A clean-up (no fence) that found the hold of a token this
		// Backend answered with a queue place, and saw granted by no
		// answer: a fair head's take (txs.takeHead) whose deletion of the
		// token's entry did not run or was not answered. That entry,
		// still live, would stay ahead of every waiter until it expired;
		// deleting it is what the deletion did. Other releases without a
		// fence (a plain Release of a hold) keep their one statement.
		err = b.tx.dropEntry(ctx, key, token)
	}
	if err != nil {
		return driver.ReleaseResult{}, b.opError(ctx, err)
	}
	if res.Held && res.Remaining == 0 && b.wake != nil {
		next := ""
		if head != nil {
			next = *head
		}
		b.wake.send(key, next)
	}
	return res, nil
}

// namingReleaser is an engine whose release of an exclusive hold can also
// name the head of the lock's fair queue, for the wake-up it sends.
type namingReleaser interface {
	// releaseNaming is engine.release, with the queue's live head when the
	// last hold went and there is one.
	releaseNaming(ctx context.Context, key, token string, fence uint64) (res driver.ReleaseResult, head *string, more bool, err error)
}

// Withdraw removes token's fair queue entry and writer intent, if any, in
// one transaction that changes no hold (driver.Withdrawer), and notifies (on
// PostgreSQL) when that lets a waiter in, as Release does. On MySQL and
// PostgreSQL it records the withdrawal, so that a request of token still
// on its way queues nothing (see goneTTL).
func (b *Backend) Withdraw(ctx context.Context, key, token string) error {
	if err := b.check(ctx, key, token); err != nil {
		return b.opError(ctx, err)
	}
	b.polls.forget(key, token)
	_, err := retryGated(ctx, b, false, func() (driver.ReleaseResult, error) {
		return b.tx.release(ctx, key, token, true, b.recordsGone())
	})
	if err != nil {
		return b.opError(ctx, err)
	}
	return nil
}

// opError describes a failed operation with what the Backend alone knows,
// its store ("sqlite: err"): the caller names the operation and the lock.
// It is marked with driver.Transient when it may heal (see transient). When the caller's
// deadline has passed, a driver may report only its own timeout ("i/o
// timeout" from a dial cut short), a moment before ctx.Err() is set; the
// error then says context.DeadlineExceeded too, so that callers can tell a
// wait that ran out from a store that failed.
func (b *Backend) opError(ctx context.Context, err error) error {
	cause := ctxend.Err(ctx)
	if cause != nil && !errors.Is(err, cause) {
		return fmt.Errorf("%s: %w (%w)", b.StoreName(), err, cause)
	}
	return markTransient(ctx, fmt.Errorf("%s: %w", b.StoreName(), err))
}

// check validates a key and token and creates the table if needed.
func (b *Backend) check(ctx context.Context, key, token string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if token == "" || len(token) > MaxTokenLength {
		return fmt.Errorf("token is %d bytes, want 1 to %d", len(token), MaxTokenLength)
	}
	return b.ready(ctx)
}

func checkKey(key string) error {
	if key == "" || len(key) > MaxKeyLength {
		return fmt.Errorf("key is %d bytes, want 1 to %d", len(key), MaxKeyLength)
	}
	return nil
}

// units converts a TTL to a whole number of units (microseconds or
// milliseconds), rounding up so that a lease never lives shorter than asked,
// and never below 1.
func units(d, unit time.Duration) int64 {
	return max(int64((d+unit-1)/unit), 1)
}

// scanRelease reads the remaining hold count that a release statement with
// RETURNING gives back; no row means the token did not hold the lock.
func scanRelease(row rowScanner) (driver.ReleaseResult, error) {
	var holds int
	err := row.Scan(&holds)
	if errors.Is(err, sql.ErrNoRows) {
		return driver.ReleaseResult{}, nil
	}
	if err != nil {
		return driver.ReleaseResult{}, err
	}
	return driver.ReleaseResult{Held: true, Remaining: holds}, nil
}
