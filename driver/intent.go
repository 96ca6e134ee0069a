// Passing a waiting writer's intent from one of its tokens to the next: the
// IntentMover interface.

package driver

import (
	"context"
	"time"
)

// IntentMover is implemented by backends that can pass a waiting writer's
// intent (see AcquireRequest.Wait) from one token to another in one atomic
// step. A wait that draws a new token, after an attempt whose outcome is
// unknown or a grant that came too late, moves the intent to it before it
// releases the old token, so that no new reader gets in between; without
// it, that release drops the intent and new readers may go first. A
// wrapper whose inner backend has none returns an error wrapping
// ErrUnsupported.
type IntentMover interface {
	// MoveIntent gives token to a writer intent on key for ttl, with owner,
	// in place of token from's, when from has a live writer intent (which
	// goes) or holds key exclusively while no other token's intent is live;
	// otherwise it records nothing. It reports whether to has a live
	// intent after the call. A request of from that lands later records no
	// intent while to's is live, as for any other token.
	MoveIntent(ctx context.Context, key, from, to, owner string, ttl time.Duration) (bool, error)
}
