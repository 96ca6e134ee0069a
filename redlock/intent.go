// Passing a waiting writer's intent to its next token (driver.IntentMover).

package redlock

import (
	"context"
	"time"

	"github.com/dlock-go/dlock/driver"
)

var _ driver.IntentMover = (*Backend)(nil)

// MoveIntent implements driver.IntentMover on every node (each a
// redislock.Backend's MoveIntent), the call on each node queued behind
// from's earlier calls there, so that it comes before from's clean-up. to
// has the intent when a quorum of nodes gave it one: a reader is refused
// where a quorum carries a live intent. The error is a *QuorumError (Op
// "move intent") when fewer than a quorum of nodes answered.
func (b *Backend) MoveIntent(ctx context.Context, key, from, to, owner string, ttl time.Duration) (bool, error) {
	timeout := b.callLimit()
	ch := make(chan answer[bool], len(b.nodes))
	for _, n := range b.nodes {
		ahead, done := b.enqueue(key, from, n.index)
		b.goBackground(func() {
			moved, err := b.moveNode(ctx, n, key, from, to, owner, ttl, ahead, done, timeout)
			ch <- answer[bool]{node: n, val: moved, err: err}
		})
	}
	g := newGather(b, ch, 2*timeout)
	defer g.stop()
	moved := 0
	answered, errs := g.collect(ctx, b, func(a answer[bool], _ int) {
		if a.val {
			moved++
		}
	})
	if answered < b.Quorum() {
		return false, b.quorumError(ctx, "move intent", key, answered, errs)
	}
	return moved >= b.Quorum(), nil
}

// moveNode is MoveIntent on node n, queued behind ahead. When the call
// ahead has not returned within timeout, nothing is sent (the clean-up
// that follows removes from's intent there) and the answer is an error.
func (b *Backend) moveNode(ctx context.Context, n *node, key, from, to, owner string, ttl time.Duration, ahead <-chan struct{}, done func(), timeout time.Duration) (bool, error) {
	if err := b.behind(ahead, timeout, done); err != nil {
		return false, err
	}
	defer done()
	nctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	moved, err := n.b.MoveIntent(nctx, key, from, to, owner, ttl)
	return moved, timedOut(nctx, err)
}
