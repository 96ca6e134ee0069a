package dlock

import (
	"errors"
	"fmt"
	"time"
)

var (
	// ErrNotObtained is returned by TryLock when another owner holds the lock,
	// and by Lock when the wait ends (context done, WithWait elapsed) before the
	// lock was obtained. The error also matches a *NotObtainedError, which names
	// the holder.
	ErrNotObtained = errors.New("dlock: lock not obtained")

	// ErrNotHeld is returned by Unlock and Refresh when the store no longer
	// holds the lease for this owner: it expired, was deleted or was taken over.
	ErrNotHeld = errors.New("dlock: lock not held")

	// ErrReleased is the Err of a lease that was unlocked, and the error of
	// operations on it afterwards.
	ErrReleased = errors.New("dlock: lease released")

	// ErrLost matches every *LostError: the lease ended without Unlock.
	ErrLost = errors.New("dlock: lease lost")

	// ErrInvalid is returned for bad arguments: names, TTLs, options, nil or
	// foreign values. The message names the field.
	ErrInvalid = errors.New("dlock: invalid argument")

	// ErrClosed is returned by calls on a Client after Close.
	ErrClosed = errors.New("dlock: client closed")
)

// LostReason tells why a lease was lost.
type LostReason int

const (
	// LostExpired: the local validity deadline (minus the safety margin)
	// passed without a successful renewal, and no renewal was attempted or
	// auto-renewal was off.
	LostExpired LostReason = iota + 1
	// LostMissing: the store answered that this owner no longer holds the
	// lock (the key was deleted, expired on the store, or taken over).
	LostMissing
	// LostUnreachable: renewals failed or got no answer until the local
	// validity deadline (minus the safety margin) was reached.
	LostUnreachable
	// LostClosed: the Client was closed while the lease was held.
	LostClosed
)

// String returns the reason in words.
func (r LostReason) String() string {
	switch r {
	case LostExpired:
		return "expired without renewal"
	case LostMissing:
		return "no longer held on the store"
	case LostUnreachable:
		return "store unreachable until the lease ran out"
	case LostClosed:
		return "client closed"
	}
	return fmt.Sprintf("LostReason(%d)", int(r))
}

// LostError is the Err of a lease that ended without Unlock. errors.Is(err,
// ErrLost) is true for every LostError; Unwrap gives the store error behind it,
// if any.
type LostError struct {
	Name   string     // the lock's name
	Reason LostReason // why it was lost
	Cause  error      // the store error behind it, or nil
}

// Error describes the loss.
func (e *LostError) Error() string {
	if e.Cause != nil {
		return fmt.Sprintf("dlock: lease %q lost: %s: %v", e.Name, e.Reason, e.Cause)
	}
	return fmt.Sprintf("dlock: lease %q lost: %s", e.Name, e.Reason)
}

// Is reports whether target is ErrLost.
func (e *LostError) Is(target error) bool { return target == ErrLost }

// Unwrap returns the store error behind the loss, or nil.
func (e *LostError) Unwrap() error { return e.Cause }

// NotObtainedError describes a lock that could not be obtained: who holds it
// and for how much longer the store keeps it. errors.Is(err, ErrNotObtained)
// is true for every NotObtainedError.
type NotObtainedError struct {
	Name      string        // the lock's name
	Holder    string        // the holder's owner string, "" when unknown
	HolderTTL time.Duration // the holder's remaining time to live, 0 when unknown
}

// Error names the lock and its holder.
func (e *NotObtainedError) Error() string {
	if e.Holder == "" {
		return fmt.Sprintf("dlock: lock %q not obtained", e.Name)
	}
	return fmt.Sprintf("dlock: lock %q not obtained: held by %s (expires in %s)",
		e.Name, e.Holder, e.HolderTTL.Round(time.Millisecond))
}

// Is reports whether target is ErrNotObtained.
func (e *NotObtainedError) Is(target error) bool { return target == ErrNotObtained }

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}
