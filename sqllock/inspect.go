// Inspection: Inspect, List and ForceRelease.

package sqllock

import (
	"context"

	"github.com/dlock-go/dlock/driver"
)

// Inspect describes the lock named key in one statement: its exclusive
// holder (owner, the fence and hold count of the grant, its remaining TTL
// and how long it has been held, both by the database's clock), its live
// shared holds, oldest grant first, with the Limit of the newest, the
// number of live entries in its fair queue, and whether a writer's intent
// is live. ok is false, with a nil error, when it has neither a live
// exclusive holder nor a live shared hold.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	if err := b.checkName(ctx, key); err != nil {
		return driver.LockInfo{}, false, b.opError(ctx, err)
	}
	info, ok, err := retryInfo(ctx, b.dialect, func() (driver.LockInfo, bool, error) { return b.tx.describe(ctx, key) })
	if err != nil {
		return driver.LockInfo{}, false, b.opError(ctx, err)
	}
	return info, ok, nil
}

// List describes, as Inspect does, every held lock whose key starts with
// prefix (all of them for ""), those with only shared holds included,
// sorted by key, in one statement.
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	if err := b.ready(ctx); err != nil {
		return nil, b.opError(ctx, err)
	}
	infos, err := retryBusy(ctx, b.dialect, func() ([]driver.LockInfo, error) { return b.tx.listInfos(ctx, prefix) })
	if err != nil {
		return nil, b.opError(ctx, err)
	}
	return infos, nil
}

// ForceRelease frees the lock named key of its exclusive holder and of
// every shared hold, whoever holds them, and returns what it removed; ok is
// false, with a nil error, when it was not held. The row and its fence stay,
// so the next grant still draws a larger fence, and the holders find out at
// their next renewal; the fair queue and a writer's intent stay too. It runs
// in a transaction that locks the row, and on PostgreSQL notifies waiters.
func (b *Backend) ForceRelease(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	if err := b.checkName(ctx, key); err != nil {
		return driver.LockInfo{}, false, b.opError(ctx, err)
	}
	info, ok, err := retryInfo(ctx, b.dialect, func() (driver.LockInfo, bool, error) { return b.tx.forceRelease(ctx, key) })
	if err != nil {
		return driver.LockInfo{}, false, b.opError(ctx, err)
	}
	return info, ok, nil
}

// BreakIf frees the lock named key of its exclusive holder when the fence
// of its grant is fence (driver.Breaker), in a transaction that locks the
// row, and on PostgreSQL notifies waiters. Shared holds, the fair queue and
// a writer's intent stay.
func (b *Backend) BreakIf(ctx context.Context, key string, fence uint64) (bool, error) {
	if err := b.checkName(ctx, key); err != nil {
		return false, b.opError(ctx, err)
	}
	broken, err := retryGated(ctx, b, true, func() (bool, error) { return b.tx.breakIf(ctx, key, fence) })
	if err != nil {
		return false, b.opError(ctx, err)
	}
	return broken, nil
}

// retryInfo is retryBusy for an operation that returns a lock description
// and whether there was one.
func retryInfo(ctx context.Context, d Dialect, op func() (driver.LockInfo, bool, error)) (driver.LockInfo, bool, error) {
	type found struct {
		info driver.LockInfo
		ok   bool
	}
	f, err := retryBusy(ctx, d, func() (found, error) {
		info, ok, err := op()
		return found{info, ok}, err
	})
	return f.info, f.ok, err
}

func (b *Backend) checkName(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	return b.ready(ctx)
}
