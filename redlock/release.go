package redlock

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// Release drops one hold of token on key on every node at once: an
// exclusive hold or a shared one (each node finds it by token), and with it
// token's writer intent, if any. Once a quorum of nodes has answered it
// waits for the others only as long again as the quorum took, so that a
// slow node slows a release no more than an acquire; the late nodes'
// releases go on in the background. On each node it first waits for this
// token's earlier calls on key there (an acquire attempt that is still out
// on a slow node, and the clean-up that follows it), so that a late grant
// cannot land after the release; the wait and the release are each bounded
// by min(4 × node timeout, 1s), but at least one node timeout.
//
// Held is true when any node that answered held the lock for token, and
// Remaining is the highest hold count left on such a node (0 for a shared
// hold), so that a client draining its holds goes on until the nodes are
// clear. The error is a *QuorumError (Op "release") only when fewer than a
// quorum of nodes answered at all; the nodes that did answer have released
// by then.
func (b *Backend) Release(ctx context.Context, key, token string) (driver.ReleaseResult, error) {
	start := time.Now()
	timeout := b.callLimit()
	ch := make(chan answer[driver.ReleaseResult], len(b.nodes))
	for _, n := range b.nodes {
		ahead, done := b.enqueue(key, token, n.index)
		b.goBackground(func() {
			// Not cut short by ctx: a release the caller stopped waiting
			// for still goes out, bounded by timeout.
			res, err := b.releaseNode(context.WithoutCancel(ctx), n, key, token, ahead, done, timeout)
			ch <- answer[driver.ReleaseResult]{node: n, val: res, err: err}
		})
	}
	g := newGather(b, ch, 2*timeout)
	defer g.stop()
	var res driver.ReleaseResult
	answered, errs := g.collect(ctx, b, func(ans answer[driver.ReleaseResult], answered int) {
		if ans.val.Held {
			res.Held = true
			res.Remaining = max(res.Remaining, ans.val.Remaining)
		}
		if answered == b.Quorum() {
			// Give the other nodes as long again as the quorum took (and
			// 200µs): on healthy nodes every release is then in before the
			// caller goes on (an immediate re-acquire finds every node
			// free), while a slow or dead node costs little.
			g.shorten(time.Since(start) + 200*time.Microsecond)
		}
	})
	if answered < b.Quorum() {
		return driver.ReleaseResult{}, b.quorumError(ctx, "release", key, answered, errs)
	}
	return res, nil
}

// releaseNode is Release on node n, queued behind ahead. ctx does not end
// with the caller's (see Release). When the call ahead has not returned
// within timeout, the release is sent in the background once it has, and
// the answer is an error.
func (b *Backend) releaseNode(ctx context.Context, n *node, key, token string, ahead <-chan struct{}, done func(), timeout time.Duration) (driver.ReleaseResult, error) {
	release := func() (driver.ReleaseResult, error) {
		defer done()
		rctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		return n.b.Release(rctx, key, token)
	}
	if err := b.behind(ahead, timeout, func() { _, _ = release() }); err != nil {
		return driver.ReleaseResult{}, err
	}
	return release()
}

// behind waits up to timeout for the call ahead of this one on its node
// (ahead closes when it returns; nil: none). When that call is still out,
// late runs in the background once it has returned, and the error says so.
func (b *Backend) behind(ahead <-chan struct{}, timeout time.Duration, late func()) error {
	if ahead == nil {
		return nil
	}
	wait := time.NewTimer(timeout)
	defer wait.Stop()
	select {
	case <-ahead:
		return nil
	case <-wait.C:
		b.goBackground(func() {
			<-ahead
			late()
		})
		return fmt.Errorf("an earlier call of this owner on this node has not returned after %v", timeout)
	}
}
