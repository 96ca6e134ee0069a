package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// releaseChannel is the PostgreSQL notification channel on which Release
// and ForceRelease announce a freed lock; the payload is its key. Every
// table shares it: a listener ignores keys it does not wait on.
const releaseChannel = "dlock_release"

// postgres is the PostgreSQL dialect. Times are timestamptz from now(), the
// start of the statement's transaction, which for these single statements is
// the statement itself; durations travel as microseconds.
type postgres struct {
	db *sql.DB
	// The statements below, with the table's name filled in.
	acquireSQL, renewSQL, renewBatchSQL, releaseSQL string
	inspectSQL, listSQL, forceReleaseSQL            string
}

func newPostgres(db *sql.DB, table string) *postgres {
	t := withTable(table)
	return &postgres{
		db:              db,
		acquireSQL:      t(pgAcquire),
		renewSQL:        t(pgRenew),
		renewBatchSQL:   t(pgRenewBatch),
		releaseSQL:      t(pgRelease),
		inspectSQL:      t(pgInspect),
		listSQL:         t(pgList),
		forceReleaseSQL: t(pgForceRelease),
	}
}

// withTable returns a function that fills the quoted table name into a
// statement.
func withTable(table string) func(string) string {
	return func(q string) string { return strings.ReplaceAll(q, "{t}", table) }
}

const (
	// One round trip whatever happens: the upsert takes a free or expired
	// row, re-enters, or does nothing; in the last case the outer query
	// reads the holder. (It reads the statement's snapshot, which a grant
	// that raced this statement may postdate: then it reports the holder
	// before, or none, and then Backend.Acquire tries once more.)
	pgAcquire = `WITH granted AS (
  INSERT INTO {t} AS l (name, token, owner, fence, holds, acquired_at, expires_at)
  VALUES ($1, $2, $3, 1, 1, now(), now() + $4::bigint * interval '1 microsecond')
  ON CONFLICT (name) DO UPDATE SET
    fence       = CASE WHEN l.token = excluded.token AND l.expires_at > now() THEN l.fence ELSE l.fence + 1 END,
    holds       = CASE WHEN l.token = excluded.token AND l.expires_at > now() THEN l.holds + 1 ELSE 1 END,
    acquired_at = CASE WHEN l.token = excluded.token AND l.expires_at > now() THEN l.acquired_at ELSE now() END,
    owner       = CASE WHEN l.token = excluded.token AND l.expires_at > now() THEN l.owner ELSE excluded.owner END,
    expires_at  = CASE WHEN l.token = excluded.token AND l.expires_at > now()
                  THEN greatest(l.expires_at, excluded.expires_at) ELSE excluded.expires_at END,
    token       = excluded.token
  WHERE l.token IS NULL OR l.expires_at <= now() OR (l.token = excluded.token AND $5::boolean)
  RETURNING l.fence, l.holds
)
SELECT true, fence, holds, '', 0::bigint FROM granted
UNION ALL
SELECT false, 0, 0, h.owner, (extract(epoch FROM h.expires_at - now()) * 1000000)::bigint
FROM {t} h
WHERE h.name = $1 AND h.token IS NOT NULL AND h.expires_at > now() AND NOT EXISTS (SELECT FROM granted)`

	pgRenew = `UPDATE {t}
SET expires_at = greatest(expires_at, now() + $3::bigint * interval '1 microsecond')
WHERE name = $1 AND token = $2 AND expires_at > now()`

	pgRenewBatch = `UPDATE {t} AS l
SET expires_at = greatest(l.expires_at, now() + r.ttl * interval '1 microsecond')
FROM unnest($1::text[], $2::text[], $3::bigint[]) AS r(name, token, ttl)
WHERE l.name = r.name AND l.token = r.token AND l.expires_at > now()
RETURNING l.name, l.token`

	// The last hold frees the row and notifies, in the same statement; the
	// notification goes out when it commits.
	pgRelease = `WITH released AS (
  UPDATE {t} SET holds = holds - 1, token = CASE WHEN holds > 1 THEN token END
  WHERE name = $1 AND token = $2 AND expires_at > now()
  RETURNING name, holds
)
SELECT r.holds FROM released r
LEFT JOIN LATERAL (SELECT pg_notify('` + releaseChannel + `', r.name) WHERE r.holds = 0) n ON true`

	pgInspect = `SELECT name, owner, fence, holds,
  (extract(epoch FROM expires_at - now()) * 1000000)::bigint,
  (extract(epoch FROM now() - acquired_at) * 1000000)::bigint
FROM {t} WHERE name = $1 AND token IS NOT NULL AND expires_at > now()`

	pgList = `SELECT name, owner, fence, holds,
  (extract(epoch FROM expires_at - now()) * 1000000)::bigint,
  (extract(epoch FROM now() - acquired_at) * 1000000)::bigint
FROM {t} WHERE starts_with(name, $1) AND token IS NOT NULL AND expires_at > now()
ORDER BY name`

	pgForceRelease = `WITH freed AS (
  UPDATE {t} SET token = NULL
  WHERE name = $1 AND token IS NOT NULL AND expires_at > now()
  RETURNING name, owner, fence, holds,
    (extract(epoch FROM expires_at - now()) * 1000000)::bigint AS ttl,
    (extract(epoch FROM now() - acquired_at) * 1000000)::bigint AS held_for
)
SELECT f.name, f.owner, f.fence, f.holds, f.ttl, f.held_for FROM freed f
LEFT JOIN LATERAL (SELECT pg_notify('` + releaseChannel + `', f.name)) n ON true`
)

func (p *postgres) acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	var (
		granted      bool
		fence, ttlUS int64
		holds        int
		holder       string
	)
	err := p.db.QueryRowContext(ctx, p.acquireSQL,
		req.Key, req.Token, req.Owner, units(req.TTL, time.Microsecond), req.Reentrant,
	).Scan(&granted, &fence, &holds, &holder, &ttlUS)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		// The holder changed while the statement ran: not granted, holder
		// unknown. Backend.Acquire tries once more.
		return driver.AcquireResult{}, nil
	case err != nil:
		return driver.AcquireResult{}, err
	case granted:
		return driver.AcquireResult{Acquired: true, Fence: uint64(fence), Holds: holds}, nil
	}
	return driver.AcquireResult{Holder: holder, HolderTTL: time.Duration(max(ttlUS, 0)) * time.Microsecond}, nil
}

func (p *postgres) renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	res, err := p.db.ExecContext(ctx, p.renewSQL, key, token, units(ttl, time.Microsecond))
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

func (p *postgres) renewBatch(ctx context.Context, reqs []driver.RenewRequest) ([]bool, error) {
	keys := make([]string, len(reqs))
	tokens := make([]string, len(reqs))
	ttls := make([]int64, len(reqs))
	for i, r := range reqs {
		keys[i], tokens[i], ttls[i] = r.Key, r.Token, units(r.TTL, time.Microsecond)
	}
	rows, err := p.db.QueryContext(ctx, p.renewBatchSQL, keys, tokens, ttls)
	if err != nil {
		return nil, err
	}
	return renewedRows(rows, reqs)
}

// renewedRows reads the (name, token) rows a batch renewal returned and
// reports which requests they answer.
func renewedRows(rows *sql.Rows, reqs []driver.RenewRequest) ([]bool, error) {
	defer rows.Close()
	renewed := make(map[[2]string]bool, len(reqs))
	for rows.Next() {
		var key, token string
		if err := rows.Scan(&key, &token); err != nil {
			return nil, err
		}
		renewed[[2]string{key, token}] = true
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	held := make([]bool, len(reqs))
	for i, r := range reqs {
		held[i] = renewed[[2]string{r.Key, r.Token}]
	}
	return held, nil
}

func (p *postgres) release(ctx context.Context, key, token string) (driver.ReleaseResult, error) {
	return scanRelease(p.db.QueryRowContext(ctx, p.releaseSQL, key, token))
}

func (p *postgres) inspect(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	return queryInfo(ctx, p.db, time.Microsecond, p.inspectSQL, key)
}

func (p *postgres) list(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	return queryInfos(ctx, p.db, time.Microsecond, p.listSQL, prefix)
}

func (p *postgres) forceRelease(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	return queryInfo(ctx, p.db, time.Microsecond, p.forceReleaseSQL, key)
}
