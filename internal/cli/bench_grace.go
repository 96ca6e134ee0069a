// dlock bench's graceful workers: releases that outlive a run ended by a
// signal, so that no lock is left on the store.

package cli

import (
	"context"
	"time"

	"github.com/dlock-go/dlock/internal/bench"
)

// graceful makes s's workers release on a context that ends only grace
// after the run's: a run ended by a signal cancels the calls under way, and a
// release cancelled so would leave its lock on the store until the lease
// expires (a raw baseline's lock in SQL, for good), as Lease.Unlock does.
// Waits for the lock still end at once. The workers keep the kinds of lock
// they take (bench.RWWorker, bench.SemaphoreWorker).
func graceful(s bench.Subject, grace time.Duration) bench.Subject {
	newWorker := s.NewWorker
	s.NewWorker = func(ctx context.Context, id int) (bench.Worker, error) {
		w, err := newWorker(ctx, id)
		if err != nil {
			return nil, err
		}
		gw := &graceWorker{Worker: w, grace: grace}
		var (
			rw  bench.RWLocker
			sem bench.PermitAcquirer
		)
		if inner, ok := w.(bench.RWLocker); ok {
			rw = graceRW{gw, inner}
		}
		if inner, ok := w.(bench.PermitAcquirer); ok {
			sem = graceSem{gw, inner}
		}
		return bench.WithKinds(gw, rw, sem), nil
	}
	return s
}

// graceWorker is a worker of graceful. Run calls Lock and Unlock from one
// goroutine, and Close after it has ended.
type graceWorker struct {
	bench.Worker
	grace  time.Duration
	ctx    context.Context // for releases; set by the first Lock
	cancel context.CancelFunc
	stop   func() bool
	held   graceHeld // the lock held: one at a time
}

// graceHeld releases on its worker's context.
type graceHeld struct {
	w *graceWorker
	h bench.Held
}

func (w *graceWorker) Lock(ctx context.Context, name string) (bench.Held, error) {
	return w.take(ctx, func(ctx context.Context) (bench.Held, error) { return w.Worker.Lock(ctx, name) })
}

// take calls lock with ctx and returns its hold, released on w's context.
func (w *graceWorker) take(ctx context.Context, lock func(context.Context) (bench.Held, error)) (bench.Held, error) {
	if w.ctx == nil {
		uctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		w.ctx, w.cancel = uctx, cancel
		w.stop = context.AfterFunc(ctx, func() { time.AfterFunc(w.grace, cancel) })
	}
	h, err := lock(ctx)
	if err != nil {
		return nil, err
	}
	w.held = graceHeld{w, h}
	return &w.held, nil
}

func (h *graceHeld) Unlock(context.Context) error { return h.h.Unlock(h.w.ctx) }

func (w *graceWorker) Close() error {
	if w.ctx != nil {
		w.stop()
		w.cancel()
	}
	return w.Worker.Close()
}

// graceRW is a graceful worker's read-write locks, those of inner.
type graceRW struct {
	w     *graceWorker
	inner bench.RWLocker
}

func (g graceRW) RLock(ctx context.Context, name string) (bench.Held, error) {
	return g.w.take(ctx, func(ctx context.Context) (bench.Held, error) { return g.inner.RLock(ctx, name) })
}

func (g graceRW) WLock(ctx context.Context, name string) (bench.Held, error) {
	return g.w.take(ctx, func(ctx context.Context) (bench.Held, error) { return g.inner.WLock(ctx, name) })
}

// graceSem is a graceful worker's semaphores, those of inner.
type graceSem struct {
	w     *graceWorker
	inner bench.PermitAcquirer
}

func (g graceSem) AcquirePermit(ctx context.Context, name string, permits int) (bench.Held, error) {
	return g.w.take(ctx, func(ctx context.Context) (bench.Held, error) { return g.inner.AcquirePermit(ctx, name, permits) })
}
