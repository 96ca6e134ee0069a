// ForeignValueError: the error of an operation on a lock whose key holds a
// value of another program (WRONGTYPE).

package redislock

import (
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
)

// ErrForeignValue is matched (errors.Is) by the error of an operation on a
// lock whose keys hold a value dlock did not write: see ForeignValueError.
var ErrForeignValue = errors.New("redislock: a lock key holds a value of another program")

// ForeignValueError is the error of an operation on a lock one of whose
// keys holds a value of another type than dlock writes there (Redis
// answered WRONGTYPE): another program wrote under the lock's key (for
// example SET dlock:{name} ...), or under a key next to it. dlock neither
// reads nor overwrites such a value; remove it, or give the other program
// or dlock another namespace (WithNamespace).
//
// The error of a release or a renewal also matches dlock.ErrNotHeld
// (driver.ErrNotHeld): whatever the value is, the lock is not held.
type ForeignValueError struct {
	Key string // the lock's key, without namespace
	Err error  // Redis's answer
	// NotHeld: the error of a release or renewal (see Is).
	NotHeld bool
}

// Error says what Redis found; the caller's wrapping names the lock.
func (e *ForeignValueError) Error() string {
	return fmt.Sprintf("a key of the lock holds a value that dlock did not write (%v); "+
		"another program uses the key: remove the value, or use another namespace", e.Err)
}

// Unwrap returns Redis's answer.
func (e *ForeignValueError) Unwrap() error { return e.Err }

// Is reports whether target is ErrForeignValue, or, for a release or
// renewal, driver.ErrNotHeld.
func (e *ForeignValueError) Is(target error) bool {
	return target == ErrForeignValue || (e.NotHeld && target == driver.ErrNotHeld)
}

// foreign returns err as a *ForeignValueError when Redis answered
// WRONGTYPE for a script or command on key's lock, else err.
func foreign(key string, err error) error {
	var re redis.Error
	if errors.As(err, &re) && strings.Contains(re.Error(), "WRONGTYPE") {
		return &ForeignValueError{Key: key, Err: err}
	}
	return err
}
