// The SQLite dialect: its acquire, renew and release statements and the code
// that runs them.

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
	tx    *txs
	stmts stmtCache
	// The statements below, with the table's name and the clock filled in.
	acquireSQL, renewSQL, releaseSQL, releaseNamingSQL string
	renewBatchHead, renewBatchTail                     string
}

// sqliteNow is the database's clock in milliseconds.
const sqliteNow = `CAST(round(unixepoch('subsec') * 1000) AS INTEGER)`

func newSQLite(db *sql.DB, tx *txs) *sqlite {
	fill := tx.x.expand
	head, tail, _ := strings.Cut(sqliteRenewBatch, "{values}")
	return &sqlite{
		db:               db,
		tx:               tx,
		stmts:            stmtCache{db: db},
		acquireSQL:       fill(sqliteAcquire),
		renewSQL:         fill(sqliteRenew),
		releaseSQL:       fill(sqliteRelease),
		releaseNamingSQL: fill(sqliteReleaseNaming),
		renewBatchHead:   fill(head),
		renewBatchTail:   fill(tail),
	}
}

const (
	// In DO UPDATE, bare column names are the existing row's and
	// excluded.acquired_at is this statement's {now}. No row comes back when
	// the lock is held by another owner, has live shared holds, or another
	// token's live claim reserves the next grant (a re-entry goes in). A
	// grant drops the token's writer intent and claim, and ones that have
	// lapsed.
	sqliteAcquire = `INSERT INTO {t} (name, token, owner, fence, holds, acquired_at, expires_at)
VALUES (?1, ?2, ?3, 1, 1, {now}, {now} + ?4)
ON CONFLICT (name) DO UPDATE SET
  fence        = CASE WHEN token = excluded.token AND expires_at > excluded.acquired_at THEN fence ELSE fence + 1 END,
  holds        = CASE WHEN token = excluded.token AND expires_at > excluded.acquired_at THEN holds + 1 ELSE 1 END,
  acquired_at  = CASE WHEN token = excluded.token AND expires_at > excluded.acquired_at THEN acquired_at ELSE excluded.acquired_at END,
  owner        = CASE WHEN token = excluded.token AND expires_at > excluded.acquired_at THEN owner ELSE excluded.owner END,
  expires_at   = CASE WHEN token = excluded.token AND expires_at > excluded.acquired_at
                 THEN max(expires_at, excluded.expires_at) ELSE excluded.expires_at END,
  intent_owner = CASE WHEN intent_token = excluded.token OR intent_until <= excluded.acquired_at THEN NULL ELSE intent_owner END,
  intent_token = CASE WHEN intent_token = excluded.token OR intent_until <= excluded.acquired_at THEN NULL ELSE intent_token END,
  claim_owner  = CASE WHEN claim_token = excluded.token OR claim_until <= excluded.acquired_at THEN NULL ELSE claim_owner END,
  claim_token  = CASE WHEN claim_token = excluded.token OR claim_until <= excluded.acquired_at THEN NULL ELSE claim_token END,
  token        = excluded.token
WHERE (token IS NULL OR expires_at <= excluded.acquired_at OR (token = excluded.token AND ?5))
  AND (shared_until IS NULL OR shared_until <= excluded.acquired_at)
  AND (claim_token IS NULL OR claim_until <= excluded.acquired_at OR claim_token = excluded.token
       OR (token = excluded.token AND expires_at > excluded.acquired_at AND ?5))
RETURNING fence, holds`

	sqliteRenew = `UPDATE {t} SET expires_at = max(expires_at, {now} + ?3)
WHERE name = ?1 AND token = ?2 AND expires_at > {now} AND (fence = ?4 OR ?4 = 0)`

	sqliteRenewBatch = `WITH r(name, token, ttl, fence) AS (VALUES {values})
UPDATE {t} SET expires_at = max(expires_at, {now} + r.ttl)
FROM r WHERE {t}.name = r.name AND {t}.token = r.token AND {t}.expires_at > {now}
  AND ({t}.fence = r.fence OR r.fence = 0)
RETURNING {t}.name, {t}.token`

	sqliteRelease = `UPDATE {t} SET holds = holds - 1, token = CASE WHEN holds > 1 THEN token END
WHERE name = ?1 AND token = ?2 AND expires_at > {now} AND (fence = ?3 OR ?3 = 0)
RETURNING holds`

	// The same, with the live head of the lock's fair queue when the last
	// hold went (SQLiteBackend, for the wake-up).
	sqliteReleaseNaming = `UPDATE {t} SET holds = holds - 1, token = CASE WHEN holds > 1 THEN token END
WHERE name = ?1 AND token = ?2 AND expires_at > {now} AND (fence = ?3 OR ?3 = 0)
RETURNING holds, CASE WHEN holds = 0 THEN
  (SELECT q.token FROM {q} q WHERE q.name = ?1 AND q.expires_at > {now} ORDER BY q.seq LIMIT 1) END`
)

// acquire is one statement when it grants. When it does not, a second one
// reads the holder (and a third records a writer intent): on a local file
// that costs microseconds. A release in between leaves the holder unknown,
// and Backend.Acquire tries once more.
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
	res, _, _, err := s.tx.refused(ctx, req)
	return res, err
}

// acquireShared takes a reader (Limit 0) with txs.acquireReader, and
// leaves a semaphore's permit to txs.acquireShared.
func (s *sqlite) acquireShared(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, bool, error) {
	if req.Limit > 0 {
		return driver.AcquireResult{}, false, nil
	}
	res, err := s.tx.acquireReader(ctx, req)
	return res, true, err
}

// renew is one statement; when it finds no exclusive lease, a second one
// looks for a shared hold, which the transaction of txs.renew renews.
func (s *sqlite) renew(ctx context.Context, key, token string, fence uint64, ttl time.Duration) (bool, bool, error) {
	res, err := s.stmts.exec(ctx, s.renewSQL, key, token, units(ttl, time.Millisecond), fenceParam(fence))
	if err != nil {
		return false, false, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		return n == 1, false, err
	}
	_, shared, err := s.tx.classify(ctx, []driver.RenewRequest{{Key: key, Token: token, TTL: ttl}})
	if err != nil {
		return false, false, err
	}
	return false, shared[0], nil
}

func (s *sqlite) renewBatch(ctx context.Context, reqs []driver.RenewRequest) ([]bool, []bool, error) {
	var q strings.Builder
	q.WriteString(s.renewBatchHead)
	args := make([]any, 0, 3*len(reqs))
	for i, r := range reqs {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString("(?, ?, ?, ?)")
		args = append(args, r.Key, r.Token, units(r.TTL, time.Millisecond), fenceParam(r.Fence))
	}
	q.WriteString(s.renewBatchTail)
	rows, err := s.db.QueryContext(ctx, q.String(), args...)
	if err != nil {
		return nil, nil, err
	}
	held, err := renewedRows(rows, reqs)
	if err != nil {
		return nil, nil, err
	}
	var rest []driver.RenewRequest
	var at []int
	for i := range held {
		if !held[i] {
			rest = append(rest, reqs[i])
			at = append(at, i)
		}
	}
	more := make([]bool, len(held))
	if len(rest) == 0 {
		return held, more, nil
	}
	_, shared, err := s.tx.classify(ctx, rest)
	if err != nil {
		return nil, nil, err
	}
	for k, i := range at {
		more[i] = shared[k]
	}
	return held, more, nil
}

func (s *sqlite) release(ctx context.Context, key, token string, fence uint64) (driver.ReleaseResult, bool, error) {
	res, err := scanRelease(s.stmts.queryRow(ctx, s.releaseSQL, key, token, fenceParam(fence)))
	if err != nil || res.Held {
		return res, false, err
	}
	more, err := s.tx.more(ctx, key, token)
	return res, more, err
}

// releaseNaming is release, with the head of the lock's fair queue when the
// last hold went (see namingReleaser).
func (s *sqlite) releaseNaming(ctx context.Context, key, token string, fence uint64) (driver.ReleaseResult, *string, bool, error) {
	var holds int
	var head sql.NullString
	err := s.stmts.queryRow(ctx, s.releaseNamingSQL, key, token, fenceParam(fence)).Scan(&holds, &head)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		more, err := s.tx.more(ctx, key, token)
		return driver.ReleaseResult{}, nil, more, err
	case err != nil:
		return driver.ReleaseResult{}, nil, false, err
	}
	res := driver.ReleaseResult{Held: true, Remaining: holds}
	if head.Valid {
		return res, &head.String, false, nil
	}
	return res, nil, false, nil
}
