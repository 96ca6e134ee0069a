// The MySQL and MariaDB dialect: its acquire, renew and release statements
// and the code that runs them.

package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// mysql is the MySQL and MariaDB dialect. Times are DATETIME(6) in UTC from
// UTC_TIMESTAMP(6), which is fixed within one statement; durations travel as
// microseconds.
//
// MySQL has no RETURNING on UPDATE. The statements hand one number back
// through LAST_INSERT_ID(expr) instead: the server puts its value in the OK
// packet of the same statement (Result.LastInsertId) and sends 0 when expr
// was never evaluated because no row matched. That also makes the answer
// independent of the connection's CLIENT_FOUND_ROWS setting, which changes
// what RowsAffected counts. Within one UPDATE, MySQL evaluates assignments
// left to right and later ones see earlier ones' new values (MariaDB does
// too, unless SIMULTANEOUS_ASSIGNMENT is set), so every condition reads only
// columns that are assigned after it: the SQL works under both rules.
type mysql struct {
	db    *sql.DB
	tx    *txs
	table string // quoted
	// The statements below, with the table's name filled in.
	acquireSQL, holdsSQL, insertSQL, renewSQL, releaseSQL string
}

func newMySQL(db *sql.DB, tx *txs) *mysql {
	t := tx.x.expand
	return &mysql{
		db:         db,
		tx:         tx,
		table:      tx.x.t,
		acquireSQL: t(mysqlAcquire),
		holdsSQL:   t(mysqlHolds),
		insertSQL:  t(mysqlInsert),
		renewSQL:   t(mysqlRenew),
		releaseSQL: t(mysqlRelease),
	}
}

const (
	// Takes a free or expired row without live shared holds and without
	// another token's live claim, or re-enters; LAST_INSERT_ID carries the
	// fence. A grant drops the token's writer intent and claim, and ones
	// that have lapsed. The token is assigned last: every condition before
	// reads the old one. Parameters: token ×9, owner, ttl µs ×2, token,
	// key, token, reentrant, token ×2, reentrant, key, token. A live record
	// of the token's clean-up refuses the grant (see goneTTL): the
	// subquery of an UPDATE reads with locks, so it sees a record that
	// was committed while the UPDATE waited for the row.
	mysqlAcquire = `UPDATE {t} SET
  intent_owner = IF(intent_token = ? OR intent_until <= UTC_TIMESTAMP(6), NULL, intent_owner),
  intent_token = IF(intent_token = ? OR intent_until <= UTC_TIMESTAMP(6), NULL, intent_token),
  claim_owner  = IF(claim_token = ? OR claim_until <= UTC_TIMESTAMP(6), NULL, claim_owner),
  claim_token  = IF(claim_token = ? OR claim_until <= UTC_TIMESTAMP(6), NULL, claim_token),
  fence        = LAST_INSERT_ID(IF(token = ? AND expires_at > UTC_TIMESTAMP(6), fence, fence + 1)),
  holds        = IF(token = ? AND expires_at > UTC_TIMESTAMP(6), holds + 1, 1),
  acquired_at  = IF(token = ? AND expires_at > UTC_TIMESTAMP(6), acquired_at, UTC_TIMESTAMP(6)),
  owner        = IF(token = ? AND expires_at > UTC_TIMESTAMP(6), owner, ?),
  expires_at   = IF(token = ? AND expires_at > UTC_TIMESTAMP(6),
                    GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND),
                    UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND),
  token        = ?
WHERE name = ? AND (token IS NULL OR expires_at <= UTC_TIMESTAMP(6) OR (token = ? AND ?))
  AND (shared_until IS NULL OR shared_until <= UTC_TIMESTAMP(6))
  AND (claim_token IS NULL OR claim_until <= UTC_TIMESTAMP(6) OR claim_token = ?
       OR (token = ? AND expires_at > UTC_TIMESTAMP(6) AND ?))
  AND NOT EXISTS (SELECT 1 FROM {g} WHERE name = ? AND token = ? AND grants > 0 AND expires_at > UTC_TIMESTAMP(6))`

	// The hold count after a reentrant acquire, which may have re-entered.
	mysqlHolds = `SELECT holds FROM {t} WHERE name = ? AND token = ? AND fence = ?`

	// The first grant of a name ever. IGNORE turns a duplicate key (another
	// owner inserted it first) into 0 rows affected; the values are
	// validated beforehand, so it hides nothing else.
	mysqlInsert = `INSERT IGNORE INTO {t} (name, token, owner, fence, holds, acquired_at, expires_at)
VALUES (?, ?, ?, 1, 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)`

	// LAST_INSERT_ID is the fence (at least 1) when the row matched, even if
	// expires_at did not change.
	mysqlRenew = `UPDATE {t} SET
  fence      = LAST_INSERT_ID(fence),
  expires_at = GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
WHERE name = ? AND token = ? AND expires_at > UTC_TIMESTAMP(6) AND fence = COALESCE(NULLIF(?, 0), fence)`

	// LAST_INSERT_ID is the hold count before the release (at least 1).
	mysqlRelease = `UPDATE {t} SET
  token = IF(holds > 1, token, NULL),
  holds = LAST_INSERT_ID(holds) - 1
WHERE name = ? AND token = ? AND expires_at > UTC_TIMESTAMP(6) AND fence = COALESCE(NULLIF(?, 0), fence)`
)

// attempts bounds the retries of the MySQL acquire when the row changes
// between its statements.
const attempts = 3

// acquire is one UPDATE when the name's row exists and is free, expired or
// re-entered (a reentrant request adds a SELECT for the hold count). When
// the UPDATE matches nothing, a SELECT reads the holder (and an UPDATE
// records a writer intent); when there is no row at all, an INSERT makes
// the name's first grant.
func (m *mysql) acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	ttl := units(req.TTL, time.Microsecond)
	tok := req.Token
	for range attempts {
		res, err := m.db.ExecContext(ctx, m.acquireSQL,
			tok, tok, tok, tok, tok, tok, tok, tok, req.Owner, tok, ttl, ttl, tok, req.Key, tok, req.Reentrant, tok, tok, req.Reentrant, req.Key, tok)
		if err != nil {
			return driver.AcquireResult{}, err
		}
		if fence, err := res.LastInsertId(); err != nil {
			return driver.AcquireResult{}, err
		} else if fence > 0 {
			return m.granted(ctx, req, fence)
		}

		refused, found, blocked, err := m.tx.refused(ctx, req)
		switch {
		case err != nil:
			return driver.AcquireResult{}, err
		case !found:
			res, err := m.db.ExecContext(ctx, m.insertSQL, req.Key, tok, req.Owner, ttl)
			if err != nil {
				return driver.AcquireResult{}, err
			}
			if n, err := res.RowsAffected(); err != nil {
				return driver.AcquireResult{}, err
			} else if n == 1 {
				return driver.AcquireResult{Acquired: true, Fence: 1, Holds: 1}, nil
			}
		case blocked:
			return refused, nil
		}
		// Freed or created in between: try again.
	}
	return driver.AcquireResult{}, nil
}

// granted completes a grant: a non-reentrant request always makes a new
// grant with one hold; a reentrant one may have re-entered, so its hold
// count is read back (holds the same token added meanwhile are counted too).
func (m *mysql) granted(ctx context.Context, req driver.AcquireRequest, fence int64) (driver.AcquireResult, error) {
	res := driver.AcquireResult{Acquired: true, Fence: uint64(fence), Holds: 1}
	if !req.Reentrant {
		return res, nil
	}
	err := m.db.QueryRowContext(ctx, m.holdsSQL, req.Key, req.Token, fence).Scan(&res.Holds)
	if errors.Is(err, sql.ErrNoRows) {
		err = nil // released by the same owner meanwhile
	}
	return res, err
}

// acquireShared takes a reader (Limit 0) with txs.acquireReader, and
// leaves a semaphore's permit to txs.acquireShared.
func (m *mysql) acquireShared(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, bool, error) {
	if req.Limit > 0 {
		return driver.AcquireResult{}, false, nil
	}
	res, err := m.tx.acquireReader(ctx, req)
	return res, true, err
}

func (m *mysql) renew(ctx context.Context, key, token string, fence uint64, ttl time.Duration) (bool, bool, error) {
	res, err := m.db.ExecContext(ctx, m.renewSQL, units(ttl, time.Microsecond), key, token, fenceParam(fence))
	if err != nil {
		return false, false, err
	}
	matched, err := res.LastInsertId() // the row's fence, when it matched
	return matched > 0, matched <= 0, err
}

// renewBatch sends one UPDATE for every exclusive lease. RowsAffected counts
// the rows it changed (or matched, with CLIENT_FOUND_ROWS); when that is
// every lease, all were held. Otherwise some were not, or were shared
// holds, or some expiry did not move (renewals never shorten a lease), and
// one SELECT (txs.classify) tells which.
func (m *mysql) renewBatch(ctx context.Context, reqs []driver.RenewRequest) ([]bool, []bool, error) {
	var q strings.Builder
	args := make([]any, 0, 5*len(reqs))
	q.WriteString("UPDATE " + m.table + " SET expires_at = GREATEST(expires_at, CASE")
	for _, r := range reqs {
		q.WriteString(" WHEN name = ? AND token = ? AND fence = COALESCE(NULLIF(?, 0), fence) THEN UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND")
		args = append(args, r.Key, r.Token, fenceParam(r.Fence), units(r.TTL, time.Microsecond))
	}
	q.WriteString(" ELSE expires_at END) WHERE (name, token) IN (")
	for i, r := range reqs {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString("(?, ?)")
		args = append(args, r.Key, r.Token)
	}
	q.WriteString(") AND expires_at > UTC_TIMESTAMP(6)")
	res, err := m.db.ExecContext(ctx, q.String(), args...)
	if err != nil {
		return nil, nil, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return nil, nil, err
	}
	if n == int64(len(reqs)) {
		held := make([]bool, len(reqs))
		for i := range held {
			held[i] = true
		}
		return held, make([]bool, len(reqs)), nil
	}
	return m.tx.classify(ctx, reqs)
}

func (m *mysql) release(ctx context.Context, key, token string, fence uint64) (driver.ReleaseResult, bool, error) {
	res, err := m.db.ExecContext(ctx, m.releaseSQL, key, token, fenceParam(fence))
	if err != nil {
		return driver.ReleaseResult{}, false, err
	}
	before, err := res.LastInsertId()
	if err != nil {
		return driver.ReleaseResult{}, false, err
	}
	if before >= 1 {
		return driver.ReleaseResult{Held: true, Remaining: int(before - 1)}, false, nil
	}
	if fence == 0 {
		// A clean-up: Backend.release records the token and runs the
		// transaction whatever the hint says (see goneTTL).
		return driver.ReleaseResult{}, true, nil
	}
	more, err := m.tx.more(ctx, key, token)
	return driver.ReleaseResult{}, more, err
}
