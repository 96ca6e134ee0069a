// Leadership.Proclaim: a new value for the leader, without a new campaign.

package dlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// Proclaim changes the leader's value to value while the leadership holds,
// without campaigning again: the fence, the lease and its renewal stay.
// Once it returns nil, Value, Election.Leader and Observe (of every
// process) report the new value; value follows Campaign's rules.
//
// It returns ErrNotHeld when the leadership was lost (Err then reports
// the loss), ErrReleased after Resign, ErrInvalid for a bad value or a
// backend without driver.Proclaimer (with ErrUnsupported), ctx's error,
// and the store's error, wrapped, when the store failed: transient errors
// are retried while the lease's safe deadline allows. After an error the
// store may hold either value; a later Proclaim settles it (see
// docs/LOCK-KINDS.md).
func (ld *Leadership) Proclaim(ctx context.Context, value string) error {
	l := ld.lease()
	if l == nil || l.g == nil {
		return invalid("leadership: nil or not made by a Client")
	}
	g := l.g
	if len(value) > MaxMetadataLength {
		return invalid("value: %d bytes, over MaxMetadataLength (%d)", len(value), MaxMetadataLength)
	}
	if err := checkText("value", value); err != nil {
		return err
	}
	p, ok := g.c.backend.(driver.Proclaimer)
	if !ok {
		return &unsupportedError{what: "Proclaim (the backend cannot change a holder's owner)", backend: fmt.Sprintf("%T", g.c.backend)}
	}
	if err := g.c.enter(); err != nil {
		return err
	}
	defer g.c.exit()

	owner := withMetadata(g.ownerNow(), value)
	req := driver.ProclaimRequest{Key: g.key, Token: g.token, Fence: g.fence, Owner: owner, Seq: ld.seq.Add(1)}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for n := 1; ; n++ {
		if err := l.Err(); err != nil {
			return heldErr("proclaim", g.name, err)
		}
		cctx, cancel := context.WithDeadline(ctx, g.safeDeadline())
		held, err := p.Proclaim(cctx, req)
		cancel()
		switch {
		case err == nil && !held:
			g.c.logLoss(g, g.loseNow(LostMissing, nil), nil)
			return heldErr("proclaim", g.name, l.Err())
		case err == nil:
			if lerr := l.Err(); lerr != nil {
				// Lost while the proclaim was on the wire: the store had
				// the grant still, but its holder may not act on it.
				return heldErr("proclaim", g.name, lerr)
			}
			ld.proclaimed(req.Seq, value, owner)
			g.c.hub.wakeWatchers(g.key)
			return nil
		case l.Err() != nil:
			return heldErr("proclaim", g.name, l.Err())
		case ctx.Err() != nil:
			return fmt.Errorf("dlock: proclaim %q: %w", g.name, errors.Join(ctx.Err(), err))
		case !transient(err):
			return wrapStore("proclaim", g.name, err)
		}
		d := transientDelay(n)
		if !time.Now().Add(d).Before(g.safeDeadline()) || !sleep(ctx, timer, d, nil) {
			return fmt.Errorf("dlock: proclaim %q: unconfirmed: %w", g.name, errors.Join(err, ctx.Err()))
		}
	}
}

// proclaimed records value, the owner string owner, as the leader's value,
// unless a later Proclaim (a greater seq) was recorded already.
func (ld *Leadership) proclaimed(seq uint64, value, owner string) {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	if seq <= ld.applied {
		return
	}
	ld.applied, ld.value = seq, value
	ld.l.g.setOwner(owner)
}

// withMetadata returns owner, an owner string written by dlock, with its
// metadata (see ownerMetadata) replaced by metadata.
func withMetadata(owner, metadata string) string {
	if old, ok := ownerMetadata(owner); ok {
		owner = strings.TrimSuffix(owner, "|"+old)
	}
	if metadata == "" {
		return owner
	}
	return owner + "|" + metadata
}
