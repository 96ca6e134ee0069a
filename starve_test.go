package dlock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memlock"
)

// TestPlainMutexDoesNotStarveWaiters runs four owners, each with a Client of
// its own, on one name with a plain (not Fair) Mutex; each holds the lock
// briefly and locks again at once. The owner that just released would win
// nearly every race against waiters that must first hear of the release;
// waiters that starve join the store's queue, and then every owner queues,
// so each gets a fair share. It asserts shares, not speed.
func TestPlainMutexDoesNotStarveWaiters(t *testing.T) {
	t.Parallel()
	const owners = 4
	store := memlock.New()
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	grants := make([]int, owners)
	var longest time.Duration
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range owners {
		c := dlock.New(store)
		defer c.Close()
		m := c.Mutex("hot")
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				start := time.Now()
				l, err := m.Lock(ctx)
				if err != nil {
					return
				}
				waited := time.Since(start)
				for end := time.Now().Add(200 * time.Microsecond); time.Now().Before(end); {
				}
				if err := l.Unlock(context.Background()); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				grants[i]++
				longest = max(longest, waited)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	total := 0
	for _, g := range grants {
		total += g
	}
	t.Logf("grants per owner %v, longest wait %v", grants, longest)
	if total < 40*owners {
		t.Fatalf("only %d grants in 1.5s; want at least %d to judge the shares", total, 40*owners)
	}
	for i, g := range grants {
		if g < total/owners/3 {
			t.Errorf("owner %d got %d of %d grants; want at least a third of an even share (%d)", i, g, total, total/owners/3)
		}
	}
}

// TestPlainMutexDoesNotWaitOnDeadHead: a waiter that died leaves its queue
// entry for up to five seconds. A plain Mutex that learned of the queue
// queues behind it, but takes the free lock without the queue after a short
// grace instead of waiting the entry out; its TryLock ignores the queue.
func TestPlainMutexDoesNotWaitOnDeadHead(t *testing.T) {
	t.Parallel()
	store := memlock.New()
	ctx := context.Background()
	holder := dlock.New(store)
	defer holder.Close()
	h, err := holder.Mutex("k").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A fair waiter queues, then its process dies: its entry stays.
	if res, err := store.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "dead", Owner: "dead",
		TTL: time.Minute, Fair: true, Wait: true, QueueTTL: 5 * time.Second}); err != nil || !res.Queued {
		t.Fatalf("queueing the dead waiter: %+v, %v", res, err)
	}
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	c := dlock.New(store)
	defer c.Close()
	m := c.Mutex("k")
	for i := range 3 {
		start := time.Now()
		l, err := m.Lock(ctxTimeout(t, 3*time.Second))
		if err != nil {
			t.Fatalf("Lock %d on a free lock with a dead head queued: %v after %v", i, err, time.Since(start))
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("Lock %d took %v", i, time.Since(start))
	}
	l, err := m.TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock on a free lock with a dead head queued: %v", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
