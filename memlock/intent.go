// Passing a waiting writer's intent to its next token (driver.IntentMover).

package memlock

import (
	"context"
	"time"

	"github.com/dlock-go/dlock/driver"
)

var _ driver.IntentMover = (*Backend)(nil)

// MoveIntent implements driver.IntentMover: from's live writer intent on
// key becomes to's, or, when from holds key exclusively and no intent is
// live, to gets one; either lives ttl from now. Nobody is woken: nothing
// that kept others out went.
func (b *Backend) MoveIntent(ctx context.Context, key, from, to, owner string, ttl time.Duration) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return false, err
	}
	now := b.clock.Now()
	st := b.state(key, now)
	if st == nil {
		return false, nil
	}
	switch in := st.intent; {
	case in != nil && in.token == from:
	case in == nil && st.excl != nil && !st.excl.expired(now) && st.excl.holds[from] > 0:
	default:
		return in != nil && in.token == to, nil
	}
	st.intent = &waiter{token: to, owner: owner, expires: now.Add(ttl)}
	return true, nil
}
