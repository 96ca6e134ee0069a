// The sweeper: the one place where a lock is the right tool. Every service
// instance runs one, and a dlock Election elects the one that sweeps.

package main

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock"
)

// sweeper publishes the "offline" event of every device whose heartbeat key
// has expired. Every service instance runs one; only the leader
// sweeps, so the fleet is scanned once per interval rather than once per
// instance, and each of its writes carries the leadership's fence, so that a
// sweeper that was paused past its lease cannot write after its successor.
type sweeper struct {
	store    *store
	locks    *dlock.Client
	lockTTL  time.Duration // the election lease's time to live
	interval time.Duration // time between two sweeps
	log      *slog.Logger

	leading atomic.Uint64 // the fence while this sweeper leads, else 0

	mu    sync.Mutex
	terms []term // this sweeper's terms as leader, for tests and logs
}

// term is one time a sweeper led: from the moment it held the lock to the
// moment its lease's context ended.
type term struct {
	fence          uint64
	elected, ended time.Time
}

// lockName is the name of the election lock of the store's fleet.
func (sw *sweeper) lockName() string { return "presence:" + sw.store.fleet + ":sweeper" }

// run campaigns in the sweeper election and sweeps while it leads, until
// ctx is done. A lost leadership (the store restarted, the network cut this
// process off for longer than the lease's TTL) sends it back to
// campaigning. It returns nil when ctx ends.
func (sw *sweeper) run(ctx context.Context) error {
	election := sw.locks.Election(sw.lockName(), dlock.WithTTL(sw.lockTTL))
	backoff := time.NewTimer(0)
	defer backoff.Stop()
	<-backoff.C
	for {
		// Campaign waits until this sweeper leads (woken by the leader's
		// resignation or its expiry); lead runs under a context that ends
		// when the leadership is lost or ctx ends.
		err := sw.term(ctx, election)
		sw.leading.Store(0)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil && !errors.Is(err, dlock.ErrLost) {
			sw.log.Warn("presence: sweeper campaign failed", "err", err)
		}
		// After a store failure, do not hammer the store.
		backoff.Reset(sw.interval)
		select {
		case <-ctx.Done():
			return nil
		case <-backoff.C:
		}
	}
}

// term campaigns once, leads until the leadership or ctx ends, and
// resigns. It returns the campaign's error, or lead's joined with the
// loss of the leadership.
func (sw *sweeper) term(ctx context.Context, election *dlock.Election) error {
	ld, err := election.Campaign(ctx, sw.store.fleet)
	if err != nil {
		return err
	}
	lctx, cancel := context.WithCancelCause(ld.Context())
	stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	err = sw.lead(lctx)
	stop()
	cancel(nil)
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), sw.lockTTL)
	defer rcancel()
	if rerr := ld.Resign(rctx); errors.Is(rerr, dlock.ErrLost) {
		return errors.Join(err, rerr)
	}
	return err
}

// lead sweeps every interval while ctx, which carries the leadership's
// lease, lasts.
func (sw *sweeper) lead(ctx context.Context) error {
	lease, ok := dlock.LeaseFromContextByName(ctx, sw.lockName())
	if !ok {
		return errors.New("presence: sweeper: no lease in the context")
	}
	sw.leading.Store(lease.Fence())
	// The lease's context ends before the store can give the lock to
	// another sweeper; stop claiming leadership at that moment, even while
	// a Redis call is still on its way back.
	sw.mu.Lock()
	sw.terms = append(sw.terms, term{fence: lease.Fence(), elected: time.Now()})
	i := len(sw.terms) - 1
	sw.mu.Unlock()
	stop := context.AfterFunc(ctx, func() {
		sw.leading.Store(0)
		sw.mu.Lock()
		sw.terms[i].ended = time.Now()
		sw.mu.Unlock()
	})
	defer stop()
	defer sw.leading.Store(0)
	sw.log.Info("presence: sweeper elected", "fence", lease.Fence())
	defer func() {
		sw.log.Info("presence: sweeper stepped down", "fence", lease.Fence(), "cause", context.Cause(ctx))
	}()
	tick := time.NewTicker(sw.interval)
	defer tick.Stop()
	for {
		if err := sw.sweep(ctx, lease.Fence()); err != nil {
			if errors.Is(err, errStaleSweeper) || ctx.Err() != nil {
				return err
			}
			sw.log.Warn("presence: sweep failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// sweep publishes the "offline" event of every known device whose key has
// expired, with fence.
func (sw *sweeper) sweep(ctx context.Context, fence uint64) error {
	known, err := sw.store.known(ctx)
	if err != nil {
		return err
	}
	alive, err := sw.store.alive(ctx, known)
	if err != nil {
		return err
	}
	for i, id := range known {
		if alive[i] {
			continue
		}
		published, err := sw.store.markOffline(ctx, fence, id)
		if err != nil {
			return err
		}
		if published {
			sw.log.Info("presence: device went offline", "device", id, "fence", fence)
		}
	}
	return nil
}

// history returns the sweeper's terms so far.
func (sw *sweeper) history() []term {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	return slices.Clone(sw.terms)
}
