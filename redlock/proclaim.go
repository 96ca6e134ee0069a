package redlock

import (
	"context"
	"fmt"

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
	g := newGather(b, ch, b.callLimit())
	defer g.stop()
	t := tally{n: len(b.nodes), q: b.Quorum()}
	var errs []*NodeError
	for t.verdict() == undecided {
		ans, ok, err := g.next(ctx)
		if !ok {
			if err != nil {
				return false, fmt.Errorf("redlock: %w", err)
			}
			missing := g.unanswered(b)
			errs = append(errs, missing...)
			t.fail += len(missing)
			break
		}
		switch {
		case ans.err != nil:
			t.fail++
			errs = append(errs, ans.node.nodeError(ans.err))
		case ans.val:
			t.yes++
		default:
			t.no++
		}
	}
	switch t.verdict() {
	case won:
		return true, nil
	case refused:
		return false, nil
	}
	return false, b.quorumError(ctx, "proclaim", req.Key, t.yes, errs)
}
