package scalebench

import (
	"context"
	"errors"
	"flag"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redislock"
)

var waitersFlag = flag.Int("scale.waiters", 1000, "number of goroutines of one Client waiting on one held lock")

// waitWindow is how long TestWaiters watches the waiters.
const waitWindow = 5 * time.Second

// TestWaiters makes N goroutines of one Client wait on one lock that
// another Client holds and renews, and watches what the waiting costs the
// store, for a plain and a Fair Mutex, at TTL 10s and 1s: only the waiter
// at the Client's local gate deals with the store, so the store sees what
// one waiter would cost, whatever N is. Checked (counts, never speed):
//
//	round trips   the waiting Client's round trips in a 5s window <= 60
//	queue         the lock's fair queue has at most 1 entry
//	goroutines    runtime.NumGoroutine while waiting <= before + N + 8
//	heap          HeapAlloc while waiting, minus before, <= 4 KiB per waiter
func TestWaiters(t *testing.T) {
	n := *waitersFlag
	if n < 1 {
		t.Fatalf("-scale.waiters=%d: want at least 1", n)
	}
	srv := testserver.StartRedis(t)
	for _, tc := range []struct {
		name string
		ttl  time.Duration
		fair bool
	}{
		{"plain/ttl10s", 10 * time.Second, false},
		{"plain/ttl1s", time.Second, false},
		{"fair/ttl10s", 10 * time.Second, true},
		{"fair/ttl1s", time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			name := "scale/waiters/" + tc.name
			opts := []dlock.Option{dlock.WithTTL(tc.ttl)}
			if tc.fair {
				opts = append(opts, dlock.Fair())
			}
			holderC := dlock.New(redislock.New(srv.Client(t)))
			defer holderC.Close()
			held, err := holderC.Mutex(name, opts...).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}

			cnt := &counter{}
			rdb := srv.Client(t)
			rdb.AddHook(cnt)
			c := dlock.New(redislock.New(rdb))
			defer c.Close()
			var tried sync.WaitGroup
			tried.Add(n)
			runtime.GC()
			goroutinesBefore, heapBefore := runtime.NumGoroutine(), heapAlloc()
			wctx, cancel := context.WithCancel(ctx)
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var once sync.Once
					m := c.Mutex(name, append(opts, dlock.WithOnBusy(func(*dlock.NotObtainedError) { once.Do(tried.Done) }))...)
					l, err := m.Lock(wctx)
					once.Do(tried.Done)
					switch {
					case err == nil:
						_ = l.Unlock(ctx)
						errs <- errors.New("a waiter obtained the lock while it was held")
					case !errors.Is(err, context.Canceled):
						errs <- err
					}
				}()
			}
			tried.Wait()
			time.Sleep(100 * time.Millisecond) // past the starvation switch
			start := cnt.snapshot()
			time.Sleep(waitWindow)
			end := cnt.snapshot()
			goroutines := runtime.NumGoroutine() - goroutinesBefore
			heap := int64(heapAlloc()) - int64(heapBefore)
			queued, err := srv.Client(t).ZCard(ctx, lockKey(name)+":q").Result()
			if err != nil {
				t.Fatal(err)
			}
			cancel()
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if err := held.Unlock(ctx); err != nil {
				t.Errorf("the holder's Unlock: %v", err)
			}

			rt := end.rt - start.rt
			perWaiter := float64(heap) / float64(n)
			t.Logf("%d waiters, TTL %v, fair %v: %d round trips (%d commands) in %v; %d queue entries; goroutines before + %d; %.0f B heap per waiter",
				n, tc.ttl, tc.fair, rt, end.cmds-start.cmds, waitWindow, queued, goroutines, perWaiter)
			if rt > 60 {
				t.Errorf("round trips of the waiting Client in %v = %d, want <= 60 whatever the number of waiters", waitWindow, rt)
			}
			if queued > 1 {
				t.Errorf("fair queue entries = %d, want <= 1 (one place per Client)", queued)
			}
			if goroutines > n+goroutineSlack {
				t.Errorf("goroutines while waiting = before + %d, want <= before + N + %d", goroutines, goroutineSlack)
			}
			if perWaiter > 4096 {
				t.Errorf("heap per waiter = %.0f B, want <= 4096", perWaiter)
			}
		})
	}
}
