// The errors a caller branches on: the sentinels, NotObtainedError and
// LostError.

package dlock

import (
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/safetext"
)

var (
	// ErrNotObtained is returned by TryLock when another owner holds the lock,
	// and by Lock when the wait ends (context done, WithWait elapsed) before the
	// lock was obtained. The error also matches a *NotObtainedError, which names
	// the holder.
	ErrNotObtained = errors.New("dlock: lock not obtained")

	// ErrNotHeld is returned by Unlock and Refresh when the store no longer
	// holds the lease for this owner: it expired, was deleted or was taken over.
	ErrNotHeld = driver.ErrNotHeld

	// ErrReleased is the Err of a lease that was unlocked, and the error of
	// operations on it afterwards.
	ErrReleased = errors.New("dlock: lease released")

	// ErrLost matches every *LostError: the lease ended without Unlock.
	ErrLost = errors.New("dlock: lease lost")

	// ErrInvalid is returned for bad arguments: names, TTLs, options, nil or
	// foreign values. The message names the field. It is driver.ErrInvalid,
	// so backends return it too.
	ErrInvalid = driver.ErrInvalid

	// ErrUnsupported is returned, with ErrInvalid, for a lock kind or option
	// the backend does not have (a Semaphore on Redlock, WithLockDelay on
	// SQL). It is driver.ErrUnsupported.
	ErrUnsupported = driver.ErrUnsupported

	// ErrClosed is returned by calls on a Client after Close.
	ErrClosed = errors.New("dlock: client closed")

	// ErrConflict matches every *ConflictError: a reader or a semaphore
	// permit asked for a name whose live shared holds are of another kind
	// or limit. A name's holds bind its kind and limit while any lasts, so
	// waiting would not help; the holds are another process's, so it is
	// not an ErrInvalid (the caller's arguments may be right).
	ErrConflict = errors.New("dlock: lock kind conflicts with the name's holds")
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
	Name string // the lock's name
	// Holder is the owner string of the hold the caller waits for, "" when
	// unknown: the exclusive holder; with shared holds in the way, the
	// reader or permit holder whose hold ends last (for a writer) or first
	// (for a semaphore at its limit); the waiting writer when WriterWaiting.
	Holder    string
	HolderTTL time.Duration // Holder's remaining time to live, 0 when unknown
	// Shared is the number of shared holds (readers, permits in use) the
	// store reported, 0 when none or unknown.
	Shared int
	// Permits is the semaphore's limit for a Semaphore, else 0.
	Permits int
	// WriterWaiting reports that a reader was refused because a writer is
	// waiting (readers queue behind a waiting writer); Holder is that writer.
	WriterWaiting bool
	// Position is a fair waiter's place in the queue (1 is next), or 0.
	Position int
	// Slow, when not 0, is how long the store took to grant the lock to a
	// TryLock: longer than a lease of the TTL may be trusted (the TTL less
	// the backend's drift allowance and the safety margin), so the grant was
	// given back. A store this slow needs a longer TTL. (Lock gives such a
	// grant back too, and goes on waiting.)
	Slow time.Duration
}

// Error names the lock and what stands in the way. The holder's owner
// string was written by another program: it is shown escaped when it holds
// anything a terminal could take for a command.
func (e *NotObtainedError) Error() string {
	holder := safetext.Escape(e.Holder)
	var msg string
	switch {
	case e.Slow > 0:
		msg = fmt.Sprintf("dlock: lock %q not obtained: the store granted it only after %s, too late for the lease to be trusted; the grant was given back (a store this slow needs a longer TTL)",
			e.Name, e.Slow.Round(time.Millisecond))
	case e.WriterWaiting:
		msg = fmt.Sprintf("dlock: lock %q not obtained: a writer is waiting", e.Name)
		if e.Holder != "" {
			msg += fmt.Sprintf(" (%s%s)", holder, e.until(" for up to %s more"))
		}
	case e.Permits > 0 && e.Shared > 0:
		msg = fmt.Sprintf("dlock: semaphore %q not obtained: %d of %d permits in use", e.Name, e.Shared, e.Permits)
		if e.Holder != "" {
			msg += fmt.Sprintf(" (the first to expire, held by %s%s)", holder, e.until(" in %s"))
		}
	case e.Shared > 0:
		msg = fmt.Sprintf("dlock: lock %q not obtained: held by %d shared holders", e.Name, e.Shared)
		if e.Holder != "" {
			msg += fmt.Sprintf(" (the last to expire, %s%s)", holder, e.until(" in %s"))
		}
	case e.Holder == "":
		msg = fmt.Sprintf("dlock: lock %q not obtained", e.Name)
	default:
		msg = fmt.Sprintf("dlock: lock %q not obtained: held by %s", e.Name, holder)
		if e.HolderTTL > 0 {
			msg += fmt.Sprintf(" (expires in %s)", e.HolderTTL.Round(time.Millisecond))
		}
	}
	if e.Position > 0 {
		msg += fmt.Sprintf("; place %d in the queue", e.Position)
	}
	return msg
}

// until formats the holder's remaining time with format, led by a comma,
// or returns "" when the store did not say (HolderTTL 0).
func (e *NotObtainedError) until(format string) string {
	if e.HolderTTL <= 0 {
		return ""
	}
	return "," + fmt.Sprintf(format, e.HolderTTL.Round(time.Millisecond))
}

// Is reports whether target is ErrNotObtained.
func (e *NotObtainedError) Is(target error) bool { return target == ErrNotObtained }

// ConflictError is the error of a TryRLock, RLock, TryAcquire or Acquire
// refused because the name's live shared holds were granted with another
// kind or limit: a Semaphore of 2 on a name whose permits were taken with
// 3, a reader on a semaphore's name, a permit on a name held by readers.
// The first holds bind the name while any of them lasts; once they are
// gone, any kind may take it. errors.Is(err, ErrConflict) is true for
// every ConflictError, errors.Is(err, ErrInvalid) is not. Lock and Acquire
// return it at once rather than wait.
//
// A writer (Mutex, RWMutex.Lock) never conflicts: the write side of a name
// excludes its readers and its permits alike, by design.
type ConflictError struct {
	Name string // the lock's name
	// Permits is the refused request's limit: a Semaphore's permits, or 0
	// for a reader.
	Permits int
	// HeldPermits is the limit of the live shared holds: their semaphore's
	// permits, or 0 for readers.
	HeldPermits int
	// Holder is the owner string of one of those holds, "" when unknown.
	Holder string
	// Shared is the number of those holds, 0 when unknown.
	Shared int
}

// Error names both kinds.
func (e *ConflictError) Error() string {
	want := fmt.Sprintf("read lock %q", e.Name)
	if e.Permits > 0 {
		want = fmt.Sprintf("semaphore %q of %d permits", e.Name, e.Permits)
	}
	held := "readers of a read-write lock"
	if e.HeldPermits > 0 {
		held = fmt.Sprintf("permits of a semaphore of %d", e.HeldPermits)
	}
	msg := fmt.Sprintf("dlock: %s refused: the name is held by %s", want, held)
	switch {
	case e.Shared == 1 && e.Holder != "":
		msg += fmt.Sprintf(" (1 hold, by %s)", safetext.Escape(e.Holder))
	case e.Shared > 1 && e.Holder != "":
		msg += fmt.Sprintf(" (%d holds, one by %s)", e.Shared, safetext.Escape(e.Holder))
	case e.Shared > 0:
		msg += fmt.Sprintf(" (%d holds)", e.Shared)
	case e.Holder != "":
		msg += fmt.Sprintf(" (one by %s)", safetext.Escape(e.Holder))
	}
	return msg + "; a name keeps the kind and limit of its holds while any lasts"
}

// Is reports whether target is ErrConflict.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// wrapStore wraps err, a store's failure of op on the lock name: the root
// package names the operation and the lock, once, and the backend only
// what it alone knows (its store, a node's address), so that a message
// reads "dlock: acquire "x": redis 127.0.0.1:6379: OOM ...". See
// docs/ARCHITECTURE.md, "Errors".
func wrapStore(op, name string, err error) error {
	return &storeError{op: op, name: name, err: err}
}

// storeError is the error of wrapStore.
type storeError struct {
	op, name string
	err      error
}

func (e *storeError) Error() string { return fmt.Sprintf("dlock: %s %q: %v", e.op, e.name, e.err) }

func (e *storeError) Unwrap() error { return e.err }

// storeCause returns the store's own error inside err, a wrapStore error,
// for a message that names the operation and the lock already.
func storeCause(err error) error {
	if se, ok := err.(*storeError); ok {
		return se.err
	}
	return err
}
