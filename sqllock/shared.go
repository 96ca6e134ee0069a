package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// acquireShared makes or refuses a shared grant in a transaction: the
// semaphore's count needs the name's shared holds, read under the row lock.
// A refusal records nothing and is rolled back.
func (t *txs) acquireShared(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	var res driver.AcquireResult
	ttl := t.x.units(req.TTL)
	err := t.run(ctx, func(x *txn) (bool, error) {
		res = driver.AcquireResult{}
		m, st, _, err := x.lock(req.Key, req.Token, true, true)
		if err != nil {
			return false, err
		}
		mine := st.mineLeft.Valid && st.mineLeft.Int64 > 0
		switch {
		case m.held():
			res.Holder, res.HolderTTL = m.owner, t.x.duration(m.heldLeft.Int64)
			return false, nil
		case m.intentLive() && m.intentToken.String != req.Token:
			res.WriterWaiting = true
			res.Holder, res.HolderTTL = m.intentOwner.String, t.x.duration(m.intentLeft.Int64)
			res.Shared = int(st.sharedLive)
			if mine {
				res.Shared++
			}
			return false, nil
		case mine:
			// A token holds once: its own hold refuses it, as an exclusive
			// holder refuses a request without Reentrant.
			refuseOwn(&res, t.x, req.Owner, st)
			return false, nil
		case req.Limit > 0 && st.sharedLive >= int64(req.Limit):
			res.Holder, res.HolderTTL = st.firstOwner.String, t.x.duration(st.firstLeft.Int64)
			res.Shared = int(st.sharedLive)
			return false, nil
		}
		fence := m.fence + 1
		if err := x.exec(t.insertShared, req.Key, req.Token, req.Owner, fence, req.Limit, ttl); err != nil {
			return false, err
		}
		if err := x.exec(t.raiseShared, req.Key, fence, ttl); err != nil {
			return false, err
		}
		if st.sharedExpired > 0 {
			if err := x.prune(req.Key, req.Token, false, false); err != nil {
				return false, err
			}
		}
		res = driver.AcquireResult{Acquired: true, Fence: uint64(fence), Holds: 1}
		return true, nil
	})
	return res, err
}

// acquireReader makes or refuses a reader's grant (Limit 0) on MySQL and
// SQLite: the upsert of tplReader decides on the row it locks, and the hold
// is added after it. A refusal reads why and is rolled back.
func (t *txs) acquireReader(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	var res driver.AcquireResult
	ttl := t.x.units(req.TTL)
	err := t.run(ctx, func(x *txn) (bool, error) {
		res = driver.AcquireResult{}
		var fence int64
		var err error
		if t.d == MySQL {
			var r sql.Result
			if r, err = x.tx.ExecContext(ctx, t.reader.query, t.reader.args(req.Key, req.Token, ttl)...); err == nil {
				fence, err = r.LastInsertId()
			}
		} else {
			err = x.tx.QueryRowContext(ctx, t.reader.query, t.reader.args(req.Key, req.Token, ttl)...).Scan(&fence)
			if errors.Is(err, sql.ErrNoRows) {
				err = nil
			}
		}
		if err != nil {
			return false, err
		}
		if fence > 0 {
			// The hold, unless the token has a live one (a token holds
			// once): then the transaction, the upsert's fence and
			// shared_until with it, is rolled back.
			var added bool
			if added, err = x.insertReader(req, fence, ttl); err != nil || added {
				res = driver.AcquireResult{Acquired: added, Fence: uint64(fence), Holds: 1}
				return added, err
			}
		}
		m, st, err := x.read(req.Key, req.Token)
		if err != nil {
			return false, err
		}
		switch {
		case m.held():
			res.Holder, res.HolderTTL = m.owner, t.x.duration(m.heldLeft.Int64)
		case m.intentLive() && m.intentToken.String != req.Token:
			res.WriterWaiting = true
			res.Holder, res.HolderTTL = m.intentOwner.String, t.x.duration(m.intentLeft.Int64)
			res.Shared = int(st.sharedLive)
		case st.mineLeft.Valid && st.mineLeft.Int64 > 0:
			refuseOwn(&res, t.x, req.Owner, st)
		}
		return false, nil
	})
	return res, err
}

// insertReader adds the hold of a reader that tplReader granted with
// fence (tplInsertReader), and reports false when the token has a live
// hold already, which it keeps.
func (x *txn) insertReader(req driver.AcquireRequest, fence, ttl int64) (bool, error) {
	s := x.t.insertReader
	r, err := x.tx.ExecContext(x.ctx, s.query, s.args(req.Key, req.Token, req.Owner, fence, ttl)...)
	if err != nil {
		return false, err
	}
	if x.t.d == MySQL {
		id, err := r.LastInsertId()
		return id > 0, err
	}
	n, err := r.RowsAffected()
	return n > 0, err
}

// refuseOwn describes the refusal of a shared request whose token has a
// live shared hold already: that hold (its owner, from the request, and
// its time to live) and the live shared holds, the token's included.
func refuseOwn(res *driver.AcquireResult, x *dialectSQL, owner string, st nameState) {
	res.Holder, res.HolderTTL = owner, x.duration(st.mineLeft.Int64)
	res.Shared = int(st.sharedLive) + 1
}

// acquireFair makes or refuses a Fair exclusive grant in a transaction. A
// re-entry joins the grant whatever the queue holds: it is no new grant.
func (t *txs) acquireFair(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	var res driver.AcquireResult
	ttl := t.x.units(req.TTL)
	err := t.run(ctx, func(x *txn) (bool, error) {
		res = driver.AcquireResult{}
		m, st, _, err := x.lock(req.Key, req.Token, true, true)
		if err != nil {
			return false, err
		}
		if req.Reentrant && m.heldBy(req.Token) {
			if err := x.exec(t.reenter, req.Key, ttl); err != nil {
				return false, err
			}
			res = driver.AcquireResult{Acquired: true, Fence: uint64(m.fence), Holds: m.holds + 1}
			return true, nil
		}
		blocked := st.sharedLive > 0
		if !m.held() && !blocked && st.ahead == 0 {
			fence := m.fence + 1
			if err := x.exec(t.grant, req.Key, fence, req.Owner, ttl, req.Token); err != nil {
				return false, err
			}
			if st.myLeft.Valid {
				if err := x.exec(t.dequeue, req.Key, req.Token); err != nil {
					return false, err
				}
			}
			if st.queueExpired > 0 {
				if err := x.prune(req.Key, req.Token, true, false); err != nil {
					return false, err
				}
			}
			res = driver.AcquireResult{Acquired: true, Fence: uint64(fence), Holds: 1}
			return true, nil
		}

		switch {
		case m.held():
			res.Holder, res.HolderTTL = m.owner, t.x.duration(m.heldLeft.Int64)
		case blocked:
			res.Holder, res.HolderTTL = st.lastOwner.String, t.x.duration(st.lastLeft.Int64)
			res.Shared = int(st.sharedLive)
		}
		if !req.Wait {
			return false, nil // a TryLock yields to the queue and records nothing
		}
		qttl := t.x.units(req.QueueTTL)
		switch {
		case st.myLeft.Valid && st.myLeft.Int64 > 0: // queued: keep the place
			err = x.exec(t.requeue, req.Key, req.Token, st.mySeq.Int64, qttl)
		case st.myLeft.Valid: // lapsed: to the tail
			err = x.exec(t.requeue, req.Key, req.Token, st.maxSeq+1, qttl)
		default:
			err = x.exec(t.enqueue, req.Key, req.Token, st.maxSeq+1, qttl)
		}
		if err != nil {
			return false, err
		}
		// A writer intent is recorded when shared holds keep the lock out
		// and no other token's intent is live; the token's own live intent
		// is kept whatever refused it (another writer too).
		ownIntent := m.intentLive() && m.intentToken.String == req.Token
		if ownIntent || (blocked && !m.intentLive()) {
			if err := x.exec(t.setIntent, req.Key, req.Token, req.Owner, qttl); err != nil {
				return false, err
			}
		}
		if st.queueExpired > 0 {
			if err := x.prune(req.Key, req.Token, true, false); err != nil {
				return false, err
			}
		}
		res.Queued = true
		res.Position = int(st.ahead) + 1
		return true, nil
	})
	return res, err
}

// release drops token's shared hold, queue entry and writer intent, for a
// Release that found no exclusive hold of token. Dropping a shared hold
// recomputes shared_until from the holds left, so that a writer gets in the
// moment the last reader leaves. It notifies (on PostgreSQL) when a shared
// hold or a live intent went, or the head of the queue left a lock without
// an exclusive holder.
//
// With withdraw (Backend.Withdraw), a shared hold of token is left alone:
// only its queue entry and writer intent go.
func (t *txs) release(ctx context.Context, key, token string, withdraw bool) (driver.ReleaseResult, error) {
	var res driver.ReleaseResult
	err := t.run(ctx, func(x *txn) (bool, error) {
		res = driver.ReleaseResult{}
		m, st, found, err := x.lock(key, token, false, true)
		if err != nil || !found {
			return false, err
		}
		hadShared := st.mineLeft.Valid && !withdraw
		ownIntent := m.intentToken.Valid && m.intentToken.String == token
		hadEntry := st.myLeft.Valid
		if !hadShared && !ownIntent && !hadEntry {
			return false, nil
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

		// Which requests hold their lock, exclusively (kind 1) or shared.
		var cond strings.Builder
		args = args[:0]
		for i, n := range names {
			if i > 0 {
				cond.WriteString(" OR ")
			}
			args = append(args, n)
			cond.WriteString("(name = $" + itoa(len(args)) + " AND token IN (")
			for j, k := range byName[n] {
				if j > 0 {
					cond.WriteString(", ")
				}
				args = append(args, reqs[k].Token)
				cond.WriteString("$" + itoa(len(args)))
			}
			cond.WriteString("))")
		}
		// A shared hold is renewed only while no exclusive holder is live:
		// one beside it would be a broken invariant (shared_until behind a
		// hold), and renewing it would keep the reader beside the writer.
		read := t.x.stmt(`SELECT 1, name, token, {left:expires_at} FROM {t} WHERE ` + cond.String() +
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

// forceRelease frees the name of its exclusive holder and every shared
// hold, keeps its queue (but its expired entries) and writer intent, and
// notifies (next "").
func (t *txs) forceRelease(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	var info driver.LockInfo
	var ok bool
	err := t.run(ctx, func(x *txn) (bool, error) {
		info, ok = driver.LockInfo{}, false
		// MySQL reads the queue's state with the row, at no cost; the
		// others delete the expired entries without asking.
		_, st, found, err := x.lock(key, "", false, t.d == MySQL)
		if err != nil || !found {
			return false, err
		}
		infos, err := t.infos(ctx, x.tx, t.inspect, key)
		if err != nil || len(infos) == 0 {
			return false, err
		}
		if err := x.exec(t.free, key); err != nil {
			return false, err
		}
		if err := x.prune(key, "", false, true); err != nil {
			return false, err
		}
		if t.d != MySQL || st.queueExpired > 0 {
			if err := x.prune(key, "", true, false); err != nil {
				return false, err
			}
		}
		x.notify(key, "")
		info, ok = infos[0], true
		return true, nil
	})
	if err != nil {
		return driver.LockInfo{}, false, err
	}
	return info, ok, nil
}

// describe runs the inspection of one name.
func (t *txs) describe(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	infos, err := t.infos(ctx, t.db, t.inspect, key)
	if err != nil || len(infos) == 0 {
		return driver.LockInfo{}, false, err
	}
	return infos[0], true, nil
}

// listInfos describes every held lock whose name starts with prefix.
func (t *txs) listInfos(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	arg := prefix
	if t.d == MySQL {
		arg = strings.NewReplacer("!", "!!", "%", "!%", "_", "!_").Replace(prefix) + "%"
	}
	return t.infos(ctx, t.db, t.list, arg)
}

// infos runs an inspection statement (tplInspect, tplList) and gathers its
// rows, one per live shared hold, into one description per held name.
func (t *txs) infos(ctx context.Context, q querier, s stmt, arg string) ([]driver.LockInfo, error) {
	rows, err := q.QueryContext(ctx, s.query, s.args(arg)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var infos []driver.LockInfo
	var exclusive []bool // whether infos[i] has an exclusive holder
	var cur *driver.LockInfo
	for rows.Next() {
		var (
			info           driver.LockInfo
			fence          int64
			ttl, heldFor   int64
			held, writer   bool
			queued         int64
			sOwner         sql.NullString
			sFence, sLeft  sql.NullInt64
			sLimit         sql.NullInt64
			exclusiveOwner string
		)
		if err := rows.Scan(&info.Key, &exclusiveOwner, &fence, &info.Holds, &ttl, &heldFor,
			&held, &writer, &queued, &sOwner, &sFence, &sLeft, &sLimit); err != nil {
			return nil, err
		}
		if cur == nil || cur.Key != info.Key {
			if held {
				info.Owner = exclusiveOwner
				info.Fence = uint64(max(fence, 0))
				info.TTL = t.x.duration(ttl)
				info.HeldFor = t.x.duration(heldFor)
			} else {
				info.Holds = 0
			}
			info.Queued = int(queued)
			info.WriterWaiting = writer
			infos = append(infos, info)
			exclusive = append(exclusive, held)
			cur = &infos[len(infos)-1]
		}
		if sFence.Valid {
			cur.Shared = append(cur.Shared, driver.SharedHold{
				Owner: sOwner.String,
				Fence: uint64(max(sFence.Int64, 0)),
				TTL:   t.x.duration(sLeft.Int64),
			})
			cur.Limit = int(sLimit.Int64) // rows come oldest grant first
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	// Inspect reads the name's row whether or not it is held.
	held := infos[:0]
	for i, info := range infos {
		if exclusive[i] || len(info.Shared) > 0 {
			held = append(held, info)
		}
	}
	return held, nil
}

// refused completes an exclusive request that the upsert refused (on
// PostgreSQL, one that met no exclusive holder, or one with Wait whose
// token has a live intent): it reads who keeps it out (tplHolder) and, when
// the request will wait, records its writer intent if shared holds keep it
// out, or refreshes the token's own live intent whatever keeps it out.
// found is false when the row is missing; blocked is false when the name
// was free when the holder was read (it changed in between).
func (t *txs) refused(ctx context.Context, req driver.AcquireRequest) (res driver.AcquireResult, found, blocked bool, err error) {
	var held, ownIntent bool
	var ttl, shared int64
	var owner string
	var sOwner sql.NullString
	var sLeft sql.NullInt64
	err = t.db.QueryRowContext(ctx, t.holder.query, t.holder.args(req.Key, req.Token)...).Scan(&owner, &held, &ttl, &ownIntent, &shared, &sOwner, &sLeft)
	if errors.Is(err, sql.ErrNoRows) {
		return res, false, false, nil
	}
	if err != nil {
		return res, false, false, err
	}
	switch {
	case held:
		res.Holder, res.HolderTTL = owner, t.x.duration(ttl)
		if ownIntent { // a waiting writer keeps its intent behind another writer
			res.Queued, err = t.recordIntent(ctx, req)
		}
	case shared > 0:
		res.Holder, res.HolderTTL, res.Shared = sOwner.String, t.x.duration(sLeft.Int64), int(shared)
		res.Queued, err = t.recordIntent(ctx, req)
	}
	return res, true, held || shared > 0, err
}

// recordIntent records or refreshes req's writer intent (tplIntent) when it
// will wait, and reports whether the token's intent is live.
func (t *txs) recordIntent(ctx context.Context, req driver.AcquireRequest) (bool, error) {
	if !req.Wait {
		return false, nil
	}
	r, err := t.db.ExecContext(ctx, t.intent.query, t.intent.args(req.Key, req.Token, req.Owner, t.x.units(req.QueueTTL))...)
	if err != nil {
		return false, err
	}
	if t.d == MySQL {
		id, err := r.LastInsertId()
		return id > 0, err
	}
	n, err := r.RowsAffected()
	return n == 1, err
}

// classify reports which of reqs are live exclusive holds and which live
// shared holds, in one statement outside a transaction, for the batch
// renewals of SQLite and MySQL, which cannot say which leases their
// statement renewed or did not find: a lease that holds its lock
// exclusively now held it when that statement ran and was renewed; a shared
// one is for the transaction of renew; the others are not held.
func (t *txs) classify(ctx context.Context, reqs []driver.RenewRequest) (exclusive, shared []bool, err error) {
	var cond strings.Builder
	args := make([]any, 0, 2*len(reqs))
	for i, r := range reqs {
		if i > 0 {
			cond.WriteString(" OR ")
		}
		args = append(args, r.Key, r.Token)
		cond.WriteString("(name = $" + itoa(len(args)-1) + " AND token = $" + itoa(len(args)) + ")")
	}
	s := t.x.stmt(`SELECT 1, name, token FROM {t} WHERE (` + cond.String() + `) AND expires_at > {now}
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
