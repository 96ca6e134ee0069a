// Letting the acquire statements finish for a short while after Acquire's
// context has ended, so that their outcome is known.

package sqllock

import (
	"context"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// abandonAfter is how long Acquire still waits for its statements once its
// context has ended.
const abandonAfter = 200 * time.Millisecond

// acquireInFlight runs the acquire statements on a context that outlives ctx
// by abandonAfter, so that their outcome is known.
//
// Cancelling a statement that is on its way does not stop it: the driver
// drops the connection, but the server has the statement and runs it, and
// may commit the grant after the clean-up Release that the dlock client sends
// at once on another connection. That grant would stay until its TTL ran
// out. So when ctx ends, Acquire lets the statement finish, which on a
// healthy database takes a millisecond, and returns its answer, grant or
// not. Only a database slower than abandonAfter has its statement cut short,
// with an unknown outcome.
func (b *Backend) acquireInFlight(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	return inFlight(ctx, func(sctx context.Context) (driver.AcquireResult, error) {
		return b.acquireOnce(sctx, req) // opError adds ctx's error to a failure
	})
}

// inFlight runs op on a context that outlives ctx by abandonAfter (see
// acquireInFlight).
func inFlight[T any](ctx context.Context, op func(ctx context.Context) (T, error)) (T, error) {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		grace := time.NewTimer(abandonAfter)
		defer grace.Stop()
		select {
		case <-grace.C:
			cancel()
		case <-sctx.Done(): // returned meanwhile
		}
	})
	defer stop()
	return op(sctx)
}
