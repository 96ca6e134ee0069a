package chaos

import (
	"context"
	"errors"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// ObserveOption configures Observe.
type ObserveOption func(*observed)

// WithStoreClockRate makes the store's clock run rate times as fast as the
// client's, as far as lock expiry goes: every time to live the store is
// sent (acquire and renew) is divided by rate, so a rate of 1.05 lets the
// store expire a lease 5% early by the client's clock. It injects clock
// skew between a client and its stores, for example to check that Redlock's
// drift allowance covers it. rate must be positive; 1 (the default) changes
// nothing.
func WithStoreClockRate(rate float64) ObserveOption {
	return func(o *observed) {
		if rate > 0 {
			o.rate = rate
		}
	}
}

// Observe wraps a backend so that every call the client makes to the store,
// renewals made in the background included, is recorded in sink as a store
// event of client (with the store's key, prefix included, as its Name). A
// successful store acquire or renewal carries the local deadline it gives
// the lease (Deadline), so that Check can extend a lease's window by the
// renewals made in the background. The result has the inner backend's
// notifications and batch renewal only when the inner backend has them,
// forwards its capabilities, lock delay and drift (none, when it lacks
// them), Inspector, the releases and renewals tied to a grant
// (GrantReleaser, GrantRenewer; untied when it lacks them), and the
// release that carries an acquire (ReleaseAcquirer; the two calls one
// after the other when it lacks it).
func Observe(b driver.Backend, sink Sink, client string, opts ...ObserveOption) driver.Backend {
	o := &observed{inner: b, sink: sink, client: client, rate: 1}
	for _, opt := range opts {
		opt(o)
	}
	if d, ok := b.(driver.Drifter); ok {
		o.drift = d.Drift
	}
	_, notifies := b.(driver.Notifier)
	_, batches := b.(driver.BatchRenewer)
	switch {
	case notifies && batches:
		return observedBoth{observedBatch{o}}
	case notifies:
		return observedNotifier{o}
	case batches:
		return observedBatch{o}
	}
	return o
}

type observed struct {
	inner  driver.Backend
	sink   Sink
	client string
	rate   float64
	drift  func(time.Duration) time.Duration // the inner backend's, or nil
}

var (
	_ driver.Backend         = (*observed)(nil)
	_ driver.Capabler        = (*observed)(nil)
	_ driver.Drifter         = (*observed)(nil)
	_ driver.Inspector       = (*observed)(nil)
	_ driver.GrantRenewer    = (*observed)(nil)
	_ driver.GrantReleaser   = (*observed)(nil)
	_ driver.ReleaseAcquirer = (*observed)(nil)
	_ driver.Notifier        = observedNotifier{}
	_ driver.BatchRenewer    = observedBatch{}
	_ driver.Notifier        = observedBoth{}
	_ driver.BatchRenewer    = observedBoth{}
)

// deadline is the local deadline the client gives a grant or renewal of
// ttl sent at start: start + ttl − drift (its own clock; the store's clock
// rate does not enter into it).
func (o *observed) deadline(start int64, ttl time.Duration) int64 {
	if o.drift != nil {
		ttl -= o.drift(ttl)
	}
	return start + int64(ttl)
}

func (o *observed) ttl(d time.Duration) time.Duration {
	if o.rate == 1 {
		return d
	}
	return max(time.Duration(float64(d)/o.rate), time.Millisecond)
}

func outcome(ok bool, err error) Outcome {
	switch {
	case err != nil:
		return Unknown
	case ok:
		return OK
	}
	return Failed
}

func (o *observed) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	start := Now()
	ttl := req.TTL
	req.TTL = o.ttl(req.TTL)
	res, err := o.inner.Acquire(ctx, req)
	req.TTL = ttl
	o.acquired(req, start, Now(), res, err)
	return res, err
}

// acquired records the acquire req (with the client's TTL), sent at start
// and answered at end.
func (o *observed) acquired(req driver.AcquireRequest, start, end int64, res driver.AcquireResult, err error) {
	e := Event{Kind: KindStoreAcquire, Client: o.client, Name: req.Key, Token: req.Token, Limit: req.Limit,
		Start: start, End: end, Outcome: outcome(res.Acquired, err), Err: errText(err), Fence: res.Fence}
	if e.Outcome == OK {
		e.Deadline = o.deadline(start, req.TTL)
	}
	if req.Mode == driver.Shared {
		e.Mode = Shared
		if req.Limit > 0 {
			e.Mode = Permit
		}
	}
	o.sink.Add(e)
}

func (o *observed) Renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	start := Now()
	held, err := o.inner.Renew(ctx, key, token, o.ttl(ttl))
	o.renewed(key, token, ttl, start, Now(), held, err)
	return held, err
}

// renewed records one renewal; a successful one with the deadline the
// client gives the lease.
func (o *observed) renewed(key, token string, ttl time.Duration, start, end int64, held bool, err error) {
	e := Event{Kind: KindStoreRenew, Client: o.client, Name: key, Token: token, Start: start, End: end, Outcome: outcome(held, err), Err: errText(err)}
	if e.Outcome == OK {
		e.Deadline = o.deadline(start, ttl)
	}
	o.sink.Add(e)
}

// observedBatch is an observed backend whose inner backend renews in
// batches.
type observedBatch struct{ *observed }

func (o observedBatch) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) []driver.RenewResult {
	start := Now()
	_, tied := o.inner.(driver.GrantRenewer)
	scaled := make([]driver.RenewRequest, len(reqs))
	for i, r := range reqs {
		scaled[i] = r
		scaled[i].TTL = o.ttl(r.TTL)
		if !tied {
			scaled[i].Fence = 0 // not the inner backend's to honour
		}
	}
	out := o.inner.(driver.BatchRenewer).RenewBatch(ctx, scaled)
	end := Now()
	for i, r := range reqs {
		var res driver.RenewResult
		if i < len(out) {
			res = out[i]
		} else {
			res.Err = errors.New("chaos: batch renewal returned too few results")
		}
		o.renewed(r.Key, r.Token, r.TTL, start, end, res.Held, res.Err)
	}
	return out
}

func (o *observed) Release(ctx context.Context, key, token string) (driver.ReleaseResult, error) {
	start := Now()
	res, err := o.inner.Release(ctx, key, token)
	o.sink.Add(Event{Kind: KindStoreRelease, Client: o.client, Name: key, Token: token, Start: start, End: Now(), Outcome: outcome(res.Held, err), Err: errText(err)})
	return res, err
}

// ReleaseGrant forwards driver.GrantReleaser, recorded as a release; for
// an inner backend without it, it is Release (what the client sends such a
// backend).
func (o *observed) ReleaseGrant(ctx context.Context, key, token string, fence uint64) (driver.ReleaseResult, error) {
	gr, ok := o.inner.(driver.GrantReleaser)
	if !ok {
		return o.Release(ctx, key, token)
	}
	start := Now()
	res, err := gr.ReleaseGrant(ctx, key, token, fence)
	o.sink.Add(Event{Kind: KindStoreRelease, Client: o.client, Name: key, Token: token, Start: start, End: Now(), Outcome: outcome(res.Held, err), Err: errText(err)})
	return res, err
}

// ReleasePlace forwards driver.PlaceReleaser, recorded as a release; for
// an inner backend without it, it is Release.
func (o *observed) ReleasePlace(ctx context.Context, key, token string) (driver.ReleaseResult, error) {
	pr, ok := o.inner.(driver.PlaceReleaser)
	if !ok {
		return o.Release(ctx, key, token)
	}
	start := Now()
	res, err := pr.ReleasePlace(ctx, key, token)
	o.sink.Add(Event{Kind: KindStoreRelease, Client: o.client, Name: key, Token: token, Start: start, End: Now(), Outcome: outcome(res.Held, err), Err: errText(err)})
	return res, err
}

// RenewGrant forwards driver.GrantRenewer, recorded as a renewal; for an
// inner backend without it, it is Renew.
func (o *observed) RenewGrant(ctx context.Context, key, token string, fence uint64, ttl time.Duration) (bool, error) {
	gr, ok := o.inner.(driver.GrantRenewer)
	if !ok {
		return o.Renew(ctx, key, token, ttl)
	}
	start := Now()
	held, err := gr.RenewGrant(ctx, key, token, fence, o.ttl(ttl))
	o.renewed(key, token, ttl, start, Now(), held, err)
	return held, err
}

// Supports forwards driver.Capabler; a backend without it supports nothing.
func (o *observed) Supports(c driver.Capability) bool {
	cb, ok := o.inner.(driver.Capabler)
	return ok && cb.Supports(c)
}

// Drift forwards driver.Drifter; 0 for a backend without it.
func (o *observed) Drift(ttl time.Duration) time.Duration {
	if d, ok := o.inner.(driver.Drifter); ok {
		return d.Drift(ttl)
	}
	return 0
}

var errNoInspector = errors.New("chaos: the observed backend cannot list its locks")

// Inspect forwards driver.Inspector.
func (o *observed) Inspect(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	if in, ok := o.inner.(driver.Inspector); ok {
		return in.Inspect(ctx, key)
	}
	return driver.LockInfo{}, false, errNoInspector
}

// List forwards driver.Inspector.
func (o *observed) List(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	if in, ok := o.inner.(driver.Inspector); ok {
		return in.List(ctx, prefix)
	}
	return nil, errNoInspector
}

// ForceRelease forwards driver.Inspector.
func (o *observed) ForceRelease(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	if in, ok := o.inner.(driver.Inspector); ok {
		return in.ForceRelease(ctx, key)
	}
	return driver.LockInfo{}, false, errNoInspector
}

// Withdraw forwards driver.Withdrawer, recorded as a store withdrawal.
func (o *observed) Withdraw(ctx context.Context, key, token string) error {
	w, ok := o.inner.(driver.Withdrawer)
	if !ok {
		return driver.ErrUnsupported
	}
	start := Now()
	err := w.Withdraw(ctx, key, token)
	o.sink.Add(Event{Kind: KindStoreWithdraw, Client: o.client, Name: key, Token: token, Start: start, End: Now(), Outcome: outcome(true, err), Err: errText(err)})
	return err
}

// MoveIntent forwards driver.IntentMover, unrecorded (a move changes no
// hold or queue entry that the checks read), so that the waits of a
// recorded Client move their writer intents as they would without the
// recorder.
func (o *observed) MoveIntent(ctx context.Context, key, from, to, owner string, ttl time.Duration) (bool, error) {
	if mv, ok := o.inner.(driver.IntentMover); ok {
		return mv.MoveIntent(ctx, key, from, to, owner, ttl)
	}
	return false, driver.ErrUnsupported
}

// ReleaseAcquire forwards driver.ReleaseAcquirer, recorded as a release
// and an acquire that end together; for an inner backend without it, it
// is the release (tied to fence when not 0) and then the acquire, each
// recorded as its own call, which is what the interface promises.
func (o *observed) ReleaseAcquire(ctx context.Context, key, token string, fence uint64, next driver.AcquireRequest) (driver.ReleaseAcquireResult, error) {
	ra, ok := o.inner.(driver.ReleaseAcquirer)
	if !ok {
		var out driver.ReleaseAcquireResult
		var err error
		if fence > 0 {
			out.Release, err = o.ReleaseGrant(ctx, key, token, fence)
		} else {
			out.Release, err = o.Release(ctx, key, token)
		}
		if err != nil {
			out.AcquireErr = err
			return out, err
		}
		out.Acquire, out.AcquireErr = o.Acquire(ctx, next)
		return out, nil
	}
	start := Now()
	ttl := next.TTL
	next.TTL = o.ttl(next.TTL)
	out, err := ra.ReleaseAcquire(ctx, key, token, fence, next)
	end := Now()
	o.sink.Add(Event{Kind: KindStoreRelease, Client: o.client, Name: key, Token: token, Start: start, End: end, Outcome: outcome(out.Release.Held, err), Err: errText(err)})
	next.TTL = ttl
	o.acquired(next, start, end, out.Acquire, out.AcquireErr)
	return out, err
}

// observedNotifier is an observed backend whose inner backend notifies.
type observedNotifier struct{ *observed }

func (o observedNotifier) Listen(ctx context.Context, fn func(key, next string)) (driver.Listener, error) {
	return o.inner.(driver.Notifier).Listen(ctx, fn)
}

// observedBoth is an observed backend whose inner backend notifies and
// renews in batches.
type observedBoth struct{ observedBatch }

func (o observedBoth) Listen(ctx context.Context, fn func(key, next string)) (driver.Listener, error) {
	return o.inner.(driver.Notifier).Listen(ctx, fn)
}
