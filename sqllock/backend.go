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
)

var (
	_ driver.Backend      = (*Backend)(nil)
	_ driver.BatchRenewer = (*Backend)(nil)
	_ driver.Inspector    = (*Backend)(nil)
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
	table   string // as given to WithTable
	quoted  string // quoted for the dialect
	eng     engine
	err     error // a bad dialect or table name, returned by every call

	create   bool
	createMu sync.Mutex
	created  atomic.Bool
}

// engine is one dialect's statements.
type engine interface {
	acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error)
	renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error)
	// renewBatch renews at most batchSize leases with distinct key and
	// token pairs in one statement where it can and reports which were held.
	renewBatch(ctx context.Context, reqs []driver.RenewRequest) ([]bool, error)
	release(ctx context.Context, key, token string) (driver.ReleaseResult, error)
	inspect(ctx context.Context, key string) (driver.LockInfo, bool, error)
	list(ctx context.Context, prefix string) ([]driver.LockInfo, error)
	forceRelease(ctx context.Context, key string) (driver.LockInfo, bool, error)
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
	b := &Backend{db: db, dialect: d, table: o.table, create: o.create}
	b.quoted, b.err = quoteTable(d, o.table)
	if b.err == nil && db == nil {
		b.err = errors.New("nil *sql.DB")
	}
	if b.err != nil {
		return b
	}
	switch d {
	case MySQL:
		b.eng = newMySQL(db, b.quoted)
	case PostgreSQL:
		b.eng = newPostgres(db, b.quoted)
	case SQLite:
		b.eng = newSQLite(db, b.quoted)
	}
	return b
}

// Dialect returns the dialect the Backend was made for.
func (b *Backend) Dialect() Dialect { return b.dialect }

// Table returns the lock table's name, as given to WithTable.
func (b *Backend) Table() string { return b.table }

// Acquire grants the lock to req.Token in one statement when the row is free
// or expired (a new fence, one more than the row's last) or held by
// req.Token with req.Reentrant (one more hold, the same fence). Otherwise
// it reports the holder's owner and remaining TTL, with a nil error. The
// package documentation lists the round trips per dialect. Errors come from
// the database, or from a key, token or owner over its limit.
//
// When ctx ends while its statement is on the way, Acquire still waits up to
// 200ms for the answer, so that a grant the server makes anyway is not left
// behind unknown (see acquireInFlight).
func (b *Backend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	err := b.check(ctx, req.Key, req.Token)
	if err == nil && len(req.Owner) > MaxOwnerLength {
		err = fmt.Errorf("owner is %d bytes, over %d", len(req.Owner), MaxOwnerLength)
	}
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return driver.AcquireResult{}, opError(ctx, "acquire", req.Key, err)
	}
	res, err := b.acquire(ctx, req)
	if err != nil {
		return driver.AcquireResult{}, opError(ctx, "acquire", req.Key, err)
	}
	return res, nil
}

// acquire runs the dialect's acquire (again while SQLite finds the file
// locked). A refusal without a holder means that the row was granted,
// released or expired while the statements ran: the lock may well be free
// now, so it tries once more, while ctx lasts, rather than report an unknown
// holder. MySQL's acquire already tries again itself when the row changes
// between its statements.
func (b *Backend) acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	try := func() (driver.AcquireResult, error) { return b.acquireInFlight(ctx, req) }
	res, err := retryBusy(ctx, b.dialect, try)
	if err == nil && !res.Acquired && res.Holder == "" && b.dialect != MySQL && ctx.Err() == nil {
		res, err = retryBusy(ctx, b.dialect, try)
	}
	return res, err
}

// Renew extends the lease of key to ttl from now, by the database's clock,
// if token holds it and it has not expired; it never shortens it. It
// reports false, with a nil error, when token is not the holder.
func (b *Backend) Renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	if err := b.check(ctx, key, token); err != nil {
		return false, opError(ctx, "renew", key, err)
	}
	held, err := retryBusy(ctx, b.dialect, func() (bool, error) { return b.eng.renew(ctx, key, token, ttl) })
	if err != nil {
		return false, opError(ctx, "renew", key, err)
	}
	return held, nil
}

// Release drops one hold of token in one statement. The last hold frees the
// row (its token becomes NULL; the row and its fence stay) and, on
// PostgreSQL, notifies listeners in the same statement. Held is false, with
// a nil error, when token did not hold the lock or its lease had expired.
func (b *Backend) Release(ctx context.Context, key, token string) (driver.ReleaseResult, error) {
	if err := b.check(ctx, key, token); err != nil {
		return driver.ReleaseResult{}, opError(ctx, "release", key, err)
	}
	res, err := retryBusy(ctx, b.dialect, func() (driver.ReleaseResult, error) { return b.eng.release(ctx, key, token) })
	if err != nil {
		return driver.ReleaseResult{}, opError(ctx, "release", key, err)
	}
	return res, nil
}

// opError describes a failed operation on key. When the caller's deadline
// has passed, a driver may report only its own timeout ("i/o timeout" from
// a dial cut short), a moment before ctx.Err() is set; the error then says
// context.DeadlineExceeded too, so that callers can tell a wait that ran out
// from a store that failed.
func opError(ctx context.Context, op, key string, err error) error {
	cause := ctx.Err()
	if d, ok := ctx.Deadline(); ok && cause == nil && !time.Now().Before(d) {
		cause = context.DeadlineExceeded
	}
	if cause != nil && !errors.Is(err, cause) {
		return fmt.Errorf("sqllock: %s %q: %w (%w)", op, key, err, cause)
	}
	return fmt.Errorf("sqllock: %s %q: %w", op, key, err)
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
