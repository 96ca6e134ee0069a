package redislock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// TestHandedLeaseWithinStoreExpiry: the lease a queued waiter builds
// from a handoff announcement must not outlive the handed grant on the
// store (Lease.Deadline: "the store cannot have let the lease go before
// then"). The grant expires with the head's queue entry, whose time to
// live is the handle's QueueTTL: 2 s for a plain Mutex with the default
// TTL, 1 s with TTL 3 s (the floor), 5 s for a Fair one. No other test
// checks the handed lease's deadline against the store, so a handedLease
// that used another time to live than the requests (say
// h.opts.queueTTL(), 5 s, for a plain handle, as before 02ca577) passes
// every Handoff test of the root package and of redislock, and
// TestHeadCrash/redis-plain (TTL 500 ms: plain and Fair entries both
// live 500 ms there).
func TestHandedLeaseWithinStoreExpiry(t *testing.T) {
	srv := testserver.StartRedis(t)
	for _, tc := range []struct {
		name    string
		opts    []dlock.Option
		handoff bool
	}{
		{"plain", nil, true},
		{"plain TTL 3s", []dlock.Option{dlock.WithTTL(3 * time.Second)}, true},
		{"fair", []dlock.Option{dlock.Fair()}, true},
		{"plain TTL 40s", []dlock.Option{dlock.WithTTL(40 * time.Second)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			name := "handedlease/" + tc.name
			inner := redislock.New(srv.Client(t))
			holderC := dlock.New(redislock.New(srv.Client(t)))
			defer holderC.Close()
			var mu sync.Mutex
			var handed, granted bool
			xc := dlock.New(redislock.New(srv.Client(t)), dlock.WithObserver(dlock.ObserverFunc(func(e dlock.Event) {
				if e.Kind == dlock.EventLockGranted && !e.TryLock {
					mu.Lock()
					handed, granted = e.Handoff, true
					mu.Unlock()
				}
			})))
			defer xc.Close()
			hl, err := holderC.Mutex(name, tc.opts...).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			out := make(chan *dlock.Lease, 1)
			go func() {
				wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				l, err := xc.Mutex(name, tc.opts...).Lock(wctx)
				if err != nil {
					t.Errorf("X's Lock: %v", err)
				}
				out <- l
			}()
			deadline := time.Now().Add(5 * time.Second)
			for {
				info, _, err := inner.Inspect(ctx, name)
				if err != nil {
					t.Fatal(err)
				}
				if info.Queued > 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("X never queued")
				}
				time.Sleep(time.Millisecond)
			}
			// X subscribes to the name's releases after its first attempt:
			// give it time to, so that it hears the handoff. (Its entry
			// was refreshed within 50 ms, well within a quarter of it.)
			time.Sleep(50 * time.Millisecond)
			if err := hl.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			l := <-out
			if l == nil {
				return
			}
			defer l.Unlock(context.Background())
			info, _, err := inner.Inspect(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now() // after the answer: storeExp errs late, never early
			storeExp := now.Add(info.TTL)
			mu.Lock()
			h, g := handed, granted
			mu.Unlock()
			t.Logf("handed %v; store TTL %v; lease deadline in %v", h, info.TTL.Round(time.Millisecond), time.Until(l.Deadline()).Round(time.Millisecond))
			if !g || h != tc.handoff {
				t.Errorf("granted by handoff: %v (observed %v); want %v", h, g, tc.handoff)
			}
			if l.Deadline().After(storeExp.Add(20 * time.Millisecond)) {
				t.Errorf("lease Deadline %v after the store's expiry of the grant (fence %d, store TTL %v)",
					l.Deadline().Sub(storeExp).Round(time.Millisecond), l.Fence(), info.TTL.Round(time.Millisecond))
			}
		})
	}
}
