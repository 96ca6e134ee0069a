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
	table string // quoted
	// The statements below, with the table's name filled in.
	acquireSQL, holdsSQL, holderSQL, insertSQL, renewSQL, releaseSQL string
	inspectSQL, listSQL, grantSQL, freeSQL                           string
}

func newMySQL(db *sql.DB, table string) *mysql {
	t := withTable(table)
	return &mysql{
		db:         db,
		table:      table,
		acquireSQL: t(mysqlAcquire),
		holdsSQL:   t(mysqlHolds),
		holderSQL:  t(mysqlHolder),
		insertSQL:  t(mysqlInsert),
		renewSQL:   t(mysqlRenew),
		releaseSQL: t(mysqlRelease),
		inspectSQL: t(mysqlInspect),
		listSQL:    t(mysqlList),
		grantSQL:   t(mysqlGrant),
		freeSQL:    t(mysqlFree),
	}
}

const (
	// Takes a free or expired row, or re-enters; LAST_INSERT_ID carries the
	// fence. The token is assigned last: every condition before reads the
	// old one. Parameters: token ×5, owner, ttl µs ×2, token, key, token,
	// reentrant.
	mysqlAcquire = `UPDATE {t} SET
  fence       = LAST_INSERT_ID(IF(token = ? AND expires_at > UTC_TIMESTAMP(6), fence, fence + 1)),
  holds       = IF(token = ? AND expires_at > UTC_TIMESTAMP(6), holds + 1, 1),
  acquired_at = IF(token = ? AND expires_at > UTC_TIMESTAMP(6), acquired_at, UTC_TIMESTAMP(6)),
  owner       = IF(token = ? AND expires_at > UTC_TIMESTAMP(6), owner, ?),
  expires_at  = IF(token = ? AND expires_at > UTC_TIMESTAMP(6),
                   GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND),
                   UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND),
  token       = ?
WHERE name = ? AND (token IS NULL OR expires_at <= UTC_TIMESTAMP(6) OR (token = ? AND ?))`

	// The hold count after a reentrant acquire, which may have re-entered.
	mysqlHolds = `SELECT holds FROM {t} WHERE name = ? AND token = ? AND fence = ?`

	// Who holds the lock, after an acquire that matched no row: held is 0
	// when the row is free or expired (it changed in between).
	mysqlHolder = `SELECT owner, token IS NOT NULL AND expires_at > UTC_TIMESTAMP(6),
  TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at)
FROM {t} WHERE name = ?`

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
WHERE name = ? AND token = ? AND expires_at > UTC_TIMESTAMP(6)`

	// LAST_INSERT_ID is the hold count before the release (at least 1).
	mysqlRelease = `UPDATE {t} SET
  token = IF(holds > 1, token, NULL),
  holds = LAST_INSERT_ID(holds) - 1
WHERE name = ? AND token = ? AND expires_at > UTC_TIMESTAMP(6)`

	mysqlInspect = `SELECT name, owner, fence, holds,
  TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at),
  TIMESTAMPDIFF(MICROSECOND, acquired_at, UTC_TIMESTAMP(6))
FROM {t} WHERE name = ? AND token IS NOT NULL AND expires_at > UTC_TIMESTAMP(6)`

	mysqlList = `SELECT name, owner, fence, holds,
  TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at),
  TIMESTAMPDIFF(MICROSECOND, acquired_at, UTC_TIMESTAMP(6))
FROM {t} WHERE name LIKE ? ESCAPE '!' AND token IS NOT NULL AND expires_at > UTC_TIMESTAMP(6)
ORDER BY name`

	// ForceRelease: read the grant, then free the row if that grant still
	// holds it.
	mysqlGrant = `SELECT name, owner, fence, holds,
  TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at),
  TIMESTAMPDIFF(MICROSECOND, acquired_at, UTC_TIMESTAMP(6)), token
FROM {t} WHERE name = ? AND token IS NOT NULL AND expires_at > UTC_TIMESTAMP(6)`
	mysqlFree = `UPDATE {t} SET token = NULL
WHERE name = ? AND token = ? AND fence = ? AND expires_at > UTC_TIMESTAMP(6)`
)

// attempts bounds the retries of the MySQL acquire and force release when
// the row changes between their statements.
const attempts = 3

// acquire is one UPDATE when the name's row exists and is free, expired or
// re-entered (a reentrant request adds a SELECT for the hold count). When
// the UPDATE matches nothing, a SELECT reads the holder; when there is no
// row at all, an INSERT makes the name's first grant.
func (m *mysql) acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	ttl := units(req.TTL, time.Microsecond)
	tok := req.Token
	for range attempts {
		res, err := m.db.ExecContext(ctx, m.acquireSQL,
			tok, tok, tok, tok, req.Owner, tok, ttl, ttl, tok, req.Key, tok, req.Reentrant)
		if err != nil {
			return driver.AcquireResult{}, err
		}
		if fence, err := res.LastInsertId(); err != nil {
			return driver.AcquireResult{}, err
		} else if fence > 0 {
			return m.granted(ctx, req, fence)
		}

		var holder string
		var held bool
		var ttlUS sql.NullInt64
		err = m.db.QueryRowContext(ctx, m.holderSQL, req.Key).Scan(&holder, &held, &ttlUS)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			res, err := m.db.ExecContext(ctx, m.insertSQL, req.Key, tok, req.Owner, ttl)
			if err != nil {
				return driver.AcquireResult{}, err
			}
			if n, err := res.RowsAffected(); err != nil {
				return driver.AcquireResult{}, err
			} else if n == 1 {
				return driver.AcquireResult{Acquired: true, Fence: 1, Holds: 1}, nil
			}
		case err != nil:
			return driver.AcquireResult{}, err
		case held:
			return driver.AcquireResult{Holder: holder, HolderTTL: time.Duration(max(ttlUS.Int64, 0)) * time.Microsecond}, nil
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

func (m *mysql) renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	res, err := m.db.ExecContext(ctx, m.renewSQL, units(ttl, time.Microsecond), key, token)
	if err != nil {
		return false, err
	}
	fence, err := res.LastInsertId()
	return fence > 0, err
}

// renewBatch sends one UPDATE for every lease. RowsAffected counts the rows
// it changed (or matched, with CLIENT_FOUND_ROWS); when that is every lease,
// all were held. Otherwise some were not, or some expiry did not move
// (renewals never shorten a lease), and one Renew per lease tells which.
func (m *mysql) renewBatch(ctx context.Context, reqs []driver.RenewRequest) ([]bool, error) {
	var q strings.Builder
	args := make([]any, 0, 5*len(reqs))
	q.WriteString("UPDATE " + m.table + " SET expires_at = GREATEST(expires_at, CASE")
	for _, r := range reqs {
		q.WriteString(" WHEN name = ? AND token = ? THEN UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND")
		args = append(args, r.Key, r.Token, units(r.TTL, time.Microsecond))
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
		return nil, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return nil, err
	}
	held := make([]bool, len(reqs))
	if n == int64(len(reqs)) {
		for i := range held {
			held[i] = true
		}
		return held, nil
	}
	for i, r := range reqs {
		if held[i], err = m.renew(ctx, r.Key, r.Token, r.TTL); err != nil {
			return nil, err
		}
	}
	return held, nil
}

func (m *mysql) release(ctx context.Context, key, token string) (driver.ReleaseResult, error) {
	res, err := m.db.ExecContext(ctx, m.releaseSQL, key, token)
	if err != nil {
		return driver.ReleaseResult{}, err
	}
	before, err := res.LastInsertId()
	if err != nil || before < 1 {
		return driver.ReleaseResult{}, err
	}
	return driver.ReleaseResult{Held: true, Remaining: int(before - 1)}, nil
}

func (m *mysql) inspect(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	return queryInfo(ctx, m.db, time.Microsecond, m.inspectSQL, key)
}

func (m *mysql) list(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	escaped := strings.NewReplacer("!", "!!", "%", "!%", "_", "!_").Replace(prefix)
	return queryInfos(ctx, m.db, time.Microsecond, m.listSQL, escaped+"%")
}

func (m *mysql) forceRelease(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	for range attempts {
		var token string
		row := m.db.QueryRowContext(ctx, m.grantSQL, key)
		info, err := scanInfo(scanExtra{row, &token}, time.Microsecond)
		if errors.Is(err, sql.ErrNoRows) {
			return driver.LockInfo{}, false, nil
		}
		if err != nil {
			return driver.LockInfo{}, false, err
		}
		res, err := m.db.ExecContext(ctx, m.freeSQL, key, token, int64(info.Fence))
		if err != nil {
			return driver.LockInfo{}, false, err
		}
		if n, err := res.RowsAffected(); err != nil {
			return driver.LockInfo{}, false, err
		} else if n == 1 {
			return info, true, nil
		}
		// Released, expired or re-granted in between: look again.
	}
	return driver.LockInfo{}, false, nil
}

// scanExtra scans a row with one more column than scanInfo reads.
type scanExtra struct {
	row   *sql.Row
	extra any
}

func (s scanExtra) Scan(dest ...any) error { return s.row.Scan(append(dest, s.extra)...) }
