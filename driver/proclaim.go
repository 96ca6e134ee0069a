// Changing the owner description of a held grant in place: the Proclaimer
// interface and its request.

package driver

import "context"

// ProclaimRequest is the input of Proclaimer.Proclaim.
type ProclaimRequest struct {
	Key   string // the lock's key, prefix included
	Token string // the owner token that must hold the lock
	// Fence is the fence of the grant whose owner description changes, or
	// 0 for Token's exclusive grant whatever its fence.
	Fence uint64
	Owner string // the new owner description
	// Seq numbers the proclaims of one grant, from 1 up. The store keeps
	// the Seq of the last proclaim it applied to the grant (0 before any)
	// and applies only a greater one, so that a proclaim that lands late
	// (a resend, a request whose answer was lost) never undoes a later one.
	Seq uint64
}

// Proclaimer is implemented by backends that can change the owner
// description of a held exclusive grant without a new grant: the new value
// of an election's leader (dlock's Leadership.Proclaim).
type Proclaimer interface {
	// Proclaim sets the owner description of req.Token's exclusive grant
	// on req.Key to req.Owner, when that grant's fence is req.Fence (when
	// set), its lease has not expired and req.Seq is above the grant's
	// last applied Seq; nothing else changes (fence, TTL, holds), and
	// nobody is woken.
	// held reports that the grant holds the lock, whether or not this Seq
	// was applied; false, with a nil error, when it does not.
	Proclaim(ctx context.Context, req ProclaimRequest) (held bool, err error)
}
