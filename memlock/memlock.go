// Package memlock is an in-process dlock backend: the same semantics as the
// networked stores (owner tokens, fences, hold counts, expiry by the store's
// clock, release notifications), kept in a map. Use it in your own unit tests
// and examples, or to lock between goroutines of one process.
//
// A ManualClock makes expiry testable without sleeping, and SetUnavailable
// makes the store fail on demand, to test how your code reacts to a lost
// lease.
package memlock

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock/driver"
)

var (
	_ driver.Backend      = (*Backend)(nil)
	_ driver.Notifier     = (*Backend)(nil)
	_ driver.BatchRenewer = (*Backend)(nil)
	_ driver.Inspector    = (*Backend)(nil)
	_ driver.LockDelayer  = (*Backend)(nil)
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
	locks     map[string]*entry
	fences    map[string]uint64 // kept after release, like the networked stores
	down      error
	listeners map[*listener]struct{}
}

type entry struct {
	holds    map[string]int // token → hold count
	acquired time.Time
	owner    string
	fence    uint64
	expires  time.Time     // when the lease expires
	delay    time.Duration // lock-delay: the entry outlives expires by this much
}

// expired reports whether the lease has expired; the entry then only keeps
// others out until its lock-delay ends.
func (e *entry) expired(now time.Time) bool { return !now.Before(e.expires) }

// free is when the lock becomes free if nobody renews or releases it.
func (e *entry) free() time.Time { return e.expires.Add(e.delay) }

// New returns an empty store.
func New(opts ...Option) *Backend {
	b := &Backend{
		clock:     systemClock{},
		locks:     make(map[string]*entry),
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

// SupportsLockDelay reports true: memlock honours dlock.WithLockDelay.
func (b *Backend) SupportsLockDelay() bool { return true }

// live returns the entry of key while it keeps the lock (held, or expired
// and in its lock-delay), dropping one that no longer does. The caller holds
// b.mu.
func (b *Backend) live(key string) *entry {
	e := b.locks[key]
	if e != nil && !b.clock.Now().Before(e.free()) {
		delete(b.locks, key)
		return nil
	}
	return e
}

func (b *Backend) check(ctx context.Context, op, key string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memlock: %s %q: %w", op, key, err)
	}
	if b.down != nil {
		return fmt.Errorf("memlock: %s %q: %w", op, key, b.down)
	}
	return nil
}

// Acquire implements driver.Backend.
func (b *Backend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx, "acquire", req.Key); err != nil {
		return driver.AcquireResult{}, err
	}
	now := b.clock.Now()
	if e := b.live(req.Key); e != nil {
		if e.expired(now) {
			return driver.AcquireResult{Holder: e.owner, HolderTTL: e.free().Sub(now)}, nil
		}
		if n, ok := e.holds[req.Token]; ok && req.Reentrant {
			e.holds[req.Token] = n + 1
			e.expires = later(e.expires, now.Add(req.TTL))
			return driver.AcquireResult{Acquired: true, Fence: e.fence, Holds: n + 1}, nil
		}
		return driver.AcquireResult{Holder: e.owner, HolderTTL: e.expires.Sub(now)}, nil
	}
	b.fences[req.Key]++
	f := b.fences[req.Key]
	b.locks[req.Key] = &entry{
		holds:    map[string]int{req.Token: 1},
		acquired: now,
		owner:    req.Owner,
		fence:    f,
		expires:  now.Add(req.TTL),
		delay:    max(req.LockDelay, 0),
	}
	return driver.AcquireResult{Acquired: true, Fence: f, Holds: 1}, nil
}

// Renew implements driver.Backend.
func (b *Backend) Renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx, "renew", key); err != nil {
		return false, err
	}
	return b.renew(key, token, ttl), nil
}

func (b *Backend) renew(key, token string, ttl time.Duration) bool {
	e := b.live(key)
	if e == nil || e.expired(b.clock.Now()) {
		return false
	}
	if _, ok := e.holds[token]; !ok {
		return false
	}
	e.expires = later(e.expires, b.clock.Now().Add(ttl))
	return true
}

// later returns the later of a and b: renewals extend, never shorten.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// RenewBatch implements driver.BatchRenewer.
func (b *Backend) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) []driver.RenewResult {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]driver.RenewResult, len(reqs))
	for i, r := range reqs {
		if err := b.check(ctx, "renew", r.Key); err != nil {
			out[i].Err = err
			continue
		}
		out[i].Held = b.renew(r.Key, r.Token, r.TTL)
	}
	return out
}

// Release implements driver.Backend.
func (b *Backend) Release(ctx context.Context, key, token string) (driver.ReleaseResult, error) {
	b.mu.Lock()
	if err := b.check(ctx, "release", key); err != nil {
		b.mu.Unlock()
		return driver.ReleaseResult{}, err
	}
	e := b.live(key)
	if e == nil {
		b.mu.Unlock()
		return driver.ReleaseResult{}, nil
	}
	n, ok := e.holds[token]
	if !ok {
		b.mu.Unlock()
		return driver.ReleaseResult{}, nil
	}
	held := true
	if e.expired(b.clock.Now()) {
		// The lease expired and the lock sits in its lock-delay: the late
		// holder is done with it, so the delay has no more reason to run.
		n, held = 1, false
	}
	if n > 1 {
		e.holds[token] = n - 1
		b.mu.Unlock()
		return driver.ReleaseResult{Held: true, Remaining: n - 1}, nil
	}
	delete(b.locks, key)
	fns := b.subscribers(key)
	b.mu.Unlock()
	for _, fn := range fns {
		fn(key, "")
	}
	return driver.ReleaseResult{Held: held}, nil
}

// Inspect implements driver.Inspector.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx, "inspect", key); err != nil {
		return driver.LockInfo{}, false, err
	}
	e := b.live(key)
	if e == nil {
		return driver.LockInfo{}, false, nil
	}
	return b.info(key, e), true, nil
}

func (b *Backend) info(key string, e *entry) driver.LockInfo {
	holds := 0
	for _, n := range e.holds {
		holds += n
	}
	now := b.clock.Now()
	info := driver.LockInfo{Key: key, Owner: e.owner, Fence: e.fence, Holds: holds,
		TTL: e.expires.Sub(now), HeldFor: now.Sub(e.acquired)}
	if e.expired(now) {
		info.Delayed, info.TTL = true, e.free().Sub(now)
	}
	return info
}

// List implements driver.Inspector.
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx, "list", prefix); err != nil {
		return nil, err
	}
	var out []driver.LockInfo
	for key := range b.locks {
		if e := b.live(key); e != nil && strings.HasPrefix(key, prefix) {
			out = append(out, b.info(key, e))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// ForceRelease implements driver.Inspector.
func (b *Backend) ForceRelease(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	b.mu.Lock()
	if err := b.check(ctx, "force release", key); err != nil {
		b.mu.Unlock()
		return driver.LockInfo{}, false, err
	}
	e := b.live(key)
	if e == nil {
		b.mu.Unlock()
		return driver.LockInfo{}, false, nil
	}
	info := b.info(key, e)
	delete(b.locks, key)
	fns := b.subscribers(key)
	b.mu.Unlock()
	for _, fn := range fns {
		fn(key, "")
	}
	return info, true, nil
}

// subscribers returns the callbacks of listeners subscribed to key, or of
// every listener when key is "". The caller holds b.mu.
func (b *Backend) subscribers(key string) []func(key, next string) {
	var fns []func(key, next string)
	for l := range b.listeners {
		l.mu.Lock()
		if !l.closed && (key == "" || l.subs[key] > 0) {
			fns = append(fns, l.fn)
		}
		l.mu.Unlock()
	}
	return fns
}

// Listen implements driver.Notifier. Notifications are delivered
// synchronously by the goroutine that released the lock.
func (b *Backend) Listen(ctx context.Context, fn func(key, next string)) (driver.Listener, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx, "listen", ""); err != nil {
		return nil, err
	}
	l := &listener{b: b, fn: fn, subs: make(map[string]int)}
	b.listeners[l] = struct{}{}
	return l, nil
}

type listener struct {
	b  *Backend
	fn func(key, next string)

	mu     sync.Mutex
	subs   map[string]int
	closed bool
}

func (l *listener) Subscribe(ctx context.Context, key string) error {
	l.b.mu.Lock()
	err := l.b.check(ctx, "subscribe", key)
	l.b.mu.Unlock()
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errors.New("memlock: subscribe on a closed listener")
	}
	l.subs[key]++
	return nil
}

func (l *listener) Unsubscribe(_ context.Context, key string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.subs[key]--; l.subs[key] <= 0 {
		delete(l.subs, key)
	}
	return nil
}

func (l *listener) Close() error {
	l.b.mu.Lock()
	delete(l.b.listeners, l)
	l.b.mu.Unlock()
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	return nil
}
