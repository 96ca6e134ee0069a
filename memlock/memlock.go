// Package memlock is an in-process dlock backend: the same semantics as the
// networked stores (owner tokens, fences, hold counts, expiry by the store's
// clock, release notifications, shared holds for read-write locks and
// semaphores, fair queues and writer intents), kept in a map. Use it in your
// own unit tests and examples, or to lock between goroutines of one process.
// It is the reference implementation of the driver contract.
//
// A ManualClock makes expiry testable without sleeping, and SetUnavailable
// makes the store fail on demand, to test how your code reacts to a lost
// lease.
package memlock

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/dlock-go/dlock/driver"
)

var (
	_ driver.Backend       = (*Backend)(nil)
	_ driver.Notifier      = (*Backend)(nil)
	_ driver.BatchRenewer  = (*Backend)(nil)
	_ driver.Inspector     = (*Backend)(nil)
	_ driver.Capabler      = (*Backend)(nil)
	_ driver.Withdrawer    = (*Backend)(nil)
	_ driver.MultiAcquirer = (*Backend)(nil)
)

// Clock tells the store's time. The store's clock decides expiry.
type Clock interface {
	Now() time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Option configures a Backend.
type Option interface{ apply(*Backend) }

type optionFunc func(*Backend)

func (f optionFunc) apply(b *Backend) { f(b) }

// WithClock sets the store's clock. With a *ManualClock, Advance also wakes
// waiters, as the expiry of a lock would. The default is the system clock.
func WithClock(c Clock) Option { return optionFunc(func(b *Backend) { b.clock = c }) }

// Backend is an in-process lock store. The zero value is not usable; call New.
type Backend struct {
	clock Clock

	mu        sync.Mutex
	locks     map[string]*lockState
	fences    map[string]uint64 // kept after release, like the networked stores
	down      error
	listeners map[*listener]struct{}
	calls     int // calls since the last sweep of lapsed states
}

// New returns an empty store.
func New(opts ...Option) *Backend {
	b := &Backend{
		clock:     systemClock{},
		locks:     make(map[string]*lockState),
		fences:    make(map[string]uint64),
		listeners: make(map[*listener]struct{}),
	}
	for _, o := range opts {
		o.apply(b)
	}
	if mc, ok := b.clock.(*ManualClock); ok {
		mc.onAdvance(b)
	}
	return b
}

// SetUnavailable makes every call fail with err until it is called again
// with nil, to test code against a store outage. Locks are kept meanwhile
// and expire by the store's clock as usual.
func (b *Backend) SetUnavailable(err error) {
	b.mu.Lock()
	b.down = err
	b.mu.Unlock()
}

// Supports implements driver.Capabler: memlock has read-write locks,
// semaphores, fair locks and lock-delay, and reports grants that overtook a
// queue.
func (b *Backend) Supports(c driver.Capability) bool {
	switch c {
	case driver.CapShared, driver.CapSemaphore, driver.CapFair, driver.CapOvertook, driver.CapLockDelay:
		return true
	}
	return false
}

// state returns the state of key with what lapsed by now pruned, or nil
// when nothing of it is live. The caller holds b.mu.
func (b *Backend) state(key string, now time.Time) *lockState {
	b.sweep(now)
	st := b.locks[key]
	if st == nil {
		return nil
	}
	st.prune(now)
	if st.empty() {
		delete(b.locks, key)
		return nil
	}
	return st
}

// stateFor returns the state of key, made when there is none. The caller
// holds b.mu and has called state.
func (b *Backend) stateFor(key string) *lockState {
	st := b.locks[key]
	if st == nil {
		st = newState()
		b.locks[key] = st
	}
	return st
}

// tidy drops the state of key when nothing of it is left. The caller holds
// b.mu.
func (b *Backend) tidy(key string, st *lockState) {
	if st.empty() && b.locks[key] == st {
		delete(b.locks, key)
	}
}

// sweep drops every lapsed state now and then, so that keys nobody touches
// again do not stay in memory: the cost is amortised over the calls made
// since the last sweep. The caller holds b.mu.
func (b *Backend) sweep(now time.Time) {
	if b.calls++; b.calls < 64 || b.calls < len(b.locks) {
		return
	}
	b.calls = 0
	for key, st := range b.locks {
		st.prune(now)
		if st.empty() {
			delete(b.locks, key)
		}
	}
}

// check returns the error of a call made with ctx that cannot be served:
// ctx ended, or the store was made unavailable. It names the store alone
// ("memory: err"): the caller names the operation and the lock.
func (b *Backend) check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory: %w", err)
	}
	if b.down != nil {
		return fmt.Errorf("memory: %w", b.down)
	}
	return nil
}

// grantFence draws the next fence of key. The caller holds b.mu.
func (b *Backend) grantFence(key string) uint64 {
	b.fences[key]++
	return b.fences[key]
}

// Acquire implements driver.Backend.
func (b *Backend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return driver.AcquireResult{}, err
	}
	now := b.clock.Now()
	st := b.state(req.Key, now)
	if req.Mode == driver.Shared {
		return b.acquireShared(req, st, now), nil
	}
	if req.Mode != driver.Exclusive {
		return driver.AcquireResult{}, fmt.Errorf("memory: unknown mode %v", req.Mode)
	}
	return b.acquireExclusive(req, st, now), nil
}

func (b *Backend) acquireExclusive(req driver.AcquireRequest, st *lockState, now time.Time) driver.AcquireResult {
	var res driver.AcquireResult
	blocked, bySharedHolds := false, false
	if st != nil {
		res.Shared = len(st.shared)
		switch e := st.excl; {
		case e != nil:
			// A re-entry is no new grant: the queue does not hold it back.
			if n, ok := e.holds[req.Token]; ok && req.Reentrant && !e.expired(now) {
				e.holds[req.Token] = n + 1
				e.expires = later(e.expires, now.Add(req.TTL))
				st.leave(req.Token)
				return driver.AcquireResult{Acquired: true, Fence: e.fence, Holds: n + 1}
			}
			blocked = true
			res.Holder, res.HolderTTL = e.owner, e.ttl(now)
		case len(st.shared) > 0:
			blocked, bySharedHolds = true, true
			hs := st.sharedByExpiry()
			last := hs[len(hs)-1]
			res.Holder, res.HolderTTL = last.owner, last.expires.Sub(now)
		}
		if req.Fair && st.othersAhead(req.Token) {
			blocked = true
		}
	}
	if !blocked {
		overtook := !req.Fair && st != nil && st.othersAhead(req.Token)
		st = b.stateFor(req.Key)
		f := b.grantFence(req.Key)
		st.excl = &entry{
			holds:    map[string]int{req.Token: 1},
			acquired: now,
			owner:    req.Owner,
			fence:    f,
			expires:  now.Add(req.TTL),
			delay:    max(req.LockDelay, 0),
		}
		st.leave(req.Token)
		return driver.AcquireResult{Acquired: true, Fence: f, Holds: 1, Overtook: overtook}
	}
	if !req.Wait || req.QueueTTL <= 0 {
		return res
	}
	expires := now.Add(req.QueueTTL)
	if in := st.intent; in != nil && in.token == req.Token {
		in.owner, in.expires = req.Owner, later(in.expires, expires)
	} else if in == nil && bySharedHolds {
		st.intent = &waiter{token: req.Token, owner: req.Owner, expires: expires}
	}
	if req.Fair {
		st.enqueue(req.Token, req.Owner, expires)
		res.Position = st.position(req.Token)
	}
	res.Queued = st.position(req.Token) > 0 || (st.intent != nil && st.intent.token == req.Token)
	return res
}

func (b *Backend) acquireShared(req driver.AcquireRequest, st *lockState, now time.Time) driver.AcquireResult {
	var res driver.AcquireResult
	if st != nil {
		res.Shared = len(st.shared)
		if h := st.shared[req.Token]; h != nil {
			// A token holds once: its own hold refuses it, as an exclusive
			// holder refuses a request without Reentrant.
			res.Holder, res.HolderTTL = h.owner, h.expires.Sub(now)
			return res
		}
		if len(st.shared) > 0 && st.limit != max(req.Limit, 0) {
			// The live holds bind the name's kind and limit.
			last := st.sharedByExpiry()[len(st.shared)-1]
			res.Holder, res.HolderTTL = last.owner, last.expires.Sub(now)
			res.Conflict, res.HeldLimit = true, st.limit
			return res
		}
		if e := st.excl; e != nil {
			res.Holder, res.HolderTTL = e.owner, e.ttl(now)
			return res
		}
		if in := st.intent; in != nil && in.token != req.Token {
			res.Holder, res.HolderTTL, res.WriterWaiting = in.owner, in.expires.Sub(now), true
			return res
		}
		if req.Limit > 0 && len(st.shared) >= req.Limit {
			first := st.sharedByExpiry()[0]
			res.Holder, res.HolderTTL = first.owner, first.expires.Sub(now)
			return res
		}
	}
	st = b.stateFor(req.Key)
	f := b.grantFence(req.Key)
	st.shared[req.Token] = &sharedHold{owner: req.Owner, fence: f, acquired: now, expires: now.Add(req.TTL)}
	st.limit = max(req.Limit, 0)
	st.leave(req.Token)
	return driver.AcquireResult{Acquired: true, Fence: f, Holds: 1}
}

// Renew implements driver.Backend.
func (b *Backend) Renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return false, err
	}
	return b.renew(key, token, 0, ttl), nil
}

// RenewGrant implements driver.GrantRenewer: Renew, for the grant of fence
// only.
func (b *Backend) RenewGrant(ctx context.Context, key, token string, fence uint64, ttl time.Duration) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return false, err
	}
	return b.renew(key, token, fence, ttl), nil
}

// renew renews token's hold on key; fence, when not 0, is the fence the
// exclusive grant must have.
func (b *Backend) renew(key, token string, fence uint64, ttl time.Duration) bool {
	now := b.clock.Now()
	st := b.state(key, now)
	if st == nil {
		return false
	}
	if e := st.excl; e != nil {
		if _, ok := e.holds[token]; ok {
			if e.expired(now) || (fence != 0 && e.fence != fence) {
				return false
			}
			e.expires = later(e.expires, now.Add(ttl))
			return true
		}
	}
	if h := st.shared[token]; h != nil {
		h.expires = later(h.expires, now.Add(ttl))
		return true
	}
	return false
}

// RenewBatch implements driver.BatchRenewer.
func (b *Backend) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) []driver.RenewResult {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]driver.RenewResult, len(reqs))
	for i, r := range reqs {
		if err := b.check(ctx); err != nil {
			out[i].Err = err
			continue
		}
		out[i].Held = b.renew(r.Key, r.Token, r.Fence, r.TTL)
	}
	return out
}

// Release implements driver.Backend.
func (b *Backend) Release(ctx context.Context, key, token string) (driver.ReleaseResult, error) {
	return b.release(ctx, key, token, 0)
}

// ReleaseGrant implements driver.GrantReleaser: Release, except that an
// exclusive hold of token whose grant's fence is not fence is left alone.
func (b *Backend) ReleaseGrant(ctx context.Context, key, token string, fence uint64) (driver.ReleaseResult, error) {
	return b.release(ctx, key, token, fence)
}

// ReleaseAcquire implements driver.ReleaseAcquirer: the release (tied to
// fence when it is not 0), then the acquire, as two calls would make them.
func (b *Backend) ReleaseAcquire(ctx context.Context, key, token string, fence uint64, next driver.AcquireRequest) (driver.ReleaseAcquireResult, error) {
	var out driver.ReleaseAcquireResult
	var err error
	out.Release, err = b.release(ctx, key, token, fence)
	if err != nil {
		out.AcquireErr = err
		return out, err
	}
	out.Acquire, out.AcquireErr = b.Acquire(ctx, next)
	return out, nil
}

// release drops one hold of token; fence, when not 0, is the fence the
// exclusive grant must have.
func (b *Backend) release(ctx context.Context, key, token string, fence uint64) (driver.ReleaseResult, error) {
	b.mu.Lock()
	if err := b.check(ctx); err != nil {
		b.mu.Unlock()
		return driver.ReleaseResult{}, err
	}
	now := b.clock.Now()
	st := b.state(key, now)
	if st == nil {
		b.mu.Unlock()
		return driver.ReleaseResult{}, nil
	}
	var res driver.ReleaseResult
	// A removed intent or a released shared hold may let readers and
	// permit holders in: those are announced to everyone (next "").
	hadIntent := st.intent != nil && st.intent.token == token
	wake := st.leave(token)
	everyone := hadIntent
	if e := st.excl; e != nil {
		if n, ok := e.holds[token]; ok && (fence == 0 || e.fence == fence) {
			res.Held = true
			if e.expired(now) {
				// The lease expired and the lock sits in its lock-delay: the
				// late holder is done with it, so the delay has no more
				// reason to run.
				n, res.Held = 1, false
			}
			if n > 1 {
				e.holds[token] = n - 1
				res.Remaining = n - 1
			} else {
				st.excl = nil
				wake = true
			}
		}
	} else if h := st.shared[token]; h != nil {
		delete(st.shared, token)
		res.Held, wake, everyone = true, true, true
	}
	next := ""
	if !everyone {
		next = st.next()
	}
	b.tidy(key, st)
	var fns []func(key, next string)
	if wake {
		fns = b.subscribers(key)
	}
	b.mu.Unlock()
	for _, fn := range fns {
		fn(key, next)
	}
	return res, nil
}

// Withdraw implements driver.Withdrawer: it removes token's queue entry and
// writer intent, and wakes waiters when that lets another in.
func (b *Backend) Withdraw(ctx context.Context, key, token string) error {
	b.mu.Lock()
	if err := b.check(ctx); err != nil {
		b.mu.Unlock()
		return err
	}
	st := b.state(key, b.clock.Now())
	if st == nil {
		b.mu.Unlock()
		return nil
	}
	hadIntent := st.intent != nil && st.intent.token == token
	wake := st.leave(token)
	next := ""
	if !hadIntent {
		next = st.next()
	}
	b.tidy(key, st)
	var fns []func(key, next string)
	if wake {
		fns = b.subscribers(key)
	}
	b.mu.Unlock()
	for _, fn := range fns {
		fn(key, next)
	}
	return nil
}

// AcquireAll implements driver.MultiAcquirer: every key is granted, under
// the store's one mutex, or none.
func (b *Backend) AcquireAll(ctx context.Context, reqs []driver.AcquireRequest) ([]driver.AcquireResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(reqs) == 0 {
		return nil, nil
	}
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	now := b.clock.Now()
	out := make([]driver.AcquireResult, len(reqs))
	for i, req := range reqs {
		if req.Mode != driver.Exclusive || req.Reentrant || req.Fair || req.Wait || req.LockDelay > 0 {
			return nil, fmt.Errorf("memory: %w: AcquireAll takes plain exclusive requests (%q)", driver.ErrInvalid, req.Key)
		}
		st := b.state(req.Key, now)
		if st == nil {
			continue
		}
		switch {
		case st.excl != nil:
			out[i] = driver.AcquireResult{Holder: st.excl.owner, HolderTTL: st.excl.ttl(now), Shared: len(st.shared)}
			return out, nil
		case len(st.shared) > 0:
			hs := st.sharedByExpiry()
			last := hs[len(hs)-1]
			out[i] = driver.AcquireResult{Holder: last.owner, HolderTTL: last.expires.Sub(now), Shared: len(hs)}
			return out, nil
		}
	}
	for i, req := range reqs {
		out[i] = b.acquireExclusive(req, b.state(req.Key, now), now)
	}
	return out, nil
}
