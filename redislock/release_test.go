package redislock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// lateGiveBack: W's first grant is answered too late (so the client gives it
// back); the give-back release does not come back within its context (TTL)
// and reaches Redis only later (a command stuck in flight).
type lateGiveBack struct {
	*redislock.Backend
	mu       sync.Mutex
	acquires int
	releases int
	landed   chan struct{}
}

func (s *lateGiveBack) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	res, err := s.Backend.Acquire(ctx, req)
	s.mu.Lock()
	s.acquires++
	n := s.acquires
	s.mu.Unlock()
	if n == 1 && res.Acquired {
		time.Sleep(1100 * time.Millisecond) // the answer comes too late
	}
	return res, err
}

func (s *lateGiveBack) Release(ctx context.Context, key, token string) (driver.ReleaseResult, error) {
	return s.release(ctx, func(ctx context.Context) (driver.ReleaseResult, error) {
		return s.Backend.Release(ctx, key, token)
	})
}

// ReleaseGrant is the release the client gives a grant back with.
func (s *lateGiveBack) ReleaseGrant(ctx context.Context, key, token string, fence uint64) (driver.ReleaseResult, error) {
	return s.release(ctx, func(ctx context.Context) (driver.ReleaseResult, error) {
		return s.Backend.ReleaseGrant(ctx, key, token, fence)
	})
}

// release sends the first release late, the others at once.
func (s *lateGiveBack) release(ctx context.Context, send func(context.Context) (driver.ReleaseResult, error)) (driver.ReleaseResult, error) {
	s.mu.Lock()
	s.releases++
	n := s.releases
	s.mu.Unlock()
	if n != 1 {
		return send(ctx)
	}
	go func() { // the command lands after the client gave up on it
		time.Sleep(2500 * time.Millisecond)
		_, _ = send(context.Background())
		close(s.landed)
	}()
	<-ctx.Done()
	return driver.ReleaseResult{}, ctx.Err()
}

// TestGiveBackReleaseLandsLate: a Lock whose first grant came too late
// gives it back, but that release is stuck in flight and reaches Redis only
// after the wait got its next grant. The wait must not have reused the
// token: the stale release then finds nothing of its (else: two holders).
func TestGiveBackReleaseLandsLate(t *testing.T) {
	srv := testserver.StartRedis(t)
	const ttl = time.Second
	opts := []dlock.Option{dlock.Fair(), dlock.WithTTL(ttl)}
	st := &lateGiveBack{Backend: redislock.New(srv.Client(t)), landed: make(chan struct{})}
	w := dlock.New(st)
	defer w.Close()
	x := dlock.New(redislock.New(srv.Client(t)))
	defer x.Close()
	ctx := t.Context()
	start := time.Now()
	l, err := w.Mutex("k", opts...).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%v: W holds fence %d", time.Since(start).Round(time.Millisecond), l.Fence())
	select {
	case <-st.landed:
	case <-time.After(10 * time.Second):
		t.Fatal("the late release never ran")
	}
	xl, err := x.Mutex("k", opts...).TryLock(ctx)
	if err == nil {
		t.Errorf("two holders: W fence %d (Err %v), X fence %d", l.Fence(), l.Err(), xl.Fence())
		_ = xl.Unlock(ctx)
	}
	_ = l.Unlock(ctx)
}

// lostAnswerBackend is a real Backend whose next Acquire, when asked, runs
// on the store and then reports an error, as when its answer is lost.
type lostAnswerBackend struct {
	*redislock.Backend
	loseNext atomic.Bool
}

func (b *lostAnswerBackend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	res, err := b.Backend.Acquire(ctx, req)
	if b.loseNext.CompareAndSwap(true, false) {
		return driver.AcquireResult{}, errors.New("injected: the answer was lost")
	}
	return res, err
}

// TestOrphanHoldOfUnknownAcquireDropped: a reentrant handle's grant is lost
// on the store (broken by an operator), and a re-entry whose answer is lost
// makes a fresh grant of the handle's token there. The handle's last Unlock
// reports the loss, and drops that fresh grant too: releases tied to the
// lost grant's fence cannot, and the lock would stay held for a TTL.
func TestOrphanHoldOfUnknownAcquireDropped(t *testing.T) {
	srv := testserver.StartRedis(t)
	b := &lostAnswerBackend{Backend: redislock.New(srv.Client(t))}
	c := dlock.New(b, dlock.WithTTL(5*time.Second))
	defer c.Close()
	other := dlock.New(redislock.New(srv.Client(t)), dlock.WithTTL(5*time.Second))
	defer other.Close()
	ctx := t.Context()
	const name = "orphan/hold"
	h := c.Mutex(name, dlock.Reentrant())
	l1, err := h.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.ForceRelease(ctx, name); err != nil {
		t.Fatal(err)
	}
	b.loseNext.Store(true)
	if _, err := h.Lock(ctx); err == nil {
		t.Fatal("the re-entry whose answer was lost succeeded")
	}
	if err := l1.Unlock(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Unlock of the broken grant = %v, want ErrNotHeld", err)
	}
	l, err := other.Mutex(name).TryLock(ctx)
	if err != nil {
		t.Fatalf("the lock is still held after the handle's last Unlock: %v", err)
	}
	_ = l.Unlock(ctx)
}
