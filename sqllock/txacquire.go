// Multi-statement transactions that acquire shared, reader and fair holds,
// and the reads that complete an exclusive request the upsert refused.

package sqllock

import (
	"context"
	"database/sql"
	"errors"
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
		m, st, err := x.lockShared(req.Key, req.Token)
		if err != nil {
			return false, err
		}
		mine := st.mineLeft.Valid && st.mineLeft.Int64 > 0
		switch {
		case st.gone.Int64 > 0:
			return false, nil // cleaned up: a late request (see goneTTL)
		case m.held():
			res.Holder, res.HolderTTL = m.owner, t.x.duration(m.heldLeft.Int64)
			return false, nil
		case m.conflicts(req.Limit, st.sharedLive):
			refuseConflict(&res, t.x, m, st)
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
		if err := x.exec(t.raiseShared, req.Key, fence, ttl, req.Limit); err != nil {
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
		m, st, err := x.readShared(req.Key, req.Token)
		if err != nil {
			return false, err
		}
		switch {
		case m.held():
			res.Holder, res.HolderTTL = m.owner, t.x.duration(m.heldLeft.Int64)
		case m.conflicts(0, st.sharedLive):
			refuseConflict(&res, t.x, m, st)
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
	return matchedRow(x.t.d, r, err)
}

// refuseConflict describes the refusal of a shared request whose Limit is
// not the one of the name's live shared holds: their Limit, their number
// and the one that expires last.
func refuseConflict(res *driver.AcquireResult, x *dialectSQL, m mainRow, st nameState) {
	res.Conflict, res.HeldLimit = true, int(m.sharedLim.Int64)
	res.Holder, res.HolderTTL = st.lastOwner.String, x.duration(st.lastLeft.Int64)
	res.Shared = int(st.sharedLive)
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
		m, st, err := x.lockFair(req.Key, req.Token)
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
		if st.gone.Int64 > 0 {
			return false, nil // cleaned up: a late request (see goneTTL)
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
		if !req.Wait || st.gone.Valid {
			// A TryLock yields to the queue and records nothing; a
			// request of a token withdrawn or released meanwhile (see
			// goneTTL) neither.
			return false, nil
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

// fairFirst answers a Fair request with Wait from one read of the name
// (tplFairPeek, outside a transaction) when that read shows what the
// transaction would answer and that it would change nothing that cannot
// wait: the lock is held by another token, or free with live entries ahead
// of the token's; no shared hold and no writer intent of the token are in
// play; and the token's entry has more than half of QueueTTL left, so its
// refresh is left to a later request (the client tries again every third
// of QueueTTL). A polling waiter then costs one short read that takes no
// row lock, where the transaction would lock the row that the holder's
// release needs, for several round trips. The read writes nothing, so one
// that lands late, or that a release overtakes, is harmless: it answers
// what a poll a moment earlier would have. decided is false when the
// transaction must run; free says, then, that the read found the lock free
// with no live entry ahead of the token's fresh one and nothing else in
// play, so that the request may take it as the queue's head (takeHead).
func (t *txs) fairFirst(ctx context.Context, req driver.AcquireRequest) (res driver.AcquireResult, decided, free bool, err error) {
	var holder, intent sql.NullString
	var owner string
	var heldLeft, sharedLeft, intentLeft, myLeft sql.NullInt64
	var ahead int64
	err = t.db.QueryRowContext(ctx, t.peek.query, t.peek.args(req.Key, req.Token)...).Scan(
		&holder, &owner, &heldLeft, &sharedLeft, &intent, &intentLeft, &myLeft, &ahead)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return res, false, false, nil
	case err != nil:
		return res, false, false, err
	}
	held := holder.Valid && heldLeft.Int64 > 0
	switch {
	case sharedLeft.Int64 > 0: // shared holds may be live
		return res, false, false, nil
	case intent.Valid && intent.String == req.Token && intentLeft.Int64 > 0:
		return res, false, false, nil
	case !myLeft.Valid || myLeft.Int64 <= t.x.units(req.QueueTTL)/2:
		return res, false, false, nil
	case req.Reentrant && held && holder.String == req.Token:
		return res, false, false, nil
	case !held && ahead == 0:
		return res, false, true, nil // may be the token's
	}
	if held {
		res.Holder, res.HolderTTL = owner, t.x.duration(heldLeft.Int64)
	}
	res.Queued = true
	res.Position = int(ahead) + 1
	return res, true, false, nil
}

// takeHead grants a Fair exclusive request the lock in two statements, on
// MySQL, where the queue's head polls (fairFirst found the lock free and no
// live entry ahead of the token's): tplTakeHead, one UPDATE that grants
// only where acquireFair's transaction would (the lock not held, no shared
// hold possibly live, no live entry of another token ahead of the token's,
// and no clean-up record of the token) and when no expired entry waits to
// be deleted, and then the deletion of the token's entry. ok is false when
// the UPDATE matched nothing (the lock was taken meanwhile, or the state is
// one that the transaction decides or tidies), and the caller runs that
// transaction.
//
// The transaction takes six statements, among them MariaDB's slowest
// read, while the name's row is locked and the released lock waits for
// its head; this takes two. The UPDATE's subqueries are correlated to the
// row it locks (tplTakeHead), so that they run, with locks, after the
// row's lock: they see what committed before it, as the transaction's read
// does, and lock no gap before it that a transaction holding the row
// would insert into. A request that lands after the token's clean-up is refused
// by the clean-up's record. Between the two statements the holder's entry
// is still queued, ahead of everyone, which changes nothing while it
// holds. Should the deletion fail or go unanswered, or the UPDATE's answer
// be lost, the error makes the caller clean up, and on MySQL a clean-up
// Release (no fence) that finds the hold of a token that the Backend
// answered with a queue place, and with no grant since, deletes its entry
// too (Backend.release), so that no entry outlives its grant to hold the
// queue up. A client that dies between the two leaves an entry that
// expires with its last refresh, no later than the grant where QueueTTL is
// at most the TTL (the dlock client's default).
//
// With first (a request of a token that this Backend has not queued) it
// is tplTakeFirst: one UPDATE, which matches only when the token has no
// entry, so that there is none to delete.
//
// On PostgreSQL only the first request's UPDATE is sent, and it returns the
// fence. Its subqueries read the statement's snapshot, taken before it
// waited for the row, if it did: it matches only when the row it locked
// is the version that snapshot read ({fresh}), so that no transaction that
// held the row (a request queueing, shared holds coming) committed in
// between unseen; else the transaction decides. A clean-up record written
// before the clean-up locks the row may still be missed: the clean-up's
// transaction then finds the grant under the row's lock and drops it, as
// it does for the plain acquire (see goneTTL).
func (t *txs) takeHead(ctx context.Context, req driver.AcquireRequest, first bool) (res driver.AcquireResult, ok bool, err error) {
	st := t.takeHeadSQL
	if first {
		st = t.takeFirstSQL
	}
	args := st.args(req.Key, req.Token, req.Owner, t.x.units(req.TTL), int64(maxSeq))
	var fence int64
	if t.d == PostgreSQL {
		switch err := t.db.QueryRowContext(ctx, st.query, args...).Scan(&fence); {
		case errors.Is(err, sql.ErrNoRows):
			return res, false, nil
		case err != nil:
			return res, false, err
		}
	} else {
		r, err := t.db.ExecContext(ctx, st.query, args...)
		if err != nil {
			return res, false, err
		}
		if fence, err = r.LastInsertId(); err != nil || fence == 0 {
			return res, false, err
		}
	}
	if !first {
		if err := t.dropEntry(ctx, req.Key, req.Token); err != nil {
			return res, false, err
		}
	}
	return driver.AcquireResult{Acquired: true, Fence: uint64(fence), Holds: 1}, true, nil
}

// dropEntry deletes token's queue entry on key, if any, in one statement:
// the head's take's second (takeHead), and, on MySQL, a clean-up's that
// found the token's hold (see takeHead).
func (t *txs) dropEntry(ctx context.Context, key, token string) error {
	_, err := t.db.ExecContext(ctx, t.dequeue.query, t.dequeue.args(key, token)...)
	return err
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
	var sOwner, claimer sql.NullString
	var sLeft, claimLeft sql.NullInt64
	err = t.db.QueryRowContext(ctx, t.holder.query, t.holder.args(req.Key, req.Token)...).Scan(&owner, &held, &ttl, &ownIntent, &shared, &sOwner, &sLeft, &claimer, &claimLeft)
	if errors.Is(err, sql.ErrNoRows) {
		return res, false, false, nil
	}
	if err != nil {
		return res, false, false, err
	}
	switch {
	case held:
		res.Holder, res.HolderTTL = owner, t.x.duration(ttl)
		switch {
		case req.Claim && req.Wait && claimLeft.Int64 > t.x.units(claimTTL(req))/2:
			// The token's claim has more than half its time left: it is
			// refreshed on a later request, which spares a statement on
			// each of a claimer's polls.
			res.Queued = true
		case req.Claim && !claimer.Valid:
			res.Queued, err = t.recordClaim(ctx, req)
		case ownIntent: // a waiting writer keeps its intent behind another writer
			res.Queued, err = t.recordIntent(ctx, req)
		}
	case shared > 0:
		res.Holder, res.HolderTTL, res.Shared = sOwner.String, t.x.duration(sLeft.Int64), int(shared)
		res.Queued, err = t.recordIntent(ctx, req)
	case claimer.Valid:
		// Free, but another token's live claim keeps it for
		// that token.
		res.Holder, res.WriterWaiting = claimer.String, true
	}
	return res, true, held || shared > 0 || claimer.Valid, err
}

// claimFirst answers a claiming request (a starving plain waiter's, see
// driver.AcquireRequest.Claim) on MySQL and SQLite by reading the row
// first (tplHolder) and writing only when that may change something: a
// lock held, or kept by another token's claim, is refused without the
// upsert, and the claim is written only when it is missing or has less
// than half its time left. A claimer and the waiters behind it poll; on
// SQLite a read does not take the file's write lock, which the holder's
// release and the claimer's grant need. decided is false when the upsert
// must run: the lock may be free for req.Token, or the row is missing or
// has shared holds.
func (t *txs) claimFirst(ctx context.Context, req driver.AcquireRequest) (res driver.AcquireResult, decided bool, err error) {
	var held, ownIntent bool
	var ttl, shared int64
	var owner string
	var sOwner, claimer sql.NullString
	var sLeft, claimLeft sql.NullInt64
	err = t.db.QueryRowContext(ctx, t.holder.query, t.holder.args(req.Key, req.Token)...).Scan(&owner, &held, &ttl, &ownIntent, &shared, &sOwner, &sLeft, &claimer, &claimLeft)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return res, false, nil
	case err != nil:
		return res, false, err
	case shared > 0:
		return res, false, nil
	case held:
		res.Holder, res.HolderTTL = owner, t.x.duration(ttl)
		switch {
		case claimer.Valid && ownIntent:
			// Another's claim goes next; the token's writer intent is
			// kept all the same, for the readers behind it.
			res.Queued, err = t.recordIntent(ctx, req)
		case claimer.Valid: // another's claim: it goes next
		case claimLeft.Int64 > t.x.units(claimTTL(req))/2:
			res.Queued = true
		default:
			res.Queued, err = t.recordClaim(ctx, req)
		}
		return res, true, err
	case claimer.Valid:
		res.Holder, res.WriterWaiting = claimer.String, true
		return res, true, nil
	}
	return res, false, nil
}

// recordClaim records or refreshes req's claim on the next grant
// (tplClaim) when it will wait, with the token's own live writer intent,
// and reports whether the token's claim is live.
func (t *txs) recordClaim(ctx context.Context, req driver.AcquireRequest) (bool, error) {
	if !req.Wait {
		return false, nil
	}
	r, err := t.db.ExecContext(ctx, t.claim.query, t.claim.args(req.Key, req.Token, req.Owner, t.x.units(claimTTL(req)), t.x.units(req.QueueTTL))...)
	return matchedRow(t.d, r, err)
}

// recordIntent records or refreshes req's writer intent (tplIntent) when it
// will wait, and reports whether the token's intent is live.
func (t *txs) recordIntent(ctx context.Context, req driver.AcquireRequest) (bool, error) {
	if !req.Wait {
		return false, nil
	}
	r, err := t.db.ExecContext(ctx, t.intent.query, t.intent.args(req.Key, req.Token, req.Owner, t.x.units(req.QueueTTL))...)
	return matchedRow(t.d, r, err)
}

// claimTTL is the time to live of req's claim (driver.AcquireRequest.ClaimTTL).
func claimTTL(req driver.AcquireRequest) time.Duration {
	if req.ClaimTTL > 0 {
		return req.ClaimTTL
	}
	return req.QueueTTL
}

// matchedRow reports whether the one-row statement that gave r (and err)
// wrote its row: on MySQL by LAST_INSERT_ID, which the statement sets when
// it matched ({matched}, or a fence assigned with LAST_INSERT_ID), since
// MySQL counts an UPDATE that changes nothing as no row; elsewhere by the
// rows affected.
func matchedRow(d Dialect, r sql.Result, err error) (bool, error) {
	if err != nil {
		return false, err
	}
	if d == MySQL {
		id, err := r.LastInsertId()
		return id > 0, err
	}
	n, err := r.RowsAffected()
	return n > 0, err
}
