package redlock

import (
	"context"

	"github.com/dlock-go/dlock/driver"
)

var _ driver.Proclaimer = (*Backend)(nil)

// Proclaim sets the owner of token's exclusive grant with req.Fence on
// every node at once (see redislock.Backend.Proclaim): a grant carries its
// fence on a quorum of nodes at least (see Acquire). It reports true once a
// quorum of nodes hold the grant (the new owner applied, or a later one);
// false, with a nil error, when nodes that no longer hold it make a quorum
// impossible; otherwise a *QuorumError (Op "proclaim"), transient when the
// nodes may heal, or ctx's error wrapped. A proclaim that reached fewer
// than a quorum leaves the old owner wherever a quorum still holds it:
// Inspect reports an owner only when a quorum of nodes agree on it.
func (b *Backend) Proclaim(ctx context.Context, req driver.ProclaimRequest) (bool, error) {
	// The calls outlive the wait and the caller's context, as renewals
	// do: a late one changes only the owner of token's grant, and only
	// when no later proclaim reached that node (req.Seq).
	ch := fanOut(b, context.WithoutCancel(ctx), b.callLimit(), func(ctx context.Context, n *node) (bool, error) {
		return n.b.Proclaim(ctx, req)
	})
	return b.decide(ctx, ch, b.callLimit(), "proclaim", req.Key)
}
