// Passing a waiting writer's intent to its next token (driver.IntentMover).

package sqllock

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock-go/dlock/driver"
)

var _ driver.IntentMover = (*Backend)(nil)

// MoveIntent implements driver.IntentMover in one statement on the name's
// row (tplMoveIntent). It wakes nobody: nothing that kept others out went.
func (b *Backend) MoveIntent(ctx context.Context, key, from, to, owner string, ttl time.Duration) (bool, error) {
	err := b.check(ctx, key, from)
	if err == nil {
		err = b.check(ctx, key, to)
	}
	if err == nil && len(owner) > MaxOwnerLength {
		err = fmt.Errorf("%w: owner is %d bytes, over %d", driver.ErrInvalid, len(owner), MaxOwnerLength)
	}
	if err == nil && ttl <= 0 {
		err = fmt.Errorf("%w: intent TTL %v, want > 0", driver.ErrInvalid, ttl)
	}
	if err != nil {
		return false, b.opError(ctx, err)
	}
	s := b.tx.moveIntent
	moved, err := retryGated(ctx, b, false, func() (bool, error) {
		r, err := b.db.ExecContext(ctx, s.query, s.args(key, from, to, owner, b.tx.x.units(ttl))...)
		return matchedRow(b.dialect, r, err)
	})
	if err != nil {
		return false, b.opError(ctx, err)
	}
	return moved, nil
}
