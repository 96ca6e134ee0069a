package peers

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/bench"
)

// RedsyncDefault is redsync at its documented defaults: no options at all.
// redsync v4 (redsync.go, NewMutex, and the doc comments of the With*
// options) documents them as: expiry 8s (WithExpiry), 32 tries per
// LockContext call (WithTries), a retry delay drawn uniformly from
// [50ms, 250ms) before every try after the first (WithRetryDelay: "The
// default value is rand(50ms, 250ms)"), drift factor 0.01, timeout factor
// 0.05 (each try may take expiry × 0.05 = 400ms), quorum len(pools)/2+1.
func RedsyncDefault() []redsync.Option { return nil }

// RedsyncTunedDelay bounds the retry delay of RedsyncTuned: each retry waits
// a random time in [RedsyncTunedDelay/2, RedsyncTunedDelay).
const RedsyncTunedDelay = time.Millisecond

// RedsyncTuned is redsync set up for fast handoffs, as a user who measured
// it would: the retry delay is a random time in [0.5ms, 1ms) instead of
// [50ms, 250ms), and 1<<20 tries per LockContext call instead of 32, so
// that a call gives up only after minutes. Expiry, drift and timeout
// factors stay at their defaults. The delay is jittered so that waiters do
// not retry in step, and not 0, which would make every waiter a busy spin
// of two round trips per try (a failed redsync try also sends a release).
// It was chosen by sweeping the bound from 250µs to 10ms on the headline
// workload (2-core machine, loopback Redis): below 1ms the wait p99 did not
// improve and the round trips per grant grew (8.2 at 250µs, 4.0 at 1ms).
func RedsyncTuned() []redsync.Option {
	return []redsync.Option{
		redsync.WithTries(1 << 20),
		redsync.WithRetryDelayFunc(func(int) time.Duration {
			return RedsyncTunedDelay/2 + rand.N(RedsyncTunedDelay/2)
		}),
	}
}

// Redsync returns a subject that locks with redsync Mutexes made with opts.
// newClients returns one worker's clients, one per Redis node (one client
// for a single node, N for Redlock); the worker closes them.
func Redsync(name string, newClients func() []redis.UniversalClient, opts ...redsync.Option) bench.Subject {
	return bench.Subject{
		Name: name,
		NewWorker: func(ctx context.Context, id int) (bench.Worker, error) {
			clients := newClients()
			pools := make([]redsyncredis.Pool, len(clients))
			for i, c := range clients {
				pools[i] = goredis.NewPool(c)
			}
			return &redsyncWorker{
				rs:      redsync.New(pools...),
				clients: clients,
				opts:    opts,
				mutexes: map[string]*redsync.Mutex{},
			}, nil
		},
	}
}

type redsyncWorker struct {
	rs      *redsync.Redsync
	clients []redis.UniversalClient
	opts    []redsync.Option
	mutexes map[string]*redsync.Mutex // a worker locks from one goroutine
}

type redsyncHeld struct{ m *redsync.Mutex }

// Lock calls LockContext until it holds the lock: a LockContext that used
// up its tries while others held the lock returns ErrFailed or ErrTaken
// (see redsyncTaken), and is called again.
func (w *redsyncWorker) Lock(ctx context.Context, name string) (bench.Held, error) {
	m := w.mutexes[name]
	if m == nil {
		m = w.rs.NewMutex(name, w.opts...)
		w.mutexes[name] = m
	}
	for {
		err := m.LockContext(ctx)
		if err == nil {
			return redsyncHeld{m}, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("peers: redsync lock %q: %w", name, errors.Join(err, ctx.Err()))
		}
		if !redsyncTaken(err) {
			return nil, fmt.Errorf("peers: redsync lock %q: %w", name, err)
		}
	}
}

// redsyncTaken reports whether err only says that other holders had the
// lock: ErrFailed, ErrTaken, or a list of ErrNodeTaken.
func redsyncTaken(err error) bool {
	var taken *redsync.ErrTaken
	if errors.Is(err, redsync.ErrFailed) || errors.As(err, &taken) {
		return true
	}
	list, ok := err.(interface{ WrappedErrors() []error }) // *multierror.Error
	if !ok || len(list.WrappedErrors()) == 0 {
		return false
	}
	for _, e := range list.WrappedErrors() {
		var node *redsync.ErrNodeTaken
		if !errors.As(e, &node) {
			return false
		}
	}
	return true
}

func (h redsyncHeld) Unlock(ctx context.Context) error {
	ok, err := h.m.UnlockContext(ctx)
	if err != nil {
		return fmt.Errorf("peers: redsync unlock %q: %w", h.m.Name(), err)
	}
	if !ok {
		return fmt.Errorf("peers: redsync unlock %q: not held", h.m.Name())
	}
	return nil
}

func (w *redsyncWorker) Close() error {
	var errs []error
	for _, c := range w.clients {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}
