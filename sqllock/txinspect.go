// The force-release transaction and the inspection reads (one name, or every
// name with a prefix).

package sqllock

import (
	"context"
	"database/sql"
	"strings"

	"github.com/dlock-go/dlock/driver"
)

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

// breakIf frees the name of its exclusive holder, live or expired, when the
// fence of its grant is fence, and notifies (next ""). The row's fence is
// the holder's while the token is set: every later grant, shared ones too,
// would have needed the hold gone or expired and raised the fence.
func (t *txs) breakIf(ctx context.Context, key string, fence uint64) (bool, error) {
	var broken bool
	err := t.run(ctx, func(x *txn) (bool, error) {
		broken = false
		m, _, found, err := x.lock(key, "", false, false)
		if err != nil || !found || !m.token.Valid || m.fence < 0 || uint64(m.fence) != fence {
			return false, err
		}
		if err := x.exec(t.dropHolder, key); err != nil {
			return false, err
		}
		x.notify(key, "")
		broken = true
		return true, nil
	})
	return broken, err
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
