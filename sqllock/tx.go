// The core of the multi-statement transactions: running them (again after a
// deadlock), locking and reading a name's row and state, writes, pruning.

package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// txs runs the operations that need more than one statement in a
// transaction: semaphore permits, fair requests, the release of shared
// holds, queue entries and intents, ForceRelease, and on MySQL and SQLite
// readers and the renewal of shared holds (PostgreSQL does those two in one
// statement each). It also has the statements that every dialect shares
// (inspection, the holder of a refused request, writer intents).
//
// Every such transaction first makes sure that the name's row exists and
// locks it, and reads the name's shared holds and queue only after that:
// every change to them is made under the same lock, so what it reads is
// current, on PostgreSQL because each statement of a READ COMMITTED
// transaction reads what was committed when it began, on MySQL and MariaDB
// because the first consistent read of a transaction takes its snapshot, and
// the lock comes before it, on SQLite because the transaction holds the
// database's write lock. The exclusive upsert, which stays one statement,
// never reads those tables: what it must know (shared_until, the writer
// intent) is on the row it locks.
//
// On MySQL every write in these transactions names whole primary keys of
// rows it has read (or inserts new ones), so that InnoDB takes no gap locks
// under REPEATABLE READ, with which two transactions on neighbouring names
// could deadlock. A transaction that fails for a deadlock or a serialization
// failure anyway (PostgreSQL SQLSTATE 40P01 or 40001, MySQL error 1213) is
// rolled back whole and run again, up to maxTxAttempts times.
type txs struct {
	db   *sql.DB
	d    Dialect
	x    *dialectSQL
	opts *sql.TxOptions

	ensure       stmt // make and lock the row; returns mainCols (MySQL: nothing)
	lock         stmt // lock an existing row, returning mainCols (MySQL: none)
	main         stmt // read the row under a lock already held
	state        stmt // read nameState after the lock
	mainState    stmt // MySQL: main and state in one read
	peek         stmt // a fair waiter's poll, outside a transaction (fairFirst)
	fairState    stmt // an exclusive fair request's state (lockFair; MySQL: with main)
	sharedState  stmt // a shared request's state (lockShared, readShared; MySQL: with main)
	releaseState stmt // a release's state (lockRelease; MySQL: with main)

	insertShared, raiseShared, grant, reenter, setIntent, releaseMain, free stmt
	deleteShared, enqueue, requeue, dequeue                                 stmt
	pruneShared, pruneQueue, clearShared                                    stmt // PostgreSQL and SQLite
	expiredShared, expiredQueue, allShared                                  stmt // MySQL: the tokens to delete
	hasMore, holder, intent, claim, unclaim, inspect, list                  stmt
	moveIntent                                                              stmt // Backend.MoveIntent
	takeHeadSQL, takeFirstSQL                                               stmt // MySQL (PostgreSQL: the first): txs.takeHead
	reader, insertReader                                                    stmt // MySQL and SQLite
	dropHolder                                                              stmt // BreakIf
	gone, ungone, dropHold, expiredGone                                     stmt // clean-up records (see goneTTL)
	// committed, when set (SQLiteBackend), is told of each committed
	// change that notify announced.
	committed func(key, next string)
}

// maxTxAttempts bounds the runs of a transaction that the database rolled
// back for a deadlock or a serialization failure.
const maxTxAttempts = 5

// pruneBatch is the most expired rows of a name one MySQL transaction
// deletes; the name's next transaction deletes more.
const pruneBatch = 200

func newTxs(db *sql.DB, d Dialect, names tableNames) *txs {
	x := newDialectSQL(d, names)
	t := &txs{db: db, d: d, x: x}
	switch d {
	case PostgreSQL:
		// Each statement reads what was committed when it began: after the
		// row lock, everything done under it. (Under a server default of
		// REPEATABLE READ, such a transaction would fail instead.)
		t.opts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
		t.ensure = x.stmt(tplEnsure)
		t.lock = x.stmt(tplLock)
	case MySQL:
		// Existing or not, the row is locked by the upsert: a transaction
		// that finds nothing to do is rolled back, the row with it.
		t.ensure = x.stmt(tplEnsureMySQL)
		t.mainState = x.stmt(tplMainState)
	case SQLite:
		t.ensure = x.stmt(tplEnsure)
		t.lock = x.stmt(tplLockSQLite)
	}
	t.main = x.stmt(tplMain)
	t.state = x.stmt(tplState)
	t.peek = x.stmt(tplFairPeek)
	t.fairState = x.stmt(tplFairState)
	t.sharedState = x.stmt(tplSharedState)
	t.releaseState = x.stmt(tplReleaseState)
	if d == MySQL {
		t.releaseState = x.stmt(tplMainReleaseState)
		t.fairState = x.stmt(tplMainFairState)
		t.sharedState = x.stmt(tplMainSharedState)
	}
	t.insertShared = x.stmt(tplInsertShared)
	t.raiseShared = x.stmt(tplRaiseShared)
	t.grant = x.stmt(tplGrant)
	t.reenter = x.stmt(tplReenter)
	t.setIntent = x.stmt(tplSetIntent)
	t.releaseMain = x.stmt(tplReleaseMain)
	t.free = x.stmt(tplFree)
	t.dropHolder = x.stmt(tplDropHolder)
	t.deleteShared = x.stmt(tplDeleteShared)
	t.enqueue = x.stmt(tplEnqueue)
	t.requeue = x.stmt(tplRequeue)
	t.dequeue = x.stmt(tplDequeue)
	t.takeHeadSQL = x.stmt(tplTakeHead)
	t.takeFirstSQL = x.stmt(tplTakeFirst)
	if t.d == PostgreSQL {
		t.takeFirstSQL = x.stmt(tplTakeFirst + "{fresh:m.}\nRETURNING fence")
	}
	t.pruneShared = x.stmt(`DELETE FROM {s} WHERE name = $1 AND token <> $2 AND expires_at <= {now}`)
	t.pruneQueue = x.stmt(`DELETE FROM {q} WHERE name = $1 AND token <> $2 AND expires_at <= {now}`)
	t.clearShared = x.stmt(`DELETE FROM {s} WHERE name = $1`)
	limit := " LIMIT " + strconv.Itoa(pruneBatch)
	t.expiredShared = x.stmt(`SELECT token FROM {s} WHERE name = $1 AND token <> $2 AND expires_at <= {now}` + limit)
	t.expiredQueue = x.stmt(`SELECT token FROM {q} WHERE name = $1 AND token <> $2 AND expires_at <= {now}` + limit)
	t.allShared = x.stmt(`SELECT token FROM {s} WHERE name = $1`)
	t.gone = x.stmt(tplGone)
	if d == PostgreSQL {
		// The name's expired records go in the same statement.
		t.gone = x.stmt(`WITH pruned AS (DELETE FROM {g} WHERE name = $1 AND token <> $2 AND expires_at <= {now}) ` + tplGone)
	}
	t.ungone = x.stmt(`DELETE FROM {g} WHERE name = $1 AND token = $2`)
	t.dropHold = x.stmt(tplDropHold)
	t.expiredGone = x.stmt(`SELECT token FROM {g} WHERE name = $1 AND token <> $2 AND expires_at <= {now}` + limit)
	t.hasMore = x.stmt(tplHasMore)
	t.holder = x.stmt(tplHolder)
	t.intent = x.stmt(tplIntent)
	t.moveIntent = x.stmt(tplMoveIntent)
	t.claim = x.stmt(tplClaim)
	t.unclaim = x.stmt(tplUnclaim)
	switch d {
	case MySQL:
		t.reader = x.stmt(tplReaderMySQL)
		t.insertReader = x.stmt(tplInsertReaderMySQL)
	case SQLite:
		t.reader = x.stmt(tplReaderSQLite)
		t.insertReader = x.stmt(tplInsertReaderSQLite)
	}
	t.inspect = x.stmt(tplInspect)
	t.list = x.stmt(tplList)
	return t
}

// run runs fn in a transaction and commits it when fn says so, after its
// gathered writes (see txn), or rolls it back. It runs it again, after a
// short jittered pause, when the database rolled it back for a deadlock or
// a serialization failure.
func (t *txs) run(ctx context.Context, fn func(x *txn) (commit bool, err error)) error {
	delay := 2 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := t.once(ctx, fn)
		if err == nil || attempt == maxTxAttempts || !isConflict(err) || ctx.Err() != nil {
			return err
		}
		timer := time.NewTimer(delay/2 + rand.N(delay/2))
		select {
		case <-ctx.Done():
			timer.Stop()
			return err
		case <-timer.C:
		}
		delay *= 2
	}
}

func (t *txs) once(ctx context.Context, fn func(x *txn) (bool, error)) error {
	tx, err := t.db.BeginTx(ctx, t.opts)
	if err != nil {
		return err
	}
	x := &txn{t: t, ctx: ctx, tx: tx}
	commit, err := fn(x)
	if err == nil && commit {
		err = x.flush()
	}
	if err != nil || !commit {
		// A failed rollback leaves nothing: the server rolls back the
		// transaction of a connection it lost.
		_ = tx.Rollback()
		return err
	}
	err = tx.Commit()
	if err == nil && x.woke != nil && t.committed != nil {
		t.committed(x.woke[0], x.woke[1])
	}
	return err
}

// isConflict reports whether err is a deadlock or a serialization failure,
// after which the database rolled the transaction back and running it
// again is safe.
func isConflict(err error) bool {
	var coded interface{ SQLState() string } // pgx's *pgconn.PgError
	if errors.As(err, &coded) {
		switch coded.SQLState() {
		case "40P01", "40001":
			return true
		}
		return false
	}
	// github.com/go-sql-driver/mysql's *MySQLError, without importing the
	// driver (PostgreSQL and SQLite users would link it for nothing).
	return strings.Contains(err.Error(), "Error 1213")
}

// mainRow is a name's row, read with mainCols. Times are left in units of
// the dialect; a NULL time reads as NULL.
type mainRow struct {
	token       sql.NullString
	owner       string
	fence       int64
	holds       int
	heldLeft    sql.NullInt64
	sharedLeft  sql.NullInt64
	intentToken sql.NullString
	intentOwner sql.NullString
	intentLeft  sql.NullInt64
	claimToken  sql.NullString
	claimOwner  sql.NullString
	claimLeft   sql.NullInt64
	sharedLim   sql.NullInt64 // the Limit of the shared holds, NULL when unknown
}

func (m *mainRow) dest() []any {
	return []any{&m.token, &m.owner, &m.fence, &m.holds, &m.heldLeft, &m.sharedLeft, &m.intentToken, &m.intentOwner, &m.intentLeft, &m.claimToken, &m.claimOwner, &m.claimLeft, &m.sharedLim}
}

// conflicts reports whether a shared request of limit conflicts with the
// name's live shared holds (nLive of other tokens): they were granted with
// another Limit. A row of an earlier version, whose holds' Limit is not
// known, conflicts with nothing.
func (m *mainRow) conflicts(limit int, nLive int64) bool {
	return nLive > 0 && m.sharedLim.Valid && m.sharedLim.Int64 != int64(limit)
}

// held reports a live exclusive holder.
func (m *mainRow) held() bool { return m.token.Valid && m.heldLeft.Int64 > 0 }

// heldBy reports a live exclusive hold of token.
func (m *mainRow) heldBy(token string) bool { return m.held() && m.token.String == token }

// intentLive reports a live writer intent.
func (m *mainRow) intentLive() bool {
	return m.intentToken.Valid && m.intentLeft.Valid && m.intentLeft.Int64 > 0
}

// nameState is what tplState reads about a name's shared holds and queue
// for the request of one token. The partial reads (fairDest, sharedDest,
// releaseDest) leave the fields they do not list zero.
type nameState struct {
	sharedLive    int64         // live shared holds of other tokens
	sharedExpired int64         // expired shared holds, to delete
	mineLeft      sql.NullInt64 // the token's shared hold, if it has a row
	firstOwner    sql.NullString
	firstLeft     sql.NullInt64 // the live shared hold that expires first
	lastOwner     sql.NullString
	lastLeft      sql.NullInt64 // the live shared hold that expires last
	maxOthers     any           // its expiry, as {time:...} reads it, or nil
	mySeq         sql.NullInt64 // the token's queue entry, if it has a row
	myLeft        sql.NullInt64
	queueLive     int64          // live entries of other tokens
	ahead         int64          // of those, the ones ahead of the token's live entry (all when it has none)
	head          sql.NullString // the first live entry of another token
	maxSeq        int64
	queueExpired  int64         // expired entries, to delete
	gone          sql.NullInt64 // the token's live clean-up record: its grants (see goneTTL)
}

func (s *nameState) dest() []any {
	return []any{&s.sharedLive, &s.sharedExpired, &s.mineLeft, &s.firstOwner, &s.firstLeft, &s.lastOwner, &s.lastLeft,
		&s.maxOthers, &s.mySeq, &s.myLeft, &s.queueLive, &s.ahead, &s.head, &s.maxSeq, &s.queueExpired, &s.gone}
}

// fairDest lists the fields that fairStateCols read, in order.
func (s *nameState) fairDest() []any {
	return []any{&s.mySeq, &s.myLeft, &s.ahead, &s.maxSeq, &s.queueExpired, &s.gone}
}

// sharedDest lists the fields that sharedReqCols read, in order.
func (s *nameState) sharedDest() []any {
	return []any{&s.sharedLive, &s.sharedExpired, &s.mineLeft, &s.firstOwner, &s.firstLeft, &s.lastOwner, &s.lastLeft,
		&s.maxOthers, &s.gone}
}

// releaseDest lists the fields that releaseStateCols read, in order.
func (s *nameState) releaseDest() []any {
	return []any{&s.sharedExpired, &s.mineLeft, &s.maxOthers, &s.myLeft, &s.ahead, &s.head, &s.queueExpired}
}

// maxSeq is larger than every queue entry's seq.
const maxSeq = 1<<63 - 1

// txn is one transaction of txs. Its reads run at once; its writes, which
// never depend on each other's results, are gathered on PostgreSQL and sent
// as one statement before the commit (each a data-modifying WITH query,
// under one statement_timestamp()), and run in order elsewhere.
type txn struct {
	t   *txs
	ctx context.Context
	tx  *sql.Tx

	parts    []string // PostgreSQL: the gathered writes
	args     []any
	announce *string // PostgreSQL: the payload to notify, if any
	// woke: elsewhere, the change to announce after the commit (see
	// txs.committed), if any.
	woke *[2]string
}

// lock locks the name's row, with ensure making it first if missing, and
// reads it, and with state the name's shared holds and queue for token.
// found is false when the row is missing (never with ensure).
func (x *txn) lock(key, token string, ensure, state bool) (m mainRow, st nameState, found bool, err error) {
	t := x.t
	if m, found, err = x.lockFound(key, ensure); err != nil || !found {
		return m, st, found, err
	}
	switch {
	case state && t.d == MySQL:
		err = x.readPart(&m, t.mainState, st.dest(), key, token, int64(maxSeq))
	case state:
		err = x.readPart(&m, t.state, st.dest(), key, token, int64(maxSeq))
	case t.d == MySQL:
		err = x.tx.QueryRowContext(x.ctx, t.main.query, t.main.args(key)...).Scan(m.dest()...)
	}
	return m, st, err == nil, err
}

// lockFair is lock with ensure and state for an exclusive fair request: it
// reads the fields of nameState that fairDest lists, and the shared holds'
// only when the row's shared_until is in the future (the expiry of the
// latest shared hold: none is live before it).
func (x *txn) lockFair(key, token string) (m mainRow, st nameState, err error) {
	t := x.t
	if m, err = x.lockRow(key); err != nil {
		return m, st, err
	}
	if err = x.readPart(&m, t.fairState, st.fairDest(), key, token, int64(maxSeq)); err != nil || m.sharedLeft.Int64 <= 0 {
		return m, st, err
	}
	err = x.tx.QueryRowContext(x.ctx, t.state.query, t.state.args(key, token, int64(maxSeq))...).Scan(st.dest()...)
	return m, st, err
}

// lockShared is lock with ensure and state for a shared request: it reads
// the fields of nameState that sharedDest lists (not the queue's, which
// no shared request on SQL waits in).
func (x *txn) lockShared(key, token string) (m mainRow, st nameState, err error) {
	if m, err = x.lockRow(key); err != nil {
		return m, st, err
	}
	err = x.readPart(&m, x.t.sharedState, st.sharedDest(), key, token)
	return m, st, err
}

// lockRelease is lock with state for a release's transaction (ensure: make
// the row when missing): it reads the fields of nameState that releaseDest
// lists. found is false when the row is missing (never with ensure, nor
// on MySQL, where the row is always made).
func (x *txn) lockRelease(key, token string, ensure bool) (m mainRow, st nameState, found bool, err error) {
	if m, found, err = x.lockFound(key, ensure); err != nil || !found {
		return m, st, found, err
	}
	err = x.readPart(&m, x.t.releaseState, st.releaseDest(), key, token, int64(maxSeq))
	return m, st, err == nil, err
}

// readShared is read for a shared request, as lockShared reads.
func (x *txn) readShared(key, token string) (m mainRow, st nameState, err error) {
	t := x.t
	if t.d != MySQL {
		if err = x.tx.QueryRowContext(x.ctx, t.main.query, t.main.args(key)...).Scan(m.dest()...); err != nil {
			return m, st, err
		}
	}
	err = x.readPart(&m, t.sharedState, st.sharedDest(), key, token)
	return m, st, err
}

// lockRow makes the name's row if it is missing and locks it; on
// PostgreSQL and SQLite it returns it too (on MySQL, the state's read
// reads it: readPart, readLocked).
func (x *txn) lockRow(key string) (m mainRow, err error) {
	t := x.t
	if t.d == MySQL {
		_, err = x.tx.ExecContext(x.ctx, t.ensure.query, t.ensure.args(key)...)
		return m, err
	}
	err = x.tx.QueryRowContext(x.ctx, t.ensure.query, t.ensure.args(key)...).Scan(m.dest()...)
	return m, err
}

// lockFound is lockRow when ensure is set (and always on MySQL, where the
// row is always made); otherwise it locks the row only when it exists, and
// found is false when it does not.
func (x *txn) lockFound(key string, ensure bool) (m mainRow, found bool, err error) {
	t := x.t
	if t.d == MySQL || ensure {
		m, err = x.lockRow(key)
		return m, err == nil, err
	}
	err = x.tx.QueryRowContext(x.ctx, t.lock.query, t.lock.args(key)...).Scan(m.dest()...)
	if errors.Is(err, sql.ErrNoRows) {
		return m, false, nil
	}
	return m, err == nil, err
}

// readPart reads, with s, the fields of nameState in dest, and on MySQL the
// name's row into m first (s reads them in one statement there).
func (x *txn) readPart(m *mainRow, s stmt, dest []any, args ...any) error {
	if x.t.d == MySQL {
		dest = append(m.dest(), dest...)
	}
	return x.tx.QueryRowContext(x.ctx, s.query, s.args(args...)...).Scan(dest...)
}

// read reads the name's row and its state for token, under a lock the
// transaction already holds.
func (x *txn) read(key, token string) (m mainRow, st nameState, err error) {
	t := x.t
	if t.d == MySQL {
		dest := append(m.dest(), st.dest()...)
		err = x.tx.QueryRowContext(x.ctx, t.mainState.query, t.mainState.args(key, token, int64(maxSeq))...).Scan(dest...)
		return m, st, err
	}
	if err = x.tx.QueryRowContext(x.ctx, t.main.query, t.main.args(key)...).Scan(m.dest()...); err != nil {
		return m, st, err
	}
	err = x.tx.QueryRowContext(x.ctx, t.state.query, t.state.args(key, token, int64(maxSeq))...).Scan(st.dest()...)
	return m, st, err
}

// exec runs a write, or on PostgreSQL gathers it for flush.
func (x *txn) exec(s stmt, args ...any) error {
	if x.t.d != PostgreSQL {
		_, err := x.tx.ExecContext(x.ctx, s.query, s.args(args...)...)
		return err
	}
	x.parts = append(x.parts, renumber(s.query, len(x.args)))
	x.args = append(x.args, args...)
	return nil
}

// notify announces a change on PostgreSQL (see encodePayload), when the
// transaction commits; elsewhere it does nothing.
func (x *txn) notify(key, next string) {
	if x.t.d == PostgreSQL {
		p := encodePayload(key, next)
		x.announce = &p
		return
	}
	x.woke = &[2]string{key, next}
}

// flush sends the gathered writes (PostgreSQL) as one statement.
func (x *txn) flush() error {
	if len(x.parts) == 0 && x.announce == nil {
		return nil
	}
	var q strings.Builder
	for i, p := range x.parts {
		if i == 0 {
			q.WriteString("WITH ")
		} else {
			q.WriteString(", ")
		}
		q.WriteString("w" + itoa(i) + " AS (" + p + ")")
	}
	args := x.args
	if x.announce != nil {
		args = append(args, *x.announce)
		q.WriteString(" SELECT pg_notify('" + releaseChannel + "', $" + itoa(len(args)) + ")")
	} else {
		q.WriteString(" SELECT 1")
	}
	_, err := x.tx.ExecContext(x.ctx, q.String(), args...)
	return err
}

// renumber adds off to the number of every $n placeholder of q.
func renumber(q string, off int) string {
	if off == 0 {
		return q
	}
	var b strings.Builder
	for {
		i := strings.IndexByte(q, '$')
		if i < 0 {
			b.WriteString(q)
			return b.String()
		}
		j := i + 1
		for j < len(q) && q[j] >= '0' && q[j] <= '9' {
			j++
		}
		n, _ := strconv.Atoi(q[i+1 : j])
		b.WriteString(q[:i+1] + itoa(n+off))
		q = q[j:]
	}
}

// prune deletes the name's expired rows, but token's, of the shared-hold
// table (queue false) or the queue table, or, with all, every shared hold.
func (x *txn) prune(key, token string, queue, all bool) error {
	t := x.t
	if t.d != MySQL {
		switch {
		case all:
			return x.exec(t.clearShared, key)
		case queue:
			return x.exec(t.pruneQueue, key, token)
		}
		return x.exec(t.pruneShared, key, token)
	}
	sel, table := t.expiredShared, t.x.s
	switch {
	case all:
		sel = t.allShared
	case queue:
		sel, table = t.expiredQueue, t.x.q
	}
	a := []any{key, token}
	if all {
		a = a[:1]
	}
	tokens, err := queryStrings(x.ctx, x.tx, sel.query, sel.args(a...)...)
	if err != nil || len(tokens) == 0 {
		return err
	}
	args := make([]any, 0, 1+len(tokens))
	args = append(args, key)
	for _, tok := range tokens {
		args = append(args, tok)
	}
	_, err = x.tx.ExecContext(x.ctx, "DELETE FROM "+table+" WHERE name = ? AND token IN ("+strings.Repeat("?, ", len(tokens)-1)+"?)", args...)
	return err
}

// deleteGone deletes the expired clean-up records of tokens of a name, by
// primary key (on MySQL, so that InnoDB locks no gap). A record that
// another clean-up wrote again since its token was read as expired lives,
// and stays.
func (t *txs) deleteGone(ctx context.Context, q execer, key string, tokens []string) error {
	args := make([]any, 0, 1+len(tokens))
	args = append(args, key)
	for _, tok := range tokens {
		args = append(args, tok)
	}
	_, err := q.ExecContext(ctx, "DELETE FROM "+t.x.g+" WHERE name = ? AND token IN ("+strings.Repeat("?, ", len(tokens)-1)+"?) AND expires_at <= "+t.x.now(), args...)
	return err
}

// execer is a *sql.DB or a *sql.Tx.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// queryStrings returns the first column of every row of a query.
func queryStrings(ctx context.Context, q querier, query string, args ...any) ([]string, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// querier is a *sql.DB or a *sql.Tx.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}
