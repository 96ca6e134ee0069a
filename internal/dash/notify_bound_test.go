package dash_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/dash"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/memlock"
	"github.com/dlock-go/dlock/redislock"
)

// TestNotifiedSamplesBounded: a hot lock (taken and released in a loop)
// must not make the dash list the whole store once per release. Every
// sample is a full List of the store; notified samples come at most one
// per 100ms (minNotifiedGap), so 2s at an interval of 1s make at most 1 +
// 20 + 2 of them (before the limit: 560-640 on Redis).
func TestNotifiedSamplesBounded(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func(t *testing.T) notifyingStore
	}{
		{"memlock", func(*testing.T) notifyingStore { return memlock.New() }},
		{"redis", func(t *testing.T) notifyingStore { return redislock.New(testserver.StartRedis(t).Client(t)) }},
	} {
		for _, mode := range []string{"one", "fair2"} {
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				be := tc.store(t)
				c := dlock.New(be)
				defer c.Close()
				ctx := t.Context()
				var lists atomic.Int64
				d := dash.New(dash.Config{
					List: func(ctx context.Context) ([]driver.LockInfo, error) {
						lists.Add(1)
						return be.List(ctx, "")
					},
					Where:    tc.name,
					Interval: time.Second,
					Notifier: func() driver.Notifier { return be },
				})
				// A hot lock, held most of the time by one of two Clients, the other
				// waiting: released ~every 2ms, each release letting a waiter in.
				hctx, hcancel := context.WithCancel(ctx)
				hdone := make(chan struct{}, 2)
				c2 := dlock.New(be)
				defer c2.Close()
				clients, opts := []*dlock.Client{c}, []dlock.Option(nil)
				if mode == "fair2" {
					clients, opts = []*dlock.Client{c, c2}, []dlock.Option{dlock.Fair()}
				}
				for _, c := range clients {
					go func() {
						defer func() { hdone <- struct{}{} }()
						m := c.Mutex("hot", opts...)
						for hctx.Err() == nil {
							l, err := m.Lock(hctx)
							if err != nil {
								return
							}
							time.Sleep(2 * time.Millisecond)
							_ = l.Unlock(context.Background())
						}
					}()
				}
				defer func() {
					hcancel()
					for range clients {
						<-hdone
					}
				}()
				time.Sleep(50 * time.Millisecond)

				rctx, cancel := context.WithCancel(ctx)
				done := make(chan struct{})
				go func() { defer close(done); d.Run(rctx) }()
				time.Sleep(2 * time.Second)
				cancel()
				<-done
				n := lists.Load()
				st, _ := d.Snapshot()
				t.Logf("%s/%s: %d Lists of the store in 2s at --interval 1s (wakeups %d)", tc.name, mode, n, st.Counts.Wakeups)
				if n > 23 {
					t.Errorf("%d Lists of the whole store in 2s at an interval of 1s: the release notifications of one hot lock make the dash sample without bound", n)
				}
			})
		}
	}
}

// TestNotificationsOffWithoutSubscriptions: once a hung subscription
// times out (callTimeout, 2s), the watcher reports notifications on,
// though it holds no subscription: the page then says releases are
// announced while none can be.
func TestNotificationsOffWithoutSubscriptions(t *testing.T) {
	store := &fakeStore{}
	store.set([]driver.LockInfo{{Key: "job", Owner: "a", Fence: 1, Holds: 1, TTL: time.Minute}}, nil)
	n := &hungNotifier{subscribing: make(chan string, 1)}
	d := dash.New(dash.Config{List: store.List, Where: "test", Interval: 20 * time.Millisecond,
		Notifier: func() driver.Notifier { return n }})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if st, _ := d.Snapshot(); st.Notifications {
			t.Fatal("notifications reported on while every subscription has failed")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
