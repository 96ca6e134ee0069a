package etcdlock

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"sync"
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
// timeout), so that a call that hangs on one member (a frozen process, a
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

// attempts bounds the calls of one Backend to the store: each is one
// attempt of base (see attemptFor) while the store answers within it. An
// attempt cut short by its bound is sent again (to the next member), and
// the member may well run the first copy too: on a member that is slow
// rather than frozen, a crowd of callers whose every attempt times out
// would send each call again and again and multiply the load that made it
// slow. So a call repeated after a timeout doubles its bound for the next
// try, and a try that succeeded after more than base raises the bound of
// every call for the next slowFor to twice what it took; both up to most,
// twice base, so that a call that hangs on a frozen member still leaves
// time for other tries. A frozen member among healthy ones answers
// nothing, so it raises no bound: the next try, on another member, is
// answered at once.
type attempts struct {
	base, most time.Duration
	mu         sync.Mutex
	raised     time.Duration // the bound until until, when above base
	until      time.Time
}

// slowFor is how long a slow answer raises the bound of every call.
const slowFor = 10 * time.Second

// newAttempts returns the bounds of a Backend of call timeout timeout.
func newAttempts(timeout time.Duration) *attempts {
	a := &attempts{base: attemptFor(timeout)}
	if timeout <= 0 {
		timeout = defaultTimeout
	}
	a.most = max(a.base, min(2*a.base, timeout/2))
	return a
}

// bound is the bound of a call's first try (0: none).
func (a *attempts) bound() time.Duration {
	if a == nil {
		return 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if time.Now().Before(a.until) {
		return max(a.base, a.raised)
	}
	return a.base
}

// runFor is one call f, bounded by d, whose time it takes is counted (see
// attempts).
func (a *attempts) runFor(ctx context.Context, d time.Duration, f func(context.Context) error) error {
	if a == nil || d <= 0 {
		return f(ctx)
	}
	start := time.Now()
	err := attempt(ctx, d, f)
	if took := time.Since(start); err == nil && took > a.base {
		now := time.Now()
		a.mu.Lock()
		if now.After(a.until) {
			a.raised = 0
		}
		a.raised, a.until = min(a.most, max(a.raised, 2*took)), now.Add(slowFor)
		a.mu.Unlock()
	}
	return err
}

// run is one call f, bounded by the current bound.
func (a *attempts) run(ctx context.Context, f func(context.Context) error) error {
	return a.runFor(ctx, a.bound(), f)
}

// repeat is repeat of one call f, each try bounded by the current bound,
// doubled after each try that it cut short.
func (a *attempts) repeat(ctx context.Context, f func(context.Context) error) error {
	d := a.bound()
	return repeat(ctx, func(ctx context.Context) error {
		err := a.runFor(ctx, d, f)
		if a != nil && errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			d = min(a.most, 2*d)
		}
		return err
	})
}

// attempt runs one call f with ctx bounded by d (by ctx alone when d is 0).
func attempt(ctx context.Context, d time.Duration, f func(context.Context) error) error {
	if d <= 0 {
		return f(ctx)
	}
	actx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return f(actx)
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
	if err == nil || !isTransient(err) || ctxend.Err(caller) != nil {
		return err
	}
	return driver.Transient(err)
}
