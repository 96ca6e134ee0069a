// The PostgreSQL dialect: its acquire, renew and release statements and the
// code that runs them.

package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// releaseChannel is the PostgreSQL notification channel on which Release
// and ForceRelease announce a change that may let a waiter in; the payload
// is the key, and the token of the waiter to wake when there is one (see
// encodePayload). Every table shares it: a listener ignores keys it does
// not wait on.
const releaseChannel = "dlock_release"

// postgres is the PostgreSQL dialect. Times are timestamptz from now(), the
// start of the statement's transaction, which for these single statements is
// the statement itself; durations travel as microseconds.
type postgres struct {
	db *sql.DB
	tx *txs
	// The statements below, with the table's name filled in.
	acquireSQL, acquireSharedSQL, renewSQL, renewBatchSQL, releaseSQL string
}

func newPostgres(db *sql.DB, tx *txs) *postgres {
	t := tx.x.expand
	return &postgres{
		db:               db,
		tx:               tx,
		acquireSQL:       t(pgAcquire),
		acquireSharedSQL: t(pgAcquireShared),
		renewSQL:         t(pgRenew),
		renewBatchSQL:    t(pgRenewBatch),
		releaseSQL:       t(pgRelease),
	}
}

const (
	// One round trip when the upsert takes a free or expired row without
	// live shared holds and without another token's live claim, re-enters, or finds an exclusive holder, which the
	// outer query then reads (kind 2), with whether the token has a live
	// writer intent (which a request with Wait then refreshes with
	// txs.recordIntent; a request with Claim records or keeps its claim
	// with txs.recordClaim). It reads the statement's snapshot,
	// which a grant that raced this statement may postdate: then it reports
	// the holder before, or none. With none, a second statement
	// (txs.refused) reads the shared holds that keep the lock, or finds it
	// free, and then Backend.Acquire tries once more. A grant drops the
	// token's writer intent, and one that has lapsed.
	pgAcquire = `WITH granted AS (
  INSERT INTO {t} AS l (name, token, owner, fence, holds, acquired_at, expires_at)
  VALUES ($1, $2, $3, 1, 1, now(), now() + $4::bigint * interval '1 microsecond')
  ON CONFLICT (name) DO UPDATE SET
    fence        = CASE WHEN l.token = excluded.token AND l.expires_at > now() THEN l.fence ELSE l.fence + 1 END,
    holds        = CASE WHEN l.token = excluded.token AND l.expires_at > now() THEN l.holds + 1 ELSE 1 END,
    acquired_at  = CASE WHEN l.token = excluded.token AND l.expires_at > now() THEN l.acquired_at ELSE now() END,
    owner        = CASE WHEN l.token = excluded.token AND l.expires_at > now() THEN l.owner ELSE excluded.owner END,
    expires_at   = CASE WHEN l.token = excluded.token AND l.expires_at > now()
                   THEN greatest(l.expires_at, excluded.expires_at) ELSE excluded.expires_at END,
    intent_owner = CASE WHEN l.intent_token = excluded.token OR l.intent_until <= now() THEN NULL ELSE l.intent_owner END,
    intent_token = CASE WHEN l.intent_token = excluded.token OR l.intent_until <= now() THEN NULL ELSE l.intent_token END,
    claim_owner  = CASE WHEN l.claim_token = excluded.token OR l.claim_until <= now() THEN NULL ELSE l.claim_owner END,
    claim_token  = CASE WHEN l.claim_token = excluded.token OR l.claim_until <= now() THEN NULL ELSE l.claim_token END,
    token        = excluded.token
  WHERE (l.token IS NULL OR l.expires_at <= now() OR (l.token = excluded.token AND $5::boolean))
    AND (l.shared_until IS NULL OR l.shared_until <= now())
    AND (l.claim_token IS NULL OR l.claim_until <= now() OR l.claim_token = excluded.token
         OR (l.token = excluded.token AND l.expires_at > now() AND $5::boolean))` + pgNotGone + `
  RETURNING l.fence, l.holds
)
SELECT 1, fence, holds, '', 0::bigint, false FROM granted
UNION ALL
SELECT 2, 0, 0, h.owner, (extract(epoch FROM h.expires_at - now()) * 1000000)::bigint,
  h.intent_token IS NOT NULL AND h.intent_token = $2 AND h.intent_until > now()
FROM {t} h
WHERE h.name = $1 AND h.token IS NOT NULL AND h.expires_at > now() AND NOT EXISTS (SELECT FROM granted)`

	// pgNotGone refuses a grant to token $2 while a record of its clean-up
	// lives, and when the row changed between the statement's snapshot,
	// which that record may postdate, and the version the upsert locked
	// (see goneTTL).
	pgNotGone = `
    AND NOT EXISTS (SELECT FROM {g} WHERE name = $1 AND token = $2 AND grants > 0 AND expires_at > now())
    AND l.xmin = (SELECT fr.xmin FROM {t} fr WHERE fr.name = $1)`

	// A reader (Limit 0) in one statement, as safe as the exclusive upsert:
	// what a shared grant must know (no live exclusive holder, no live
	// intent of another token) is on the row, which the upsert locks and
	// checks in its latest version; it raises shared_until and draws the
	// fence there, and the hold's row is inserted in the same statement,
	// with the same now(), so that shared_until covers it. A release, which
	// recomputes shared_until, locks the row first and then reads the
	// holds, so it waits for this statement and sees its hold. A token
	// holds once: its live hold refuses the grant (kind 4; the check reads
	// the snapshot, and a hold of the same token committed meanwhile, by a
	// request sent twice at once, is kept: then nothing is granted and the
	// statement reports nothing). The live shared holds of a semaphore
	// (shared_lim, checked on the row's latest version like the rest)
	// refuse it too. Refused, the outer query reads the holder (kind 2),
	// the writer's intent (kind 3) or the semaphore's holds (kind 5, the
	// fence column carrying their Limit: a conflict) from the snapshot, as
	// pgAcquire does.
	pgAcquireShared = `WITH granted AS (
  INSERT INTO {t} AS l (name, token, owner, fence, holds, acquired_at, expires_at, shared_until, shared_lim)
  VALUES ($1, NULL, '', 1, 0, now(), now(), now() + $4::bigint * interval '1 microsecond', 0)
  ON CONFLICT (name) DO UPDATE SET
    fence        = l.fence + 1,
    shared_lim   = 0,
    shared_until = greatest(l.shared_until, excluded.shared_until)
  WHERE (l.token IS NULL OR l.expires_at <= now())
    AND (l.intent_token IS NULL OR l.intent_until <= now() OR l.intent_token = $2)
    AND (l.shared_until IS NULL OR l.shared_until <= now() OR l.shared_lim IS NULL OR l.shared_lim = 0)
    AND NOT EXISTS (SELECT FROM {s} WHERE name = $1 AND token = $2 AND expires_at > now())` + pgNotGone + `
  RETURNING l.fence
), hold AS (
  INSERT INTO {s} AS s (name, token, owner, fence, lim, acquired_at, expires_at)
  SELECT $1, $2, $3, fence, 0, now(), now() + $4::bigint * interval '1 microsecond' FROM granted
  ON CONFLICT (name, token) DO UPDATE SET owner = excluded.owner, fence = excluded.fence, lim = excluded.lim,
    acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
  WHERE s.expires_at <= now()
  RETURNING s.fence
)
SELECT 1, fence, '', 0::bigint, 0::bigint FROM hold
UNION ALL
SELECT 2, 0, h.owner, (extract(epoch FROM h.expires_at - now()) * 1000000)::bigint, 0
FROM {t} h
WHERE h.name = $1 AND h.token IS NOT NULL AND h.expires_at > now() AND NOT EXISTS (SELECT FROM granted)
UNION ALL
SELECT 3, 0, h.intent_owner, (extract(epoch FROM h.intent_until - now()) * 1000000)::bigint,
  (SELECT count(*) FROM {s} WHERE name = $1 AND expires_at > now())
FROM {t} h
WHERE h.name = $1 AND h.intent_token IS NOT NULL AND h.intent_until > now() AND h.intent_token <> $2
  AND NOT EXISTS (SELECT FROM granted)
UNION ALL
SELECT 4, 0, $3, (extract(epoch FROM s.expires_at - now()) * 1000000)::bigint,
  (SELECT count(*) FROM {s} WHERE name = $1 AND expires_at > now())
FROM {s} s
WHERE s.name = $1 AND s.token = $2 AND s.expires_at > now() AND NOT EXISTS (SELECT FROM granted)
UNION ALL
SELECT 5, h.shared_lim::bigint,
  COALESCE((SELECT owner FROM {s} WHERE name = $1 AND expires_at > now() ORDER BY expires_at DESC, fence DESC LIMIT 1), ''),
  (extract(epoch FROM h.shared_until - now()) * 1000000)::bigint,
  (SELECT count(*) FROM {s} WHERE name = $1 AND expires_at > now())
FROM {t} h
WHERE h.name = $1 AND h.shared_until > now() AND h.shared_lim <> 0 AND NOT EXISTS (SELECT FROM granted)`

	// Renews an exclusive lease, or a shared hold, in one statement: 1 when
	// the token held either. A shared hold's renewal locks the name's row
	// first (locked: the uncorrelated EXISTS runs before any hold row is
	// touched), as every transaction on shared holds does, so that two never
	// wait for each other, and only while the row has no live exclusive
	// holder, which FOR UPDATE checks again in the row's latest version
	// after a wait; then it extends the hold and raises shared_until after
	// it. Both are updates of single rows, which PostgreSQL checks again in
	// their latest version after a wait: no read of the holds that an
	// earlier snapshot could leave stale.
	//
	// now() is the statement's start, before any wait for the row lock. An
	// exclusive lease that expired during that wait may still be renewed:
	// no one else can have taken the row meanwhile (the token check runs on
	// its latest version). A shared hold's expiry is checked against
	// clock_timestamp(), after the row lock: a writer may have come and gone
	// during the wait once the hold expired, and it must not revive.
	pgRenew = `WITH renewed AS (
  UPDATE {t}
  SET expires_at = greatest(expires_at, now() + $3::bigint * interval '1 microsecond')
  WHERE name = $1 AND token = $2 AND expires_at > now() AND (fence = $4 OR $4 = 0)
  RETURNING 1
), locked AS (
  SELECT name FROM {t}
  WHERE name = $1 AND NOT EXISTS (SELECT FROM renewed)
    AND EXISTS (SELECT FROM {s} WHERE name = $1 AND token = $2 AND expires_at > now())
    AND (token IS NULL OR expires_at <= now())
  FOR UPDATE
), hold AS (
  UPDATE {s}
  SET expires_at = greatest(expires_at, now() + $3::bigint * interval '1 microsecond')
  WHERE name = $1 AND token = $2 AND expires_at > clock_timestamp() AND EXISTS (SELECT FROM locked)
  RETURNING expires_at
), raised AS (
  UPDATE {t} AS l SET shared_until = greatest(l.shared_until, h.expires_at)
  FROM hold h WHERE l.name = $1
)
SELECT (SELECT count(*) FROM renewed) + (SELECT count(*) FROM hold)`

	// The same for many leases: the (name, token) of each lease renewed.
	// The names with shared holds among the requests are locked in name
	// order, so that two batches cannot deadlock, when they have no live
	// exclusive holder.
	pgRenewBatch = `WITH r AS (
  SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) AS r(name, token, ttl, fence)
), renewed AS (
  UPDATE {t} AS l
  SET expires_at = greatest(l.expires_at, now() + r.ttl * interval '1 microsecond')
  FROM r
  WHERE l.name = r.name AND l.token = r.token AND l.expires_at > now()
    AND (l.fence = r.fence OR r.fence = 0)
  RETURNING l.name, l.token
), locked AS (
  SELECT l.name FROM {t} l
  WHERE l.name IN (SELECT s.name FROM {s} s JOIN r ON s.name = r.name AND s.token = r.token WHERE s.expires_at > now())
    AND (l.token IS NULL OR l.expires_at <= now())
  ORDER BY l.name
  FOR UPDATE
), hold AS (
  UPDATE {s} AS s
  SET expires_at = greatest(s.expires_at, now() + r.ttl * interval '1 microsecond')
  FROM r
  WHERE s.name = r.name AND s.token = r.token AND s.expires_at > clock_timestamp() AND s.name IN (SELECT name FROM locked)
  RETURNING s.name, s.token, s.expires_at
), raised AS (
  UPDATE {t} AS l SET shared_until = greatest(l.shared_until, x.until)
  FROM (SELECT name, max(expires_at) AS until FROM hold GROUP BY name) x
  WHERE l.name = x.name
)
SELECT name, token FROM renewed
UNION ALL
SELECT name, token FROM hold`

	// The last hold frees the row and notifies, in the same statement, with
	// the head of the fair queue (see encodePayload); the notification goes
	// out when it commits. When the token held nothing, the second part
	// says whether it has a shared hold, a queue entry or an intent, for
	// txs.release (-1).
	//
	// now() is the statement's start, before any wait for the row lock: a
	// lease that expired during the wait is still released (no one else
	// took the row meanwhile: the token check runs on its latest version).
	// The head is read after the wait, from the statement's snapshot, with
	// entries that lapsed during it left out (clock_timestamp()), and those
	// of waiters whose clean-up is recorded (see goneTTL); an entry
	// that came or left during the wait may be missed or named, which costs
	// the waiters only a retry at their refresh (QueueTTL/3), as does a
	// notification lost.
	pgRelease = `WITH released AS (
  UPDATE {t} SET holds = holds - 1, token = CASE WHEN holds > 1 THEN token END
  WHERE name = $1 AND token = $2 AND expires_at > now() AND (fence = $3 OR $3 = 0)
  RETURNING name, holds
)
SELECT r.holds FROM released r
LEFT JOIN LATERAL (
  SELECT pg_notify('` + releaseChannel + `',
    CASE WHEN h.token IS NULL AND left(r.name, 1) <> chr(31) THEN r.name
    ELSE chr(31) || octet_length(r.name) || ':' || r.name || coalesce(h.token, '') END)
  FROM (SELECT (SELECT q.token FROM {q} q WHERE q.name = r.name AND q.expires_at > clock_timestamp()
    AND NOT EXISTS (SELECT FROM {g} g WHERE g.name = q.name AND g.token = q.token AND g.expires_at > clock_timestamp())
    ORDER BY q.seq LIMIT 1) AS token) h
  WHERE r.holds = 0
) n ON true
UNION ALL
SELECT -1 WHERE NOT EXISTS (SELECT FROM released) AND (
  EXISTS (SELECT FROM {s} WHERE name = $1 AND token = $2) OR
  EXISTS (SELECT FROM {q} WHERE name = $1 AND token = $2) OR
  EXISTS (SELECT FROM {t} WHERE name = $1 AND (intent_token = $2 OR claim_token = $2)))`
)

func (p *postgres) acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	var (
		kind         int
		fence, ttlUS int64
		holds        int
		holder       string
		ownIntent    bool
	)
	err := p.db.QueryRowContext(ctx, p.acquireSQL,
		req.Key, req.Token, req.Owner, units(req.TTL, time.Microsecond), req.Reentrant,
	).Scan(&kind, &fence, &holds, &holder, &ttlUS, &ownIntent)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		// Shared holds keep the lock, or its holder changed while the
		// statement ran.
		res, _, _, err := p.tx.refused(ctx, req)
		return res, err
	case err != nil:
		return driver.AcquireResult{}, err
	case kind == 1:
		return driver.AcquireResult{Acquired: true, Fence: uint64(fence), Holds: holds}, nil
	}
	res := driver.AcquireResult{Holder: holder, HolderTTL: time.Duration(max(ttlUS, 0)) * time.Microsecond}
	switch {
	case req.Wait && req.Claim:
		res.Queued, err = p.tx.recordClaim(ctx, req)
		if err == nil && !res.Queued && ownIntent {
			// Another's claim goes next; the token's writer intent is
			// kept all the same, for the readers behind it.
			res.Queued, err = p.tx.recordIntent(ctx, req)
		}
	case ownIntent && req.Wait:
		// A waiting writer keeps its intent behind another writer.
		res.Queued, err = p.tx.recordIntent(ctx, req)
	}
	return res, err
}

func (p *postgres) acquireShared(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, bool, error) {
	if req.Limit > 0 {
		return driver.AcquireResult{}, false, nil // the count needs a transaction
	}
	rows, err := p.db.QueryContext(ctx, p.acquireSharedSQL, req.Key, req.Token, req.Owner, units(req.TTL, time.Microsecond))
	if err != nil {
		return driver.AcquireResult{}, true, err
	}
	// The rows come in no set order: the first in rank says (a grant; else
	// a conflict with a semaphore's holds, the exclusive holder, the
	// writer's intent, the token's own hold).
	var res driver.AcquireResult
	best := 0
	for rows.Next() {
		var kind int
		var fence, ttlUS, count int64
		var holder string
		if err := rows.Scan(&kind, &fence, &holder, &ttlUS, &count); err != nil {
			rows.Close()
			return driver.AcquireResult{}, true, err
		}
		rank := 2 * kind
		if kind == 5 {
			rank = 3
		}
		if best != 0 && rank >= best {
			continue
		}
		best = rank
		ttl := time.Duration(max(ttlUS, 0)) * time.Microsecond
		switch kind {
		case 1:
			res = driver.AcquireResult{Acquired: true, Fence: uint64(fence), Holds: 1}
		case 2:
			res = driver.AcquireResult{Holder: holder, HolderTTL: ttl}
		case 3:
			res = driver.AcquireResult{Holder: holder, HolderTTL: ttl, WriterWaiting: true, Shared: int(count)}
		case 4:
			res = driver.AcquireResult{Holder: holder, HolderTTL: ttl, Shared: int(count)}
		case 5:
			res = driver.AcquireResult{Holder: holder, HolderTTL: ttl, Shared: int(count), Conflict: true, HeldLimit: int(fence)}
		}
	}
	if err := rows.Close(); err != nil {
		return driver.AcquireResult{}, true, err
	}
	return res, true, rows.Err()
}

// renew renews an exclusive lease or a shared hold in one statement.
func (p *postgres) renew(ctx context.Context, key, token string, fence uint64, ttl time.Duration) (bool, bool, error) {
	var n int64
	err := p.db.QueryRowContext(ctx, p.renewSQL, key, token, units(ttl, time.Microsecond), fenceParam(fence)).Scan(&n)
	return n > 0, false, err
}

// renewBatch renews exclusive leases and shared holds in one statement.
func (p *postgres) renewBatch(ctx context.Context, reqs []driver.RenewRequest) ([]bool, []bool, error) {
	keys := make([]string, len(reqs))
	tokens := make([]string, len(reqs))
	ttls := make([]int64, len(reqs))
	fences := make([]int64, len(reqs))
	for i, r := range reqs {
		keys[i], tokens[i], ttls[i], fences[i] = r.Key, r.Token, units(r.TTL, time.Microsecond), fenceParam(r.Fence)
	}
	rows, err := p.db.QueryContext(ctx, p.renewBatchSQL, keys, tokens, ttls, fences)
	if err != nil {
		return nil, nil, err
	}
	held, err := renewedRows(rows, reqs)
	return held, make([]bool, len(reqs)), err
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

func (p *postgres) release(ctx context.Context, key, token string, fence uint64) (driver.ReleaseResult, bool, error) {
	res, err := scanRelease(p.db.QueryRowContext(ctx, p.releaseSQL, key, token, fenceParam(fence)))
	if err != nil {
		return driver.ReleaseResult{}, false, err
	}
	if res.Held && res.Remaining < 0 {
		return driver.ReleaseResult{}, true, nil // -1: not held, but more to remove
	}
	return res, false, nil
}
