package main

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redislock"
	"github.com/redis/go-redis/v9"
)

// newTestService is a mutex-strategy service on the Redis at addr, in
// this process. Its Redis client waits for answers as long as they take
// (no context timeouts, 30 s read timeout), so a write it sent reaches
// Redis however late.
func newTestService(t *testing.T, addr string, cfg serviceConfig) *service {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 30 * time.Second, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	locks := dlock.New(redislock.New(rdb), dlock.WithLogger(slog.New(slog.DiscardHandler)))
	t.Cleanup(func() { _ = locks.Close() })
	k := keys{sale: cfg.sale}
	lim, err := newLimiter(limiterGCRA, rdb, k, cfg.ratePerMinute, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return &service{cfg: cfg, k: k, rdb: rdb, locks: locks, limiter: lim, log: slog.New(slog.DiscardHandler)}
}

// A holder of an item's lock is paused between its read and its write, and
// its write reaches Redis late (held by the network after the pause): by
// then its lease has run out and another buyer has bought the last unit
// under the next lease. The fenced write is refused; the unfenced one
// lands and sells the unit twice. This is the point of the fence, shown.
func TestLateWriteOfPausedHolder(t *testing.T) {
	for _, unfenced := range []bool{false, true} {
		name := "fenced"
		if unfenced {
			name = "unfenced"
		}
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			srv := testserver.StartRedis(t)
			proxy := testserver.StartProxy(t, srv.Addr())
			direct := srv.Client(t)
			cfg := serviceConfig{sale: "late", strategy: strategyMutex, ratePerMinute: 100,
				lockTTL: 500 * time.Millisecond, lockWait: 20 * time.Second, unfenced: unfenced}
			k := keys{sale: cfg.sale}
			if err := direct.HSet(ctx, k.stock("x"), "value", 1).Err(); err != nil {
				t.Fatal(err)
			}
			a := newTestService(t, proxy.Addr(), cfg) // its write will be held on the way
			b := newTestService(t, srv.Addr(), cfg)

			paused, resume := make(chan struct{}), make(chan struct{})
			a.beforeWrite = func() {
				close(paused)
				<-resume
			}
			type result struct {
				answer string
				err    error
			}
			aDone := make(chan result, 1)
			go func() {
				ans, err := a.buyLocked(ctx, order{ID: "a", User: "ua", Item: "x"})
				aDone <- result{ans, err}
			}()
			<-paused // a has read the stock (1) under its lease
			// From now on a's requests, its write and its renewals, reach
			// Redis 3 s late: its lease runs out there meanwhile.
			proxy.RequestLatency(t, 3*time.Second, 0)
			close(resume)

			ansB, err := b.buyLocked(ctx, order{ID: "b", User: "ub", Item: "x"})
			if err != nil || ansB != answerOK {
				t.Fatalf("b, under the next lease: %q, %v; want ok", ansB, err)
			}
			ra := <-aDone // returns once a's late write was answered
			t.Logf("a: %q, %v", ra.answer, ra.err)

			orders, err := direct.XLen(ctx, k.orders()).Result()
			if err != nil {
				t.Fatal(err)
			}
			refused, _ := direct.Get(ctx, k.refused()).Int64()
			if unfenced {
				if orders != 2 || ra.answer != answerOK {
					t.Errorf("unfenced: %d orders for 1 unit, a told %q; want the late write to sell the unit again (2 orders, ok)", orders, ra.answer)
				}
				return
			}
			if orders != 1 || refused != 1 || ra.answer != answerStale {
				t.Errorf("fenced: %d orders for 1 unit, %d late writes refused, a told %q; want 1, 1, %q", orders, refused, ra.answer, answerStale)
			}
			if n, _ := stockOf(ctx, direct, k, "x"); n != 0 {
				t.Errorf("fenced: stock %d, want 0", n)
			}
			if errors.Is(ra.err, context.Canceled) {
				t.Errorf("a's call ended by its context, not by the store's answer: %v", ra.err)
			}
		})
	}
}
