// Retrying through store errors that may heal: which errors, and how long
// to wait between two tries.

package dlock

import (
	"math/rand/v2"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// The schedule of retries through transient store errors: transientBase
// doubling at each failure in a row, up to transientMax.
const (
	transientBase = 10 * time.Millisecond
	transientMax  = time.Second
)

// transient reports whether a store error may heal by itself, so that a
// call with time left tries again (see driver.ErrTransient).
func transient(err error) bool { return driver.IsTransient(err) }

// transientDelay is how long to wait before the next try after n store
// errors in a row (n >= 1): transientBase doubling up to transientMax, of
// which a random half is taken off, so that the clients a failure hit
// together do not come back together.
func transientDelay(n int) time.Duration {
	d := transientMax
	if n < 8 {
		d = min(transientBase<<(n-1), transientMax)
	}
	return d/2 + rand.N(d/2+1)
}
