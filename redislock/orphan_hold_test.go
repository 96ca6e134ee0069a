package redislock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

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
// lost grant's fence cannot, and the lock stayed held for a TTL (found by
// review of the tied releases).
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
