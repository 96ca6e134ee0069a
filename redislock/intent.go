// Passing a waiting writer's intent to its next token (driver.IntentMover).

package redislock

import (
	"context"
	"time"

	"github.com/dlock-go/dlock/driver"
)

var _ driver.IntentMover = (*Backend)(nil)

// intentSuffixes are move_intent.lua's KEYS: the lock hash, the writer
// intent, the late-request record.
var intentSuffixes = []string{"", ":w", lateSuffix}

// MoveIntent implements driver.IntentMover in one script
// (move_intent.lua), on the lock's hash slot.
func (b *Backend) MoveIntent(ctx context.Context, key, from, to, owner string, ttl time.Duration) (bool, error) {
	if b.err != nil {
		return false, b.err
	}
	n, err := moveIntentScript.Run(ctx, b.rdb, b.keysOf(key, intentSuffixes), from, to, owner, millis(ttl)).Int()
	if err != nil {
		return false, b.storeError(ctx, "move intent", key, err)
	}
	return n == 1, nil
}
