// Describing held locks: the Inspector interface and what it returns.

package driver

import (
	"context"
	"time"
)

// SharedHold describes one live shared hold in a LockInfo.
type SharedHold struct {
	Owner string
	Fence uint64
	TTL   time.Duration // remaining store-side time to live
}

// Inspector is implemented by backends that can describe the locks they hold.
type Inspector interface {
	// Inspect describes the lock named key; ok is false when it has neither
	// an exclusive holder nor a live shared hold.
	Inspect(ctx context.Context, key string) (info LockInfo, ok bool, err error)
	// List describes every held lock whose key starts with prefix: those
	// with an exclusive holder or live shared holds, in key order.
	List(ctx context.Context, prefix string) ([]LockInfo, error)
	// ForceRelease deletes the lock named key whoever holds it (the
	// exclusive holder and every shared hold; queue entries stay), notifies
	// waiters with next "", and returns what it removed; ok is false when it
	// was not held.
	ForceRelease(ctx context.Context, key string) (info LockInfo, ok bool, err error)
}

// LockInfo describes a held lock, for listing and inspection.
type LockInfo struct {
	Key   string
	Owner string
	Fence uint64
	Holds int
	TTL   time.Duration // remaining store-side time to live
	// HeldFor is how long the current grant has been held, by the store's
	// clock, or 0 when the store does not know.
	HeldFor time.Duration
	// Delayed reports that the holder's lease expired without a release and
	// the lock is kept out of reach for its lock-delay; TTL is then the time
	// left until it is free.
	Delayed bool

	// The fields above describe the exclusive holder; Owner is "" (and
	// Fence, Holds, TTL, HeldFor are 0) when the lock has only shared holds.

	// Shared lists the live shared holds (readers, semaphore permits),
	// oldest grant first.
	Shared []SharedHold
	// Limit is the Limit of the newest shared grant (a semaphore's permits),
	// or 0 for readers or when unknown.
	Limit int
	// Queued is the number of live entries in the lock's fair queue.
	Queued int
	// WriterWaiting reports a live writer intent.
	WriterWaiting bool
}
