package memlock

import (
	"context"
	"sort"
	"strings"

	"github.com/dlock-go/dlock/driver"
)

// Inspect implements driver.Inspector.
func (b *Backend) Inspect(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return driver.LockInfo{}, false, err
	}
	now := b.clock.Now()
	st := b.state(key, now)
	if st == nil || !st.held() {
		return driver.LockInfo{}, false, nil
	}
	return st.info(key, now), true, nil
}

// List implements driver.Inspector.
func (b *Backend) List(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	now := b.clock.Now()
	var out []driver.LockInfo
	for key := range b.locks {
		if !strings.HasPrefix(key, prefix) {
			continue
		}
		if st := b.state(key, now); st != nil && st.held() {
			out = append(out, st.info(key, now))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// ForceRelease implements driver.Inspector. The fair queue and the writer
// intent stay: their waiters are alive.
func (b *Backend) ForceRelease(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	b.mu.Lock()
	if err := b.check(ctx); err != nil {
		b.mu.Unlock()
		return driver.LockInfo{}, false, err
	}
	now := b.clock.Now()
	st := b.state(key, now)
	if st == nil || !st.held() {
		b.mu.Unlock()
		return driver.LockInfo{}, false, nil
	}
	info := st.info(key, now)
	st.excl = nil
	clear(st.shared)
	b.tidy(key, st)
	fns := b.subscribers(key)
	b.mu.Unlock()
	for _, fn := range fns {
		fn(key, "")
	}
	return info, true, nil
}

// BreakIf implements driver.Breaker.
func (b *Backend) BreakIf(ctx context.Context, key string, fence uint64) (bool, error) {
	b.mu.Lock()
	if err := b.check(ctx); err != nil {
		b.mu.Unlock()
		return false, err
	}
	st := b.state(key, b.clock.Now())
	if st == nil || st.excl == nil || st.excl.fence != fence || st.excl.delay > 0 {
		b.mu.Unlock()
		return false, nil
	}
	st.excl = nil
	b.tidy(key, st)
	fns := b.subscribers(key)
	b.mu.Unlock()
	for _, fn := range fns {
		fn(key, "")
	}
	return true, nil
}
