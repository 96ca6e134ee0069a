package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// Inspect describes the lock named key in one statement: its owner, the
// fence and hold count of the current grant, its remaining TTL and how long
// it has been held, both by the database's clock. ok is false, with a nil
// error, when the lock is free or expired.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	if err := b.checkName(ctx, key); err != nil {
		return driver.LockInfo{}, false, opError(ctx, "inspect", key, err)
	}
	info, ok, err := retryInfo(ctx, b.dialect, func() (driver.LockInfo, bool, error) { return b.eng.inspect(ctx, key) })
	if err != nil {
		return driver.LockInfo{}, false, opError(ctx, "inspect", key, err)
	}
	return info, ok, nil
}

// List describes every held lock whose key starts with prefix (all of them
// for ""), sorted by key, in one statement.
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	if err := b.ready(ctx); err != nil {
		return nil, opError(ctx, "list", prefix, err)
	}
	infos, err := retryBusy(ctx, b.dialect, func() ([]driver.LockInfo, error) { return b.eng.list(ctx, prefix) })
	if err != nil {
		return nil, opError(ctx, "list", prefix, err)
	}
	return infos, nil
}

// ForceRelease frees the lock named key whoever holds it and returns what
// it removed; ok is false, with a nil error, when it was not held. The row
// and its fence stay, so the next grant still draws a larger fence, and the
// holder finds out at its next renewal. On PostgreSQL it is one statement
// that also notifies waiters; on SQLite one statement; on MySQL a SELECT
// and an UPDATE that frees the row only if the same grant still holds it.
func (b *Backend) ForceRelease(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	if err := b.checkName(ctx, key); err != nil {
		return driver.LockInfo{}, false, opError(ctx, "force release", key, err)
	}
	info, ok, err := retryInfo(ctx, b.dialect, func() (driver.LockInfo, bool, error) { return b.eng.forceRelease(ctx, key) })
	if err != nil {
		return driver.LockInfo{}, false, opError(ctx, "force release", key, err)
	}
	return info, ok, nil
}

// retryInfo is retryBusy for an operation that returns a lock description
// and whether there was one.
func retryInfo(ctx context.Context, d Dialect, op func() (driver.LockInfo, bool, error)) (driver.LockInfo, bool, error) {
	type found struct {
		info driver.LockInfo
		ok   bool
	}
	f, err := retryBusy(ctx, d, func() (found, error) {
		info, ok, err := op()
		return found{info, ok}, err
	})
	return f.info, f.ok, err
}

func (b *Backend) checkName(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	return b.ready(ctx)
}

// scanInfo reads one row of (name, owner, fence, holds, ttl, held for),
// with both durations in unit.
func scanInfo(row interface{ Scan(...any) error }, unit time.Duration) (driver.LockInfo, error) {
	var (
		info         driver.LockInfo
		fence        int64
		ttl, heldFor int64
	)
	if err := row.Scan(&info.Key, &info.Owner, &fence, &info.Holds, &ttl, &heldFor); err != nil {
		return driver.LockInfo{}, err
	}
	info.Fence = uint64(max(fence, 0))
	info.TTL = time.Duration(max(ttl, 0)) * unit
	info.HeldFor = time.Duration(max(heldFor, 0)) * unit
	return info, nil
}

// queryInfo runs a query that returns at most one lock description.
func queryInfo(ctx context.Context, db *sql.DB, unit time.Duration, query string, args ...any) (driver.LockInfo, bool, error) {
	info, err := scanInfo(db.QueryRowContext(ctx, query, args...), unit)
	if errors.Is(err, sql.ErrNoRows) {
		return driver.LockInfo{}, false, nil
	}
	if err != nil {
		return driver.LockInfo{}, false, err
	}
	return info, true, nil
}

// queryInfos runs a query that returns lock descriptions.
func queryInfos(ctx context.Context, db *sql.DB, unit time.Duration, query string, args ...any) ([]driver.LockInfo, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var infos []driver.LockInfo
	for rows.Next() {
		info, err := scanInfo(rows, unit)
		if err != nil {
			return nil, err
		}
		infos = append(infos, info)
	}
	return infos, rows.Err()
}
