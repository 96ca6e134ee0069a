package sqllock

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/dlock-go/dlock/driver"
)

var _ driver.Proclaimer = (*Backend)(nil)

// The proclaim statements (see dialectSQL). proclaimed is the grant's
// fence and the proclaim's sequence number, 20 digits each: it compares
// greater as text for a later proclaim of the grant and for any proclaim
// of a later grant, under every collation.
const (
	tplProclaim = `UPDATE {t} SET owner = $1, proclaimed = $2
WHERE name = $3 AND token = $4 AND fence = $5 AND expires_at > {now}
  AND (proclaimed IS NULL OR proclaimed < $2)`

	tplProclaimHeld = `SELECT fence FROM {t}
WHERE name = $1 AND token = $2 AND expires_at > {now}`
)

// Proclaim implements driver.Proclaimer with one UPDATE of the lock's row
// that compares token, fence, expiry and the last applied proclaim; when it
// changes nothing, a SELECT tells a grant that holds (a later proclaim was
// applied) from one that does not.
func (b *Backend) Proclaim(ctx context.Context, req driver.ProclaimRequest) (bool, error) {
	err := b.check(ctx, req.Key, req.Token)
	if err == nil && len(req.Owner) > MaxOwnerLength {
		err = fmt.Errorf("%w: owner is %d bytes, over %d", driver.ErrInvalid, len(req.Owner), MaxOwnerLength)
	}
	if err != nil {
		return false, b.opError(ctx, err)
	}
	update, held := b.tx.x.stmt(tplProclaim), b.tx.x.stmt(tplProclaimHeld)
	ok, err := retryGated(ctx, b, true, func() (bool, error) {
		fence := req.Fence
		if fence == 0 { // the token's grant, whatever its fence
			f, found, err := b.heldFence(ctx, held, req)
			if err != nil || !found {
				return false, err
			}
			fence = f
		}
		mark := fmt.Sprintf("%020d%020d", fence, req.Seq)
		res, err := b.db.ExecContext(ctx, update.query, update.args(req.Owner, mark, req.Key, req.Token, fenceParam(fence))...)
		if err != nil {
			return false, err
		}
		if n, err := res.RowsAffected(); err != nil || n > 0 {
			return err == nil, err
		}
		f, found, err := b.heldFence(ctx, held, req)
		return found && f == fence, err
	})
	if err != nil {
		return false, b.opError(ctx, err)
	}
	return ok, nil
}

// heldFence returns the fence of req.Token's live exclusive grant, if any.
func (b *Backend) heldFence(ctx context.Context, held stmt, req driver.ProclaimRequest) (uint64, bool, error) {
	var f int64
	err := b.db.QueryRowContext(ctx, held.query, held.args(req.Key, req.Token)...).Scan(&f)
	if err == sql.ErrNoRows {
		return 0, false, nil
	}
	return uint64(f), err == nil, err
}
