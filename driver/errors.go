// The errors of the contract.

package driver

import (
	"errors"
	"fmt"
)

// ErrInvalid is wrapped by the errors for bad arguments (names, TTLs,
// options, requests a backend cannot take); the message names the field.
// dlock.ErrInvalid is this error.
var ErrInvalid = errors.New("dlock: invalid argument")

// ErrUnsupported is wrapped by the errors for a feature the backend does not
// have (a capability, an optional method behind a wrapper). It wraps
// errors.ErrUnsupported. dlock.ErrUnsupported is this error.
var ErrUnsupported = fmt.Errorf("dlock: not supported by the backend: %w", errors.ErrUnsupported)

// ErrTransient is matched (errors.Is) by a store error that may heal by
// itself: one call that timed out, a dropped connection, a leader change, a
// quorum that was not reached this time. A backend marks such errors with
// Transient. A waiting call of the client (Lock, RLock, Acquire, Campaign,
// Multi.Lock) tries again, with backoff, through transient errors until its
// own wait ends; every other store error ends the wait at once, since it
// will not heal (credentials refused, a configuration the backend cannot
// work with, a value it did not write).
//
// A transient error says nothing about the outcome of the call: a request
// that failed so may still have been carried out, now or later (see
// Backend.Acquire).
//
// The client looks for the mark with errors.Is on the error that Acquire,
// Release and ReleaseGrant return, so it may sit anywhere in the chain. After
// a transient Acquire error it cleans up as after any failed acquire and
// tries again with a new token (or, for a token that outlives the call,
// the same one); after a transient release of a token used once it sends
// the same release again, until the lease's deadline, and takes a "not
// held" answer as released. An error that the caller's context caused needs
// no mark: the wait ends with the context. Renewals are tried again
// whatever the error, until the lease's safe deadline.
var ErrTransient = errors.New("transient store error")

// Transient returns err marked as transient (see ErrTransient): errors.Is
// matches ErrTransient and everything err matches, and its message is
// err's. It returns nil for a nil err.
func Transient(err error) error {
	if err == nil || errors.Is(err, ErrTransient) {
		return err
	}
	return transientError{err}
}

// IsTransient reports whether err may heal by itself: it matches
// ErrTransient.
func IsTransient(err error) bool { return errors.Is(err, ErrTransient) }

type transientError struct{ err error }

func (e transientError) Error() string        { return e.err.Error() }
func (e transientError) Unwrap() error        { return e.err }
func (e transientError) Is(target error) bool { return target == ErrTransient }

// ErrNotHeld is matched by a backend's error for a release or renewal that
// finds the lock in a state that proves the token does not hold it (for
// example a key that holds another program's value). dlock.ErrNotHeld is
// this error.
var ErrNotHeld = errors.New("dlock: lock not held")

// ErrNotifyRefused is wrapped by Listener.Subscribe when the store refuses
// the subscription for lack of rights (a Redis user whose ACL does not allow
// the release channels): no release of that store will be heard, so the
// client stops subscribing and its waiters poll.
var ErrNotifyRefused = errors.New("notifications refused by the store")
