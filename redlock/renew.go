package redlock

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// Renew extends the lease of token on key to ttl on every node at once,
// exclusive or shared (each node finds it by token), waiting for each node
// at most min(node timeout, ttl/10). It reports true as soon as a quorum of
// nodes renewed; false, with a nil error, when nodes that no longer hold
// the lease for token make a quorum impossible; otherwise a *QuorumError
// (Op "renew") listing the nodes that failed, or ctx's error wrapped.
func (b *Backend) Renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	// The calls outlive the wait and the caller's context (see callLimit):
	// a late renewal only extends a hold of token, which it finds by token.
	ch := fanOut(b, context.WithoutCancel(ctx), b.callLimit(), func(ctx context.Context, n *node) (bool, error) {
		return n.b.Renew(ctx, key, token, ttl)
	})
	return b.decide(ctx, ch, b.callTimeout(ttl), "renew", key)
}

// RenewBatch renews every lease of reqs with one pipeline per node (see
// redislock.Backend.RenewBatch), all nodes at once, waiting for each node
// at most min(node timeout, shortest TTL/10). Each request is decided by
// its own quorum, as in Renew; the call returns once every request is
// decided. The result has one entry per request, in order.
func (b *Backend) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) []driver.RenewResult {
	if len(reqs) == 0 {
		return nil
	}
	shortest := reqs[0].TTL
	for _, r := range reqs[1:] {
		shortest = min(shortest, r.TTL)
	}
	// A grant's fence differs between nodes (each node draws its own), so
	// renewals are not tied to one: no Fence reaches a node.
	untied := append([]driver.RenewRequest(nil), reqs...)
	for i := range untied {
		untied[i].Fence = 0
	}
	ch := fanOut(b, context.WithoutCancel(ctx), b.callLimit(), func(ctx context.Context, n *node) ([]driver.RenewResult, error) {
		res := n.b.RenewBatch(ctx, untied)
		for i := range res {
			res[i].Err = timedOut(ctx, res[i].Err)
		}
		return res, nil
	})
	g := newGather(b, ch, b.callTimeout(shortest))
	defer g.stop()

	tallies := make([]tally, len(reqs))
	errs := make([][]*NodeError, len(reqs))
	for i := range tallies {
		tallies[i] = tally{n: len(b.nodes), q: b.Quorum()}
	}
	results := make([]driver.RenewResult, len(reqs))
	open := len(reqs)
	for open > 0 {
		ans, ok, err := g.next(ctx)
		if !ok {
			missing := g.unanswered(b)
			for i := range reqs {
				if tallies[i].verdict() != undecided {
					continue
				}
				if err != nil {
					results[i].Err = fmt.Errorf("redlock: %w", err)
					tallies[i].fail = tallies[i].n // decided: failed
					continue
				}
				errs[i] = append(errs[i], missing...)
				tallies[i].fail += len(missing)
			}
			break
		}
		open = 0
		for i := range reqs {
			t := &tallies[i]
			if t.verdict() != undecided {
				continue
			}
			switch {
			case i >= len(ans.val):
				t.fail++
				errs[i] = append(errs[i], ans.node.nodeError(fmt.Errorf("too few results")))
			case ans.val[i].Err != nil:
				t.fail++
				errs[i] = append(errs[i], ans.node.nodeError(ans.val[i].Err))
			case ans.val[i].Held:
				t.yes++
			default:
				t.no++
			}
			if t.verdict() == undecided {
				open++
			}
		}
	}
	for i := range reqs {
		if results[i].Err != nil {
			continue
		}
		switch tallies[i].verdict() {
		case won:
			results[i].Held = true
		case refused:
		default:
			results[i].Err = b.quorumError(ctx, "renew", reqs[i].Key, tallies[i].yes, errs[i])
		}
	}
	return results
}

// decide gathers the nodes' yes-or-no answers of op on key from ch, within
// limit, until a quorum is won or cannot be: true when won, false when the
// nodes refused, otherwise a *QuorumError listing the nodes that failed, or
// ctx's error wrapped.
func (b *Backend) decide(ctx context.Context, ch <-chan answer[bool], limit time.Duration, op, key string) (bool, error) {
	g := newGather(b, ch, limit)
	defer g.stop()
	t := tally{n: len(b.nodes), q: b.Quorum()}
	var errs []*NodeError
	for t.verdict() == undecided {
		ans, ok, err := g.next(ctx)
		if !ok {
			if errs, err = g.ended(b, err, &t, errs); err != nil {
				return false, err
			}
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
	return false, b.quorumError(ctx, op, key, t.yes, errs)
}
