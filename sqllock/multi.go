// AcquireAll: the exclusive locks of several keys in one transaction
// (driver.MultiAcquirer).

package sqllock

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/dlock-go/dlock/driver"
)

var _ driver.MultiAcquirer = (*Backend)(nil)

// AcquireAll grants every lock of reqs to their token in one transaction,
// or none (driver.MultiAcquirer). The transaction locks the names' rows in
// key order, making the missing ones, so that two callers over crossing
// names wait for each other instead of deadlocking; then it reads them and
// grants each, under the rules of Acquire's plain exclusive request, a
// fence one more than its row's last. The first name refused, in key
// order, carries the holder's owner and time to live.
//
// A transaction the database still chose as a deadlock's victim, after a
// few runs, is answered as a refusal: it was rolled back whole. A token
// whose clean-up (a Release that found nothing) is recorded is refused, as
// for Acquire (see goneTTL). On a SQLiteBackend the transaction, which
// holds the file's write lock for several statements, goes through the
// write gate, as fair requests do.
func (b *Backend) AcquireAll(ctx context.Context, reqs []driver.AcquireRequest) ([]driver.AcquireResult, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	err := checkAll(reqs)
	for _, r := range reqs {
		if err == nil {
			err = b.check(ctx, r.Key, r.Token)
		}
	}
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return nil, b.opError(ctx, err)
	}
	out, err := retryGated(ctx, b, false, func() ([]driver.AcquireResult, error) {
		return inFlight(ctx, func(sctx context.Context) ([]driver.AcquireResult, error) {
			return b.tx.acquireAll(sctx, reqs)
		})
	})
	if err != nil && deadlocked(err) && ctx.Err() == nil {
		return make([]driver.AcquireResult, len(reqs)), nil // rolled back: nothing granted
	}
	if err != nil {
		return nil, b.opError(ctx, err)
	}
	return out, nil
}

// checkAll refuses requests that AcquireAll does not take: they must be
// plain exclusive requests of one token, on distinct keys.
func checkAll(reqs []driver.AcquireRequest) error {
	seen := make(map[string]bool, len(reqs))
	for _, r := range reqs {
		switch {
		case r.Mode != driver.Exclusive || r.Reentrant || r.Fair || r.Wait || r.Handoff || r.Claim || r.LockDelay > 0 || r.Token != reqs[0].Token:
			return fmt.Errorf("%w: AcquireAll takes plain exclusive requests of one token", driver.ErrInvalid)
		case seen[r.Key]:
			return fmt.Errorf("%w: AcquireAll given key %q twice", driver.ErrInvalid, r.Key)
		case len(r.Owner) > MaxOwnerLength:
			return fmt.Errorf("%w: owner is %d bytes, over %d", driver.ErrInvalid, len(r.Owner), MaxOwnerLength)
		}
		seen[r.Key] = true
	}
	return nil
}

// acquireAll is AcquireAll's transaction. It locks every row first, in key
// order, and reads them after: on MySQL the first read takes the
// transaction's snapshot, which then sees every change committed under
// those locks (a gone record too, see goneTTL); elsewhere each read sees
// what was committed when it began.
func (t *txs) acquireAll(ctx context.Context, reqs []driver.AcquireRequest) ([]driver.AcquireResult, error) {
	order := make([]int, len(reqs)) // request indexes, in key order
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(reqs[a].Key, reqs[b].Key) })
	token := reqs[0].Token
	out := make([]driver.AcquireResult, len(reqs))
	err := t.run(ctx, func(x *txn) (bool, error) {
		clear(out)
		rows := make([]mainRow, len(order))
		for j, i := range order {
			m, err := x.lockRow(reqs[i].Key)
			if err != nil {
				return false, err
			}
			rows[j] = m
		}
		for j, i := range order {
			m, st, err := x.readLocked(reqs[i].Key, token, rows[j])
			if err != nil {
				return false, err
			}
			if res, refused := refuseAll(t.x, token, m, st); refused {
				out[i] = res
				return false, nil
			}
			rows[j] = m
		}
		for j, i := range order {
			r := reqs[i]
			fence := rows[j].fence + 1
			if err := x.exec(t.grant, r.Key, fence, r.Owner, t.x.units(r.TTL), r.Token); err != nil {
				return false, err
			}
			out[i] = driver.AcquireResult{Acquired: true, Fence: uint64(fence), Holds: 1}
		}
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// readLocked reads the state of a name whose row lockRow locked, for
// token: on MySQL with the row, elsewhere beside the row m that lockRow
// returned (on SQLite only when shared holds refuse the request).
func (x *txn) readLocked(key, token string, m mainRow) (mainRow, nameState, error) {
	t := x.t
	if t.d == MySQL {
		return x.read(key, token)
	}
	var st nameState
	if t.d == SQLite && m.sharedLeft.Int64 <= 0 {
		// No gone records (see goneTTL), and no shared holds to name.
		return m, st, nil
	}
	err := x.tx.QueryRowContext(x.ctx, t.state.query, t.state.args(key, token, int64(maxSeq))...).Scan(st.dest()...)
	return m, st, err
}

// refuseAll reports whether a plain exclusive request of token is refused
// by the name's row m and state st, and what Acquire would answer: a live
// exclusive holder, live shared holds, another token's live claim, or the
// token's live clean-up record (a late request: no holder to name).
func refuseAll(x *dialectSQL, token string, m mainRow, st nameState) (res driver.AcquireResult, refused bool) {
	switch {
	case st.gone.Int64 > 0:
	case m.held():
		res.Holder, res.HolderTTL = m.owner, x.duration(m.heldLeft.Int64)
	case m.sharedLeft.Int64 > 0:
		res.Holder, res.HolderTTL = st.lastOwner.String, x.duration(st.lastLeft.Int64)
		res.Shared = int(st.sharedLive)
	case m.claimToken.Valid && m.claimToken.String != token && m.claimLeft.Int64 > 0:
		res.Holder, res.WriterWaiting = m.claimOwner.String, true
	default:
		return res, false
	}
	return res, true
}
