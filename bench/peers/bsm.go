package peers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/bench"
)

// BSMTTL is the lock TTL the bsm/redislock subjects obtain with. The
// library has no default (the TTL is an argument of Obtain); this is dlock's
// DefaultTTL, so that no subject's lock can expire during a run. An Obtain
// whose context has no deadline retries for at most one TTL.
const BSMTTL = 10 * time.Second

// BSMDefaultBackoff is the retry interval of BSMDefault: the one
// bsm/redislock documents for LinearBackoff, in its retry example
// (ExampleClient_Obtain_retry, "Retry every 100ms":
// redislock.LinearBackoff(100*time.Millisecond)). Without a RetryStrategy
// Obtain does not retry at all ("Default: do not retry", Options).
const BSMDefaultBackoff = 100 * time.Millisecond

// BSMTunedBackoff is the retry interval of BSMTuned.
const BSMTunedBackoff = time.Millisecond

// BSMDefault returns the retry strategy of bsm/redislock at its documented
// setting: redislock.LinearBackoff(BSMDefaultBackoff), retrying every
// 100ms. The example's LimitRetry(..., 3) is left out: the adapter calls
// Obtain again anyway until it holds the lock.
func BSMDefault() redislock.RetryStrategy { return redislock.LinearBackoff(BSMDefaultBackoff) }

// BSMTuned returns the retry strategy of bsm/redislock tuned for fast
// handoffs: redislock.LinearBackoff(BSMTunedBackoff), retrying every 1ms
// instead of 100ms. Each retry is one round trip, so a waiter puts far less
// load on the server than a busy spin. It was chosen by sweeping the
// interval from 250µs to 10ms on the headline workload (2-core machine,
// loopback Redis): shorter intervals did not lower the wait p99 and cost
// more round trips per grant (3.2 at 250µs, 2.2 at 1ms); longer ones
// lowered fairness (Jain 0.91 at 1ms, 0.81 at 10ms).
func BSMTuned() redislock.RetryStrategy { return redislock.LinearBackoff(BSMTunedBackoff) }

// BSM returns a subject that locks with bsm/redislock: Obtain with ttl and
// a RetryStrategy from retry (called once per Obtain, as strategies such as
// LimitRetry keep state), then Release. newClient returns one worker's
// client; the worker closes it.
func BSM(name string, newClient func() redis.UniversalClient, ttl time.Duration, retry func() redislock.RetryStrategy) bench.Subject {
	return bench.Subject{
		Name: name,
		NewWorker: func(ctx context.Context, id int) (bench.Worker, error) {
			rdb := newClient()
			return &bsmWorker{c: redislock.New(rdb), rdb: rdb, ttl: ttl, retry: retry}, nil
		},
	}
}

type bsmWorker struct {
	c     *redislock.Client
	rdb   redis.UniversalClient
	ttl   time.Duration
	retry func() redislock.RetryStrategy
}

type bsmHeld struct{ l *redislock.Lock }

// Lock calls Obtain until it holds the lock. Obtain gives up with
// ErrNotObtained when its strategy stops retrying, and with
// context.DeadlineExceeded when the deadline it sets itself (one TTL, when
// ctx has none) passes; both only mean that others held the lock.
func (w *bsmWorker) Lock(ctx context.Context, name string) (bench.Held, error) {
	for {
		l, err := w.c.Obtain(ctx, name, w.ttl, &redislock.Options{RetryStrategy: w.retry()})
		if err == nil {
			return bsmHeld{l}, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("peers: bsm/redislock obtain %q: %w", name, errors.Join(err, ctx.Err()))
		}
		if !errors.Is(err, redislock.ErrNotObtained) && !errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("peers: bsm/redislock obtain %q: %w", name, err)
		}
	}
}

func (h bsmHeld) Unlock(ctx context.Context) error {
	if err := h.l.Release(ctx); err != nil {
		return fmt.Errorf("peers: bsm/redislock release %q: %w", h.l.Key(), err)
	}
	return nil
}

func (w *bsmWorker) Close() error { return w.rdb.Close() }
