// The templates of the statements every dialect runs alike: shared holds,
// fair queues, writer intents and inspection.

package sqllock

// Templates (see dialectSQL) of the statements that every dialect runs
// alike. Those marked "in a transaction" run only after the name's row has
// been locked (txs.lock), and may then trust what they read: every change to
// a name's shared holds, queue entries and writer intent is made under that
// lock.
const (
	// mainCols is a name's row as mainRow scans it.
	mainCols = `token, owner, fence, holds, {left:expires_at}, {left:shared_until}, intent_token, intent_owner, {left:intent_until}, claim_token, claim_owner, {left:claim_until}, shared_lim`

	// tplEnsure makes the name's row if it has none (free, fence 0) and
	// locks it, in one statement, and returns it (PostgreSQL and SQLite;
	// the update changes nothing but takes the row lock).
	tplEnsure = `INSERT INTO {t} (name, token, owner, fence, holds, acquired_at, expires_at)
VALUES ($1, NULL, '', 0, 0, {now}, {now})
ON CONFLICT (name) DO UPDATE SET name = excluded.name
RETURNING ` + mainCols

	// MySQL: the same in two statements. ON DUPLICATE KEY UPDATE takes an
	// exclusive lock on an existing row (INSERT IGNORE would take a shared
	// one, and two transactions that both upgrade it deadlock); the SELECT
	// after it is the transaction's first consistent read, so its snapshot
	// is taken after the lock and sees every change made under it.
	tplEnsureMySQL = `INSERT INTO {t} (name, token, owner, fence, holds, acquired_at, expires_at)
VALUES ($1, NULL, '', 0, 0, {now}, {now})
ON DUPLICATE KEY UPDATE fence = fence`
	tplMain = `SELECT ` + mainCols + ` FROM {t} WHERE name = $1`

	// tplLock locks an existing row (PostgreSQL and MySQL); SQLite takes
	// the database's write lock with a write instead.
	tplLock       = tplMain + `{forupdate}`
	tplLockSQLite = `UPDATE {t} SET name = name WHERE name = $1 RETURNING ` + mainCols

	// notGoneEntry passes over a queue entry q of a token whose clean-up
	// is recorded (see goneTTL): its waiter gave up, and the entry only
	// waits for the rest of that clean-up to delete it.
	notGoneEntry = `
     AND NOT EXISTS (SELECT 1 FROM {g} g WHERE g.name = q.name AND g.token = q.token AND g.expires_at > {now})`

	// stateCols read, in a transaction, what the name's shared holds and
	// queue say to the request of token $2 ($3 is larger than every seq):
	// nameState's fields, in order. tplState reads them alone; on MySQL,
	// tplMainState reads them with the name's row, in the transaction's
	// first consistent read.
	stateCols = sharedStateCols + `,` + queueStateCols

	// sharedStateCols are stateCols' reads of the shared holds, and
	// queueStateCols those of the queue and the clean-up records.
	sharedStateCols = sLive + `,` + sExpired + `,` + sMine + `,` + sFirstOwner + `,` + sFirstLeft + `,` + sLastOwner + `,` + sLastLeft + `,` + sMaxOthers

	// The reads of sharedStateCols, in its order.
	sLive = `
  (SELECT COUNT(*) FROM {s} WHERE name = $1 AND token <> $2 AND expires_at > {now})`
	sExpired = `
  (SELECT COUNT(*) FROM {s} WHERE name = $1 AND expires_at <= {now})`
	sMine = `
  (SELECT {left:expires_at} FROM {s} WHERE name = $1 AND token = $2)`
	sFirstOwner = `
  (SELECT owner FROM {s} WHERE name = $1 AND token <> $2 AND expires_at > {now} ORDER BY expires_at, fence LIMIT 1)`
	sFirstLeft = `
  (SELECT {left:expires_at} FROM {s} WHERE name = $1 AND token <> $2 AND expires_at > {now} ORDER BY expires_at, fence LIMIT 1)`
	sLastOwner = `
  (SELECT owner FROM {s} WHERE name = $1 AND token <> $2 AND expires_at > {now} ORDER BY expires_at DESC, fence DESC LIMIT 1)`
	sLastLeft = `
  (SELECT {left:expires_at} FROM {s} WHERE name = $1 AND token <> $2 AND expires_at > {now} ORDER BY expires_at DESC, fence DESC LIMIT 1)`
	sMaxOthers = `
  (SELECT {time:MAX(expires_at)} FROM {s} WHERE name = $1 AND token <> $2 AND expires_at > {now})`
	queueStateCols = qMySeq + `,` + qMyLeft + `,` + qLive + `,` + qAhead + `,` + qHead + `,` + qMaxSeq + `,` + qExpired + `,` + gMine

	// fairStateCols are those of queueStateCols that an exclusive fair
	// request reads (txn.lockFair): the fields of nameState that
	// nameState.fairDest lists.
	fairStateCols = qMySeq + `,` + qMyLeft + `,` + qAhead + `,` + qMaxSeq + `,` + qExpired + `,` + gMine

	// The reads of queueStateCols, in its order.
	qMySeq = `
  (SELECT seq FROM {q} WHERE name = $1 AND token = $2)`
	qMyLeft = `
  (SELECT {left:expires_at} FROM {q} WHERE name = $1 AND token = $2)`
	qLive = `
  (SELECT COUNT(*) FROM {q} q WHERE name = $1 AND token <> $2 AND expires_at > {now}` + notGoneEntry + `)`
	qAhead = `
  (SELECT COUNT(*) FROM {q} q WHERE name = $1 AND token <> $2 AND expires_at > {now}` + notGoneEntry + `
     AND seq < COALESCE((SELECT seq FROM {q} WHERE name = $1 AND token = $2 AND expires_at > {now}), $3))`
	qHead = `
  (SELECT token FROM {q} q WHERE name = $1 AND token <> $2 AND expires_at > {now}` + notGoneEntry + ` ORDER BY seq LIMIT 1)`
	qMaxSeq = `
  (SELECT COALESCE(MAX(seq), 0) FROM {q} WHERE name = $1)`
	qExpired = `
  (SELECT COUNT(*) FROM {q} WHERE name = $1 AND expires_at <= {now})`
	gMine = `
  (SELECT MAX(grants) FROM {g} WHERE name = $1 AND token = $2 AND expires_at > {now})`
	tplState = `SELECT` + stateCols

	tplMainState = `SELECT ` + mainCols + `,` + stateCols + ` FROM {t} WHERE name = $1`

	// tplFairState reads fairStateCols alone for an exclusive fair
	// request, tplMainFairState with the name's row (MySQL). The shared
	// holds are read (tplState) only when the row's shared_until says
	// that some may be live (txn.lockFair): MariaDB's optimizer takes
	// about as long per subquery as the lookups themselves.
	tplFairState     = `SELECT` + fairStateCols
	tplMainFairState = `SELECT ` + mainCols + `,` + fairStateCols + ` FROM {t} WHERE name = $1`

	// sharedReqCols are what a shared request (a reader or a permit, never
	// Fair on SQL) reads of nameState, the fields nameState.sharedDest
	// lists: the shared holds and the token's clean-up record, not the
	// queue. tplSharedState reads them alone, tplMainSharedState with the
	// name's row (MySQL).
	sharedReqCols = sharedStateCols + `,` + gMine

	// releaseStateCols are what a release's transaction reads of nameState
	// (txs.releaseRecorded), the fields nameState.releaseDest lists.
	releaseStateCols    = sExpired + `,` + sMine + `,` + sMaxOthers + `,` + qMyLeft + `,` + qAhead + `,` + qHead + `,` + qExpired
	tplReleaseState     = `SELECT` + releaseStateCols
	tplMainReleaseState = `SELECT ` + mainCols + `,` + releaseStateCols + ` FROM {t} WHERE name = $1`
	tplSharedState      = `SELECT` + sharedReqCols
	tplMainSharedState  = `SELECT ` + mainCols + `,` + sharedReqCols + ` FROM {t} WHERE name = $1`

	// tplFairPeek reads, outside a transaction, what a fair waiter's poll
	// needs (txs.fairFirst): the holder, the latest expiry of the shared
	// holds, the writer intent, the expiry of token $2's queue entry and
	// the live entries ahead of it, passing over those of tokens whose
	// clean-up is recorded. Few subqueries: MariaDB's optimizer takes
	// about as long again per subquery as the row lookups themselves.
	tplFairPeek = `SELECT m.token, m.owner, {left:m.expires_at}, {left:m.shared_until}, m.intent_token, {left:m.intent_until}, {left:q.expires_at},
  (SELECT COUNT(*) FROM {q} o LEFT JOIN {g} g ON g.name = o.name AND g.token = o.token AND g.expires_at > {now}
     WHERE o.name = $1 AND o.token <> $2 AND o.expires_at > {now} AND o.seq < q.seq AND g.token IS NULL)
FROM {t} m LEFT JOIN {q} q ON q.name = m.name AND q.token = $2 WHERE m.name = $1`

	// A reader (Limit 0) in a transaction of three statements on MySQL and
	// SQLite: the upsert makes or locks the row and, when no live exclusive
	// holder, no live intent of another token and no live shared holds of
	// a semaphore (shared_lim) are on it, draws the fence, sets shared_lim
	// to 0 and raises shared_until ($3 is the TTL); then tplInsertReader
	// adds the hold. What the grant must know is on the row, which the
	// upsert locks, so nothing is read before. On MySQL LAST_INSERT_ID is
	// the fence of a grant (1 for a new row, from VALUES) or 0; on SQLite a
	// grant returns the fence. MySQL assigns in order, each IF seeing the
	// columns assigned before it: shared_lim goes first, and leaves the
	// condition as it was (0 where it held, unchanged where it did not).
	tplReaderMySQL = `INSERT INTO {t} (name, token, owner, fence, holds, acquired_at, expires_at, shared_until, shared_lim)
VALUES ($1, NULL, '', LAST_INSERT_ID(1), 0, {now}, {now}, {plus:$3}, 0)
ON DUPLICATE KEY UPDATE
  shared_lim   = IF(` + readerFreeMySQL + `, 0, shared_lim),
  shared_until = IF(` + readerFreeMySQL + `, GREATEST(COALESCE(shared_until, {now}), {plus:$3}), shared_until),
  fence        = IF(` + readerFreeMySQL + `, LAST_INSERT_ID(fence + 1), fence + LAST_INSERT_ID(0))`
	readerFreeMySQL = `(token IS NULL OR expires_at <= {now}) AND (intent_token IS NULL OR intent_until <= {now} OR intent_token = $2)
                    AND (shared_until IS NULL OR shared_until <= {now} OR shared_lim IS NULL OR shared_lim = 0)
                    AND NOT EXISTS (SELECT 1 FROM {g} WHERE name = $1 AND token = $2 AND grants > 0 AND expires_at > {now})`
	tplReaderSQLite = `INSERT INTO {t} (name, token, owner, fence, holds, acquired_at, expires_at, shared_until, shared_lim)
VALUES ($1, NULL, '', 1, 0, {now}, {now}, {plus:$3}, 0)
ON CONFLICT (name) DO UPDATE SET fence = fence + 1, shared_lim = 0,
  shared_until = max(COALESCE(shared_until, excluded.acquired_at), excluded.shared_until)
WHERE (token IS NULL OR expires_at <= excluded.acquired_at)
  AND (intent_token IS NULL OR intent_until <= excluded.acquired_at OR intent_token = $2)
  AND (shared_until IS NULL OR shared_until <= excluded.acquired_at OR shared_lim IS NULL OR shared_lim = 0)
RETURNING fence`

	// The reader's hold (fence $4, TTL $5), after tplReader granted it. Its
	// expiry is capped by the shared_until that the upsert set, by an
	// earlier clock, so that shared_until stays at or after the expiry of
	// every live hold: the exclusive upsert trusts it. A live hold of the
	// same token is kept, and the grant refused (a token holds once): on
	// SQLite no row changes, on MySQL LAST_INSERT_ID is 0 (else the fence).
	tplInsertReaderSQLite = `INSERT INTO {s} (name, token, owner, fence, lim, acquired_at, expires_at)
VALUES ($1, $2, $3, $4, 0, {now}, min({plus:$5}, (SELECT shared_until FROM {t} WHERE name = $1)))
ON CONFLICT (name, token) DO UPDATE SET owner = excluded.owner, fence = excluded.fence, lim = excluded.lim,
  acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
WHERE expires_at <= {now}`
	tplInsertReaderMySQL = `INSERT INTO {s} (name, token, owner, fence, lim, acquired_at, expires_at)
VALUES ($1, $2, $3, LAST_INSERT_ID($4), 0, {now}, LEAST({plus:$5}, (SELECT shared_until FROM {t} WHERE name = $1)))
ON DUPLICATE KEY UPDATE
  owner       = IF(expires_at <= {now}, VALUES(owner), owner),
  lim         = IF(expires_at <= {now}, VALUES(lim), lim),
  acquired_at = IF(expires_at <= {now}, VALUES(acquired_at), acquired_at),
  fence       = IF(expires_at <= {now}, LAST_INSERT_ID(VALUES(fence)), fence + LAST_INSERT_ID(0)),
  expires_at  = IF(expires_at <= {now}, VALUES(expires_at), expires_at)`

	// Writes in a transaction, each on rows found by the reads before it.

	// A shared grant: the hold's row (fence $4, limit $5, TTL $6), then the
	// name's fence, shared_lim ($4) and shared_until, which is raised after
	// the row's expiry was set, by a clock no earlier.
	tplInsertShared = `INSERT INTO {s} (name, token, owner, fence, lim, acquired_at, expires_at)
VALUES ($1, $2, $3, $4, $5, {now}, {plus:$6})
{upsert:name, token} owner = {new:owner}, fence = {new:fence}, lim = {new:lim},
  acquired_at = {new:acquired_at}, expires_at = {new:expires_at}`
	tplRaiseShared = `UPDATE {t} SET fence = $2, shared_lim = $4, shared_until = {max}(COALESCE(shared_until, {now}), {plus:$3}) WHERE name = $1`

	// An exclusive grant by the transaction path (fence $2, TTL $4): it
	// removes token $5's intent, and an intent that has lapsed.
	tplGrant = `UPDATE {t} SET
  intent_owner = CASE WHEN intent_token = $5 OR intent_until <= {now} THEN NULL ELSE intent_owner END,
  intent_token = CASE WHEN intent_token = $5 OR intent_until <= {now} THEN NULL ELSE intent_token END,
  fence = $2, holds = 1, acquired_at = {now}, owner = $3, expires_at = {plus:$4}, token = $5
WHERE name = $1`
	tplReenter = `UPDATE {t} SET holds = holds + 1, expires_at = {max}(expires_at, {plus:$2}) WHERE name = $1`

	// tplTakeHead is tplGrant for token $2 (owner $3, TTL $4) as the fair
	// queue's head, on MySQL (txs.takeHead): it matches only where
	// acquireFair would grant, and then some: the lock not held, shared_until
	// past (no shared hold live), no live entry of another token whose
	// clean-up is not recorded ahead of the token's live one (of any live
	// one when the token has none; $5 is larger than every seq), no
	// clean-up record of the token, and no expired entry, which the
	// transaction deletes as it grants (by primary key: see txn.prune).
	// LAST_INSERT_ID is the new fence, 0 when nothing matched.
	//
	// The subqueries name the row (m.name), not $1: correlated, they run
	// after the UPDATE has locked the row. MariaDB reads an uncorrelated
	// lookup by primary key as a constant table while it optimizes the
	// statement, under REPEATABLE READ with shared next-key locks, before
	// it locks the row; a transaction that holds the row and inserts in
	// that gap (an entry, a record) then deadlocks with the UPDATE.
	tplTakeHead = `UPDATE {t} m SET
  intent_owner = CASE WHEN intent_token = $2 OR intent_until <= {now} THEN NULL ELSE intent_owner END,
  intent_token = CASE WHEN intent_token = $2 OR intent_until <= {now} THEN NULL ELSE intent_token END,
  fence = {nextfence}, holds = 1, acquired_at = {now}, owner = $3, expires_at = {plus:$4}, token = $2
WHERE m.name = $1 AND (token IS NULL OR expires_at <= {now})
  AND (shared_until IS NULL OR shared_until <= {now})
  AND NOT EXISTS (SELECT 1 FROM {g} WHERE name = m.name AND token = $2 AND expires_at > {now})
  AND NOT EXISTS (SELECT 1 FROM {q} WHERE name = m.name AND expires_at <= {now})
  AND NOT EXISTS (SELECT 1 FROM {q} o LEFT JOIN {g} g ON g.name = o.name AND g.token = o.token AND g.expires_at > {now}
     WHERE o.name = m.name AND o.token <> $2 AND o.expires_at > {now} AND g.token IS NULL
       AND o.seq < COALESCE((SELECT seq FROM {q} WHERE name = m.name AND token = $2 AND expires_at > {now}), $5))`

	// tplTakeFirst is tplTakeHead for a first request of token $2, which
	// has no queue entry to delete after the grant: it matches only when
	// the token has none.
	tplTakeFirst = tplTakeHead + `
  AND NOT EXISTS (SELECT 1 FROM {q} WHERE name = m.name AND token = $2)`

	// tplSetIntent records token $2's writer intent, for QueueTTL $4.
	tplSetIntent = `UPDATE {t} SET intent_token = $2, intent_owner = $3, intent_until = {plus:$4} WHERE name = $1`

	// tplReleaseMain sets shared_until to $2 (a value read with {time:...},
	// or NULL) and drops token $3's intent, and one that has lapsed.
	tplReleaseMain = `UPDATE {t} SET shared_until = {at:$2},
  intent_owner = CASE WHEN intent_token = $3 OR intent_until <= {now} THEN NULL ELSE intent_owner END,
  intent_token = CASE WHEN intent_token = $3 OR intent_until <= {now} THEN NULL ELSE intent_token END
WHERE name = $1`

	// tplFree frees the row of its exclusive holder and shared holds
	// (ForceRelease), and drops an intent that has lapsed.
	tplFree = `UPDATE {t} SET token = NULL, shared_until = NULL,
  intent_owner = CASE WHEN intent_until <= {now} THEN NULL ELSE intent_owner END,
  intent_token = CASE WHEN intent_until <= {now} THEN NULL ELSE intent_token END
WHERE name = $1`

	// tplDropHolder frees the row of its exclusive holder (BreakIf, once
	// the transaction has found its fence).
	tplDropHolder = `UPDATE {t} SET token = NULL WHERE name = $1`

	tplDeleteShared = `DELETE FROM {s} WHERE name = $1 AND token = $2`
	tplEnqueue      = `INSERT INTO {q} (name, token, seq, expires_at) VALUES ($1, $2, $3, {plus:$4})`
	tplRequeue      = `UPDATE {q} SET seq = $3, expires_at = {plus:$4} WHERE name = $1 AND token = $2`
	tplDequeue      = `DELETE FROM {q} WHERE name = $1 AND token = $2`

	// tplHasMore tells whether token $2 has a shared hold, a queue entry, a
	// writer intent or a claim on the name, for a Release or Renew that found no
	// exclusive hold of it (outside a transaction: a hint, which the
	// transaction checks).
	tplHasMore = `SELECT
  (SELECT COUNT(*) FROM {s} WHERE name = $1 AND token = $2) +
  (SELECT COUNT(*) FROM {q} WHERE name = $1 AND token = $2) +
  (SELECT COUNT(*) FROM {t} WHERE name = $1 AND (intent_token = $2 OR claim_token = $2))`

	// tplHolder reads who keeps an exclusive request of the name out, after
	// its upsert was refused (SQLite and MySQL): the exclusive holder, and
	// the live shared holds (their number, and the one that expires last);
	// whether token $2 has a live writer intent, which a request with Wait
	// keeps whatever refused it; the owner of another token's live claim,
	// which keeps a free lock for that token; and how long token $2's own
	// claim has left.
	tplHolder = `SELECT owner, token IS NOT NULL AND expires_at > {now}, {left:expires_at},
  intent_token IS NOT NULL AND intent_token = $2 AND intent_until > {now},
  (SELECT COUNT(*) FROM {s} WHERE name = $1 AND expires_at > {now}),
  (SELECT owner FROM {s} WHERE name = $1 AND expires_at > {now} ORDER BY expires_at DESC, fence DESC LIMIT 1),
  (SELECT {left:expires_at} FROM {s} WHERE name = $1 AND expires_at > {now} ORDER BY expires_at DESC, fence DESC LIMIT 1),
  CASE WHEN claim_token IS NOT NULL AND claim_token <> $2 AND claim_until > {now} THEN claim_owner END,
  CASE WHEN claim_token = $2 THEN {left:claim_until} END
FROM {t} WHERE name = $1`

	// tplClaim records or refreshes token $2's claim on the next grant
	// (driver.AcquireRequest.Claim), for ClaimTTL $4, unless another
	// token's claim is live, and keeps the token's own live writer intent
	// for QueueTTL $5: one statement on the row alone.
	tplClaim = `UPDATE {t} SET intent_until = CASE WHEN intent_token = $2 AND intent_until > {now}
    THEN {max}(intent_until, {plus:$5}) ELSE intent_until END,
  claim_owner = $3, claim_until = {plus:$4}, claim_token = $2{matched}
WHERE name = $1 AND (claim_token IS NULL OR claim_until <= {now} OR claim_token = $2)` + notGone

	// tplUnclaim drops token $2's claim, when its wait ends.
	tplUnclaim = `UPDATE {t} SET claim_token = NULL, claim_owner = NULL, claim_until = NULL
WHERE name = $1 AND claim_token = $2`

	// tplIntent records token $2's writer intent for QueueTTL $4 after an
	// exclusive request with Wait was refused, if shared holds still keep
	// the name and no other token's intent is live; the token's own live
	// intent is refreshed whatever refused it (another writer, too), so
	// that a waiting writer keeps its place ahead of new readers. One
	// statement on the row alone, so row locking makes it exact. (MySQL
	// adds fence = LAST_INSERT_ID(fence) to tell a match.)
	tplIntent = `UPDATE {t} SET intent_owner = $3, intent_until = {plus:$4}, intent_token = $2{matched}
WHERE name = $1 AND ((shared_until > {now} AND NOT (token IS NOT NULL AND expires_at > {now})
    AND (intent_token IS NULL OR intent_until <= {now} OR intent_token = $2))
  OR (intent_token = $2 AND intent_until > {now}))` + notGone

	// tplMoveIntent gives token $3 a writer intent for QueueTTL $5, with
	// owner $4, in place of token $2's live intent, or while $2 holds the
	// name exclusively and no intent is live (driver.IntentMover); $3's own
	// live intent is refreshed. Not while a record of $3's clean-up lives.
	tplMoveIntent = `UPDATE {t} SET intent_token = $3, intent_owner = $4, intent_until = {plus:$5}{matched}
WHERE name = $1 AND (
  (intent_until > {now} AND (intent_token = $2 OR intent_token = $3))
  OR ((intent_token IS NULL OR intent_until <= {now}) AND token = $2 AND expires_at > {now}))
  AND NOT EXISTS (SELECT 1 FROM {g} WHERE name = $1 AND token = $3 AND expires_at > {now})`

	// notGone keeps an intent or a claim of token $2 off the name's row
	// while a record of the token's clean-up lives (see goneTTL).
	notGone = `
  AND NOT EXISTS (SELECT 1 FROM {g} WHERE name = $1 AND token = $2 AND expires_at > {now}){fresh:}`

	// tplGone records token $2's clean-up for $4 units: $3 is 1 after a
	// release that found nothing, which refuses the token's grants too, 0
	// after a withdrawal; a live record of 1 stays 1.
	tplGone = `INSERT INTO {g} (name, token, grants, expires_at) VALUES ($1, $2, $3, {plus:$4})
{upsert:name, token} grants = CASE WHEN {g}.expires_at > {now} AND {g}.grants > {new:grants} THEN {g}.grants ELSE {new:grants} END,
  expires_at = {new:expires_at}`

	// tplDropHold drops one exclusive hold of the row, which the
	// transaction found token's under its lock (token first: MySQL
	// assigns in order).
	tplDropHold = `UPDATE {t} SET token = CASE WHEN holds > 1 THEN token END, holds = holds - 1 WHERE name = $1`

	// Inspection: the name's row with each of its live shared holds, oldest
	// grant first. infoCols is what scanInfos reads.
	infoCols = `m.name, m.owner, m.fence, m.holds, {left:m.expires_at}, {since:m.acquired_at},
  m.token IS NOT NULL AND m.expires_at > {now},
  m.intent_token IS NOT NULL AND m.intent_until > {now},
  (SELECT COUNT(*) FROM {q} q WHERE q.name = m.name AND q.expires_at > {now}),
  s.owner, s.fence, {left:s.expires_at}, s.lim`
	tplInspect = `SELECT ` + infoCols + `
FROM {t} m LEFT JOIN {s} s ON s.name = m.name AND s.expires_at > {now}
WHERE m.name = $1
ORDER BY s.fence`
	tplList = `SELECT ` + infoCols + `
FROM {t} m LEFT JOIN {s} s ON s.name = m.name AND s.expires_at > {now}
WHERE {prefix:m.name} AND ((m.token IS NOT NULL AND m.expires_at > {now}) OR s.name IS NOT NULL)
ORDER BY m.name, s.fence`
)
