package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// sqlite is the SQLite dialect. Times are integer milliseconds since the
// Unix epoch from {now}, which SQLite keeps fixed within one statement;
// durations travel as milliseconds.
type sqlite struct {
	db    *sql.DB
	stmts stmtCache
	// The statements below, with the table's name and the clock filled in.
	acquireSQL, holderSQL, renewSQL, releaseSQL string
	inspectSQL, listSQL, forceReleaseSQL        string
	renewBatchHead, renewBatchTail              string
}

// sqliteNow is the database's clock in milliseconds.
const sqliteNow = `CAST(round(unixepoch('subsec') * 1000) AS INTEGER)`

func newSQLite(db *sql.DB, table string) *sqlite {
	t := withTable(table)
	fill := func(q string) string { return strings.ReplaceAll(t(q), "{now}", sqliteNow) }
	head, tail, _ := strings.Cut(sqliteRenewBatch, "{values}")
	return &sqlite{
		db:              db,
		stmts:           stmtCache{db: db},
		acquireSQL:      fill(sqliteAcquire),
		holderSQL:       fill(sqliteHolder),
		renewSQL:        fill(sqliteRenew),
		releaseSQL:      fill(sqliteRelease),
		inspectSQL:      fill(sqliteInspect),
		listSQL:         fill(sqliteList),
		forceReleaseSQL: fill(sqliteForceRelease),
		renewBatchHead:  fill(head),
		renewBatchTail:  fill(tail),
	}
}

const (
	// In DO UPDATE, bare column names are the existing row's and
	// excluded.acquired_at is this statement's {now}. No row comes back when
	// the lock is held by another owner.
	sqliteAcquire = `INSERT INTO {t} (name, token, owner, fence, holds, acquired_at, expires_at)
VALUES (?1, ?2, ?3, 1, 1, {now}, {now} + ?4)
ON CONFLICT (name) DO UPDATE SET
  fence       = CASE WHEN token = excluded.token AND expires_at > excluded.acquired_at THEN fence ELSE fence + 1 END,
  holds       = CASE WHEN token = excluded.token AND expires_at > excluded.acquired_at THEN holds + 1 ELSE 1 END,
  acquired_at = CASE WHEN token = excluded.token AND expires_at > excluded.acquired_at THEN acquired_at ELSE excluded.acquired_at END,
  owner       = CASE WHEN token = excluded.token AND expires_at > excluded.acquired_at THEN owner ELSE excluded.owner END,
  expires_at  = CASE WHEN token = excluded.token AND expires_at > excluded.acquired_at
                THEN max(expires_at, excluded.expires_at) ELSE excluded.expires_at END,
  token       = excluded.token
WHERE token IS NULL OR expires_at <= excluded.acquired_at OR (token = excluded.token AND ?5)
RETURNING fence, holds`

	sqliteHolder = `SELECT owner, expires_at - {now} FROM {t}
WHERE name = ?1 AND token IS NOT NULL AND expires_at > {now}`

	sqliteRenew = `UPDATE {t} SET expires_at = max(expires_at, {now} + ?3)
WHERE name = ?1 AND token = ?2 AND expires_at > {now}`

	sqliteRenewBatch = `WITH r(name, token, ttl) AS (VALUES {values})
UPDATE {t} SET expires_at = max(expires_at, {now} + r.ttl)
FROM r WHERE {t}.name = r.name AND {t}.token = r.token AND {t}.expires_at > {now}
RETURNING {t}.name, {t}.token`

	sqliteRelease = `UPDATE {t} SET holds = holds - 1, token = CASE WHEN holds > 1 THEN token END
WHERE name = ?1 AND token = ?2 AND expires_at > {now}
RETURNING holds`

	sqliteInspect = `SELECT name, owner, fence, holds, expires_at - {now}, {now} - acquired_at
FROM {t} WHERE name = ?1 AND token IS NOT NULL AND expires_at > {now}`

	// substr and length count characters, alike for both sides; LIKE would
	// ignore the case of ASCII letters.
	sqliteList = `SELECT name, owner, fence, holds, expires_at - {now}, {now} - acquired_at
FROM {t} WHERE substr(name, 1, length(?1)) = ?1 AND token IS NOT NULL AND expires_at > {now}
ORDER BY name`

	sqliteForceRelease = `UPDATE {t} SET token = NULL
WHERE name = ?1 AND token IS NOT NULL AND expires_at > {now}
RETURNING name, owner, fence, holds, expires_at - {now}, {now} - acquired_at`
)

// acquire is one statement when it grants. When it does not, a second one
// reads the holder: on a local file that costs microseconds. A release in
// between leaves the holder unknown, and Backend.Acquire tries once more.
func (s *sqlite) acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	var fence int64
	var holds int
	err := s.stmts.queryRow(ctx, s.acquireSQL,
		req.Key, req.Token, req.Owner, units(req.TTL, time.Millisecond), req.Reentrant,
	).Scan(&fence, &holds)
	if err == nil {
		return driver.AcquireResult{Acquired: true, Fence: uint64(fence), Holds: holds}, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return driver.AcquireResult{}, err
	}
	var res driver.AcquireResult
	var ttlMS int64
	err = s.stmts.queryRow(ctx, s.holderSQL, req.Key).Scan(&res.Holder, &ttlMS)
	if errors.Is(err, sql.ErrNoRows) {
		return driver.AcquireResult{}, nil
	}
	if err != nil {
		return driver.AcquireResult{}, err
	}
	res.HolderTTL = time.Duration(max(ttlMS, 0)) * time.Millisecond
	return res, nil
}

func (s *sqlite) renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	res, err := s.stmts.exec(ctx, s.renewSQL, key, token, units(ttl, time.Millisecond))
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

func (s *sqlite) renewBatch(ctx context.Context, reqs []driver.RenewRequest) ([]bool, error) {
	var q strings.Builder
	q.WriteString(s.renewBatchHead)
	args := make([]any, 0, 3*len(reqs))
	for i, r := range reqs {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString("(?, ?, ?)")
		args = append(args, r.Key, r.Token, units(r.TTL, time.Millisecond))
	}
	q.WriteString(s.renewBatchTail)
	rows, err := s.db.QueryContext(ctx, q.String(), args...)
	if err != nil {
		return nil, err
	}
	return renewedRows(rows, reqs)
}

func (s *sqlite) release(ctx context.Context, key, token string) (driver.ReleaseResult, error) {
	return scanRelease(s.stmts.queryRow(ctx, s.releaseSQL, key, token))
}

func (s *sqlite) inspect(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	return queryInfo(ctx, s.db, time.Millisecond, s.inspectSQL, key)
}

func (s *sqlite) list(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	return queryInfos(ctx, s.db, time.Millisecond, s.listSQL, prefix)
}

func (s *sqlite) forceRelease(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	return queryInfo(ctx, s.db, time.Millisecond, s.forceReleaseSQL, key)
}
