package etcdlock

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/ctxend"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Calls to the store, and which of their errors may heal.
//
// Every call is one attempt bounded by attemptFor (a share of the call
// timeout; more while the store answers slowly, see pacer), so that a call that hangs on one member (a frozen process, a
// half-open connection) ends while there is time for another attempt, which
// etcd's client sends to the next member. A call that is safe to repeat (a
// read, a lease grant or keep-alive, a write whose compares make a repeat do
// nothing) is repeated after a transient error while the operation's bound
// lasts (repeat). Acquire and Release start over after a transient error of
// one of their writes, and recognise the outcome of an earlier attempt that
// landed (see Acquire and release).

// attemptFor is how long one call to the store may take, out of a call
// timeout of timeout (the default when 0 or less): a sixth of it, from
// 250ms to 1s.
func attemptFor(timeout time.Duration) time.Duration {
	if timeout <= 0 {
		timeout = defaultTimeout
	}
	return min(max(timeout/6, 250*time.Millisecond), time.Second, timeout)
}

// pacer bounds each attempt of a call to the store: by its base
// (attemptFor), or, while the store answers slowly (a crowd of waiters, a
// loaded machine), by slowFactor times the average time of its recent
// answers, up to limit (the call timeout). A call that hangs on one member
// (frozen, half-open) still ends at the base while the others answer in
// time; but a store that is merely slow is not sent every call again, by
// attempts cut short before their answers could come, which would only
// add to its load (and a repeated write's clean-up to that).
type pacer struct {
	base, limit time.Duration
	// avg is the answered calls' recent time in ns: it takes the first at
	// once, rises halfway to a slower one and falls an eighth of the way
	// to a faster one, so that a burst of slow answers lengthens the
	// attempts at once.
	avg atomic.Int64
}

// slowFactor is how many times the average answer an attempt may take.
const slowFactor = 4

func newPacer(timeout time.Duration) *pacer {
	if timeout <= 0 {
		timeout = defaultTimeout
	}
	base := attemptFor(timeout)
	return &pacer{base: base, limit: max(base, timeout)}
}

// bound is how long the next attempt may take, scale times the pace (an
// attempt after one that ran out of time takes twice as long: see
// repeatCall), up to limit.
func (p *pacer) bound(scale int) time.Duration {
	d := max(p.base, slowFactor*time.Duration(p.avg.Load()))
	for range scale - 1 {
		d *= 2
	}
	return min(d, p.limit)
}

// observe counts an answer that took d.
func (p *pacer) observe(d time.Duration) {
	for {
		old := p.avg.Load()
		next := int64(d)
		switch {
		case old == 0:
		case next > old:
			next = old + (next-old)/2
		default:
			next = old + (next-old)/8
		}
		if p.avg.CompareAndSwap(old, next) {
			return
		}
	}
}

// attempt runs one call f with ctx bounded by p (by ctx alone when p is
// nil).
func attempt(ctx context.Context, p *pacer, f func(context.Context) error) error {
	return attemptScaled(ctx, p, 1, f)
}

// attemptScaled is attempt with p's bound times scale (see bound). A call
// that came back with an answer, a success or an error the store gave
// (not transient), counts for p.
func attemptScaled(ctx context.Context, p *pacer, scale int, f func(context.Context) error) error {
	if p == nil {
		return f(ctx)
	}
	actx, cancel := context.WithTimeout(ctx, p.bound(scale))
	defer cancel()
	start := time.Now()
	err := f(actx)
	if err == nil || !isTransient(err) {
		p.observe(time.Since(start))
	}
	return err
}

// repeat runs f until it succeeds, fails with an error that is not
// transient, or ctx ends, pausing between tries (25ms doubling to 250ms,
// jittered). f must be safe to repeat.
func repeat(ctx context.Context, f func(context.Context) error) error {
	pause := 25 * time.Millisecond
	for {
		err := f(ctx)
		if !mayRepeat(ctx, err) {
			return err
		}
		if !sleep(ctx, pause/2+rand.N(pause)) {
			return err
		}
		pause = min(2*pause, 250*time.Millisecond)
	}
}

// repeatCall is repeat of one call f, each try bounded by p; a try after
// one that ran out of time may take twice as long as that one (a store
// that is slow, not hung, answers it; a hung member's call goes to another
// member either way).
func repeatCall(ctx context.Context, p *pacer, f func(context.Context) error) error {
	scale := 1
	return repeat(ctx, func(ctx context.Context) error {
		err := attemptScaled(ctx, p, scale, f)
		if errors.Is(err, context.DeadlineExceeded) {
			scale = min(scale+1, 8)
		}
		return err
	})
}

// mayRepeat reports whether an operation whose last try failed with err
// may try again: err is transient, the try may be repeated (not
// onceError), and ctx is alive.
func mayRepeat(ctx context.Context, err error) bool {
	var once onceError
	return err != nil && ctx.Err() == nil && isTransient(err) && !errors.As(err, &once)
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// onceError marks the error of a write that must not be repeated: its
// outcome is unknown, and a repeat that found it done would do it again (a
// re-entry's or a release's change of a hold count).
type onceError struct{ err error }

func (e onceError) Error() string { return e.err.Error() }
func (e onceError) Unwrap() error { return e.err }

// once returns err marked as onceError, or nil.
func once(err error) error {
	if err == nil {
		return nil
	}
	return onceError{err}
}

// isTransient reports whether err, from a call to etcd, may heal by itself:
// a leader change or none, a request that timed out on the server or that
// one attempt gave up on (context.DeadlineExceeded: the caller, who knows
// whether its own ctx ended, decides), too many requests, a member that
// stopped, a connection that was refused, reset or closed (gRPC
// Unavailable), a keep-alive answered by a former leader. Authentication
// and permission errors, invalid arguments, a full database, a lease or
// key that is gone are not.
func isTransient(err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, errUnconfirmed), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EPIPE):
		return true
	case errors.Is(err, rpctypes.ErrTooManyRequests), errors.Is(err, rpctypes.ErrGRPCRequestTooManyRequests),
		errors.Is(err, rpctypes.ErrNotLeader), errors.Is(err, rpctypes.ErrGRPCNotLeader):
		return true
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code() == codes.Unavailable
	}
	if s, ok := status.FromError(err); ok {
		switch s.Code() {
		case codes.Unavailable, codes.DeadlineExceeded:
			return true
		case codes.Unknown:
			// The member gave up when the deadline the request carried
			// (one attempt's bound) passed, while it waited for a leader
			// or for its proposal to be applied: etcd answers with
			// the context's error as an unknown one.
			return s.Message() == context.DeadlineExceeded.Error()
		}
	}
	return false
}

// markTransient returns err marked with driver.Transient when it may heal
// (see isTransient) and caller, the ctx of the call's caller, is alive:
// an error that came with the end of the caller's own ctx is the caller's.
func markTransient(caller context.Context, err error) error {
	if err == nil || !isTransient(err) || (caller != nil && ctxend.Err(caller) != nil) {
		return err
	}
	return driver.Transient(err)
}
