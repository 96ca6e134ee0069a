// Multi-statement transactions that release and renew holds, and the reads
// that tell a release or renewal which holds it must handle.

package sqllock

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// release drops token's shared hold, queue entry and writer intent, for a
// Release that found no exclusive hold of token. Dropping a shared hold
// recomputes shared_until from the holds left, so that a writer gets in the
// moment the last reader leaves. It notifies (on PostgreSQL) when a shared
// hold or a live intent went, or the head of the queue left a lock without
// an exclusive holder.
//
// With withdraw (Backend.Withdraw), a shared hold of token is left alone:
// only its queue entry and writer intent go.
//
// With record, the clean-up of a request that may still be on its way (see
// goneTTL), it first records the token (grants 1, or 0 with withdraw; see
// recordGone), then makes the name's row if it is missing and drops an
// exclusive hold of token that it finds under the row's lock (a grant that
// committed after the single statement of Release looked; not with
// withdraw).
func (t *txs) release(ctx context.Context, key, token string, withdraw, record bool) (driver.ReleaseResult, error) {
	if record {
		if err := t.recordGone(ctx, key, token, withdraw); err != nil {
			return driver.ReleaseResult{}, err
		}
	}
	return t.releaseRecorded(ctx, key, token, withdraw, record)
}

// recordGone writes token's clean-up record (grants 1, or 0 with withdraw)
// and deletes the name's expired ones, on its own and before the release's
// transaction locks the name's row.
//
// From the moment the record commits, the token's queue entry is passed
// over (queueStateCols, releaseStateCols and tplFairPeek: the places ahead
// of a request, the head that a release names): a waiter that gave up
// holds the queue up no longer than its clean-up's first statement, however
// slow the rest of the clean-up is.
//
// On MySQL, under REPEATABLE READ, InnoDB runs the gone-table subqueries of
// the single-statement acquires as locking reads, which lock the gap where
// the token's record would go, and such a statement may take that gap lock
// before it waits for the name's row. A release that held the row and then
// inserted into the gap would deadlock with it, again and again while
// waiters keep asking. Written before the row is locked, the record waits
// for those statements to end and holds nothing they wait for.
//
// The record still comes first for any request of the token: a request
// that read the gap (MySQL) or took its snapshot (PostgreSQL) before the
// record, and granted or queued, is found and undone by the transaction
// that follows (on PostgreSQL a single statement that waited for that
// transaction's row lock is refused: {fresh}). If that transaction finds
// that the token's request landed (a live shared hold), it deletes the
// record with the hold.
func (t *txs) recordGone(ctx context.Context, key, token string, withdraw bool) error {
	grants := 1
	if withdraw {
		grants = 0
	}
	if _, err := t.db.ExecContext(ctx, t.gone.query, t.gone.args(key, token, grants, t.x.units(goneTTL))...); err != nil {
		return err
	}
	if t.d != MySQL {
		return nil // t.gone deleted the expired records in the same statement
	}
	tokens, err := queryStrings(ctx, t.db, t.expiredGone.query, t.expiredGone.args(key, token)...)
	if err != nil || len(tokens) == 0 {
		return err
	}
	return t.deleteGone(ctx, t.db, key, tokens)
}

// releaseRecorded is release once the token's record, if any, is written.
func (t *txs) releaseRecorded(ctx context.Context, key, token string, withdraw, record bool) (driver.ReleaseResult, error) {
	var res driver.ReleaseResult
	err := t.run(ctx, func(x *txn) (bool, error) {
		res = driver.ReleaseResult{}
		m, st, found, err := x.lockRelease(key, token, record)
		if err != nil || !found {
			return false, err
		}
		if record && !withdraw && m.heldBy(token) {
			if err := x.exec(t.dropHold, key); err != nil {
				return false, err
			}
			if m.holds <= 1 {
				x.notify(key, st.head.String)
			}
			res = driver.ReleaseResult{Held: true, Remaining: max(m.holds-1, 0)}
			return true, nil
		}
		hadShared := st.mineLeft.Valid && !withdraw
		ownIntent := m.intentToken.Valid && m.intentToken.String == token
		ownClaim := m.claimToken.Valid && m.claimToken.String == token
		hadEntry := st.myLeft.Valid
		if !hadShared && !ownIntent && !hadEntry && !ownClaim {
			// On PostgreSQL a clean-up commits all the same: a late
			// statement of the token that waited for the row it made or
			// locked then finds the row changed, and is refused ({fresh}).
			return record && t.d == PostgreSQL, nil
		}
		if record && hadShared && st.mineLeft.Int64 > 0 {
			// A live shared hold is the grant the request made: it has
			// landed, and the token's record goes.
			if err := x.exec(t.ungone, key, token); err != nil {
				return false, err
			}
		}
		if ownClaim {
			// A starving waiter's claim: the lock is left to everyone.
			if err := x.exec(t.unclaim, key, token); err != nil {
				return false, err
			}
			x.notify(key, "")
		}
		if hadShared {
			if err := x.exec(t.deleteShared, key, token); err != nil {
				return false, err
			}
		}
		if hadShared || ownIntent {
			if err := x.exec(t.releaseMain, key, st.maxOthers, token); err != nil {
				return false, err
			}
		}
		if hadEntry {
			if err := x.exec(t.dequeue, key, token); err != nil {
				return false, err
			}
		}
		// The name's expired rows go too, whatever the token had (on
		// PostgreSQL in the same statement as the writes above).
		if st.sharedExpired > 0 {
			if err := x.prune(key, token, false, false); err != nil {
				return false, err
			}
		}
		if st.queueExpired > 0 {
			if err := x.prune(key, token, true, false); err != nil {
				return false, err
			}
		}
		heldShared := hadShared && st.mineLeft.Int64 > 0
		wasHead := hadEntry && st.myLeft.Int64 > 0 && st.ahead == 0
		switch {
		case heldShared || (ownIntent && m.intentLive()):
			// Readers may be let in, or a writer: everyone tries.
			x.notify(key, "")
		case wasHead && !m.held():
			// The head left a lock without an exclusive holder: the next
			// in line may take it.
			x.notify(key, st.head.String)
		}
		res = driver.ReleaseResult{Held: heldShared}
		return true, nil
	})
	return res, err
}

// renew renews the leases of reqs (distinct key and token pairs), each
// exclusive or shared, in one transaction that locks their names' rows in
// key order (so that two batches cannot deadlock) and reports which were
// held. A shared hold's renewal raises its name's shared_until after it.
func (t *txs) renew(ctx context.Context, reqs []driver.RenewRequest) ([]bool, error) {
	held := make([]bool, len(reqs))
	err := t.run(ctx, func(x *txn) (bool, error) {
		clear(held)
		tx := x.tx
		byName := make(map[string][]int) // key → its requests
		var names []string
		for i, r := range reqs {
			if _, ok := byName[r.Key]; !ok {
				names = append(names, r.Key)
			}
			byName[r.Key] = append(byName[r.Key], i)
		}
		slices.Sort(names)

		// Lock the rows, in key order.
		args := make([]any, 0, 3*len(reqs))
		for _, n := range names {
			args = append(args, n)
		}
		lockTmpl := `SELECT name FROM {t} WHERE name IN (` + placeholders(1, len(names)) + `) ORDER BY name{forupdate}`
		if t.d == SQLite {
			lockTmpl = `UPDATE {t} SET name = name WHERE name IN (` + placeholders(1, len(names)) + `)`
		}
		lock := t.x.stmt(lockTmpl)
		if t.d == SQLite {
			if _, err := tx.ExecContext(ctx, lock.query, lock.args(args...)...); err != nil {
				return false, err
			}
		} else if _, err := queryStrings(ctx, tx, lock.query, lock.args(args...)...); err != nil {
			return false, err
		}

		// Which requests hold their lock, exclusively (kind 1) or shared. A
		// lease tied to its grant (RenewRequest.Fence) holds the row only
		// under that grant's fence.
		var cond, tied strings.Builder
		args = args[:0]
		for i, n := range names {
			if i > 0 {
				cond.WriteString(" OR ")
				tied.WriteString(" OR ")
			}
			args = append(args, n)
			cond.WriteString("(name = $" + itoa(len(args)) + " AND token IN (")
			tied.WriteString("(name = $" + itoa(len(args)) + " AND (")
			for j, k := range byName[n] {
				if j > 0 {
					cond.WriteString(", ")
					tied.WriteString(" OR ")
				}
				args = append(args, reqs[k].Token, fenceParam(reqs[k].Fence))
				tok, f := "$"+itoa(len(args)-1), "$"+itoa(len(args))
				cond.WriteString(tok)
				tied.WriteString("(token = " + tok + " AND (fence = " + f + " OR " + f + " = 0))")
			}
			cond.WriteString("))")
			tied.WriteString("))")
		}
		// A shared hold is renewed only while no exclusive holder is live:
		// one beside it would be a broken invariant (shared_until behind a
		// hold), and renewing it would keep the reader beside the writer.
		read := t.x.stmt(`SELECT 1, name, token, {left:expires_at} FROM {t} WHERE ` + tied.String() +
			` UNION ALL SELECT 2, name, token, {left:expires_at} FROM {s} s WHERE (` + cond.String() + `)
  AND NOT EXISTS (SELECT 1 FROM {t} m WHERE m.name = s.name AND m.token IS NOT NULL AND m.expires_at > {now})`)
		rows, err := tx.QueryContext(ctx, read.query, read.args(args...)...)
		if err != nil {
			return false, err
		}
		type pair struct{ key, token string }
		kind := make(map[pair]int)
		for rows.Next() {
			var k int
			var p pair
			var left int64
			if err := rows.Scan(&k, &p.key, &p.token, &left); err != nil {
				rows.Close()
				return false, err
			}
			if left > 0 && kind[p] == 0 {
				kind[p] = k
			}
		}
		if err := rows.Close(); err != nil {
			return false, err
		}
		if err := rows.Err(); err != nil {
			return false, err
		}

		// Shared holds first, then the rows: shared_until is raised by a
		// clock no earlier than the holds' own expiry.
		exclusive := make(map[string]time.Duration) // key → TTL
		shared := make(map[string]time.Duration)    // key → longest TTL
		var sharedSet strings.Builder
		var sharedCond strings.Builder
		var sharedArgs []any
		for i, r := range reqs {
			switch kind[pair{r.Key, r.Token}] {
			case 1:
				held[i] = true
				exclusive[r.Key] = r.TTL
			case 2:
				held[i] = true
				shared[r.Key] = max(shared[r.Key], r.TTL)
				sharedArgs = append(sharedArgs, r.Key, r.Token, t.x.units(r.TTL))
				n := len(sharedArgs)
				sharedSet.WriteString(" WHEN name = $" + itoa(n-2) + " AND token = $" + itoa(n-1) +
					" THEN {max}(expires_at, {plus:$" + itoa(n) + "})")
				if sharedCond.Len() > 0 {
					sharedCond.WriteString(" OR ")
				}
				sharedCond.WriteString("(name = $" + itoa(n-2) + " AND token = $" + itoa(n-1) + ")")
			}
		}
		if len(exclusive) == 0 && len(shared) == 0 {
			return false, nil
		}
		if len(shared) > 0 {
			s := t.x.stmt(`UPDATE {s} SET expires_at = CASE` + sharedSet.String() + ` ELSE expires_at END WHERE ` + sharedCond.String())
			if err := x.exec(s, sharedArgs...); err != nil {
				return false, err
			}
		}
		var set []string
		args = args[:0]
		for _, pick := range []struct {
			ttls map[string]time.Duration
			col  string
			expr string
		}{
			{exclusive, "expires_at", "{max}(expires_at, {plus:$%d})"},
			{shared, "shared_until", "{max}(COALESCE(shared_until, {now}), {plus:$%d})"},
		} {
			if len(pick.ttls) == 0 {
				continue
			}
			var b strings.Builder
			b.WriteString(pick.col + " = CASE")
			for _, n := range names {
				if ttl, ok := pick.ttls[n]; ok {
					args = append(args, n, t.x.units(ttl))
					b.WriteString(" WHEN name = $" + itoa(len(args)-1) + " THEN " +
						strings.Replace(pick.expr, "%d", itoa(len(args)), 1))
				}
			}
			b.WriteString(" ELSE " + pick.col + " END")
			set = append(set, b.String())
		}
		var in []string
		for _, n := range names {
			_, e := exclusive[n]
			_, s := shared[n]
			if e || s {
				args = append(args, n)
				in = append(in, "$"+itoa(len(args)))
			}
		}
		s := t.x.stmt(`UPDATE {t} SET ` + strings.Join(set, ", ") + ` WHERE name IN (` + strings.Join(in, ", ") + `)`)
		return true, x.exec(s, args...)
	})
	if err != nil {
		return nil, err
	}
	return held, nil
}

// classify reports which of reqs are live exclusive holds and which live
// shared holds, in one statement outside a transaction, for the batch
// renewals of SQLite and MySQL, which cannot say which leases their
// statement renewed or did not find: a lease that holds its lock
// exclusively now held it when that statement ran and was renewed; a shared
// one is for the transaction of renew; the others are not held.
func (t *txs) classify(ctx context.Context, reqs []driver.RenewRequest) (exclusive, shared []bool, err error) {
	// A lease tied to its grant (RenewRequest.Fence) holds the row only
	// under that grant's fence.
	var cond, tied strings.Builder
	args := make([]any, 0, 3*len(reqs))
	for i, r := range reqs {
		if i > 0 {
			cond.WriteString(" OR ")
			tied.WriteString(" OR ")
		}
		args = append(args, r.Key, r.Token, fenceParam(r.Fence))
		n := len(args)
		pair := "(name = $" + itoa(n-2) + " AND token = $" + itoa(n-1)
		cond.WriteString(pair + ")")
		tied.WriteString(pair + " AND (fence = $" + itoa(n) + " OR $" + itoa(n) + " = 0))")
	}
	s := t.x.stmt(`SELECT 1, name, token FROM {t} WHERE (` + tied.String() + `) AND expires_at > {now}
UNION ALL SELECT 2, name, token FROM {s} WHERE (` + cond.String() + `) AND expires_at > {now}`)
	rows, err := t.db.QueryContext(ctx, s.query, s.args(args...)...)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	type pair struct{ key, token string }
	kind := make(map[pair]int, len(reqs))
	for rows.Next() {
		var k int
		var p pair
		if err := rows.Scan(&k, &p.key, &p.token); err != nil {
			return nil, nil, err
		}
		if kind[p] == 0 {
			kind[p] = k
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	exclusive = make([]bool, len(reqs))
	shared = make([]bool, len(reqs))
	for i, r := range reqs {
		k := kind[pair{r.Key, r.Token}]
		exclusive[i], shared[i] = k == 1, k == 2
	}
	return exclusive, shared, nil
}

// more reports whether token may have a shared hold, a queue entry or a
// writer intent on key (tplHasMore), for a Release or Renew that found no
// exclusive hold of it.
func (t *txs) more(ctx context.Context, key, token string) (bool, error) {
	var n int64
	err := t.db.QueryRowContext(ctx, t.hasMore.query, t.hasMore.args(key, token)...).Scan(&n)
	return n > 0, err
}
