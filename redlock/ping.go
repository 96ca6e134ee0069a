package redlock

import "context"

// Ping sends PING to every node at once and waits for all of them, each
// bounded by min(4 × node timeout, 1s) but at least one node timeout. Beyond
// checking the nodes, it leaves a connection open in each node's pool: the
// first call on a go-redis client includes connecting (dial, handshake,
// TLS), which can take longer than an acquire's per-node timeout, so a
// process that pings its nodes at startup does not pay for it on its first
// lock. The error is a *QuorumError (Op "ping") when fewer than a quorum of
// nodes answered, listing those that did not.
func (b *Backend) Ping(ctx context.Context) error {
	limit := b.callLimit()
	g := newGather(b, fanOut(b, ctx, limit, func(ctx context.Context, n *node) (struct{}, error) {
		return struct{}{}, n.rdb.Ping(ctx).Err()
	}), limit)
	defer g.stop()
	answered, errs := g.collect(ctx, b, nil)
	if answered < b.Quorum() {
		return b.quorumError(ctx, "ping", "", answered, errs)
	}
	return nil
}
