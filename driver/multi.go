// Taking the locks of several keys in one atomic step: the MultiAcquirer
// interface.

package driver

import "context"

// MultiAcquirer is implemented by backends that can grant the locks of
// several keys in one atomic step of the store (one script, one
// transaction), so that a caller holds all of them or none at every
// instant (dlock's Client.MultiAtOnce). The client finds it by type
// assertion; a wrapper whose inner backend has none returns an error
// wrapping ErrUnsupported.
type MultiAcquirer interface {
	// AcquireAll grants every lock of reqs, in one atomic step, when each
	// would grant its request as Acquire would, and otherwise grants none.
	// The requests have distinct keys, one Token (drawn for this one call),
	// Mode Exclusive, and neither Reentrant, LockDelay, Fair, Wait,
	// Handoff nor Claim. Each grant draws its key's fence as Acquire does.
	//
	// The result has one entry per request, in order: all Acquired with
	// their fences, or none Acquired, and then at least one entry, the
	// first refused in the store's order, carries Holder and HolderTTL as
	// Acquire's refusal would. An error leaves the outcome unknown; the
	// client then releases every key with Token, and the backend makes a
	// copy of the request that lands after those releases grant nothing,
	// by the rules its Acquire follows for late requests. Keys the store
	// cannot take in one step (Redis Cluster keys of several hash slots)
	// are refused with an error wrapping ErrInvalid that says how to fix
	// the names.
	AcquireAll(ctx context.Context, reqs []AcquireRequest) ([]AcquireResult, error)
}
