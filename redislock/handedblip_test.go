package redislock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// queuedSignal wraps a Backend and signals each answer "queued" to a fair
// request (a refresh of the waiter's queue entry).
type queuedSignal struct {
	*redislock.Backend
	queued chan struct{}
}

func (q *queuedSignal) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	res, err := q.Backend.Acquire(ctx, req)
	if err == nil && req.Fair && res.Queued {
		select {
		case q.queued <- struct{}{}:
		default:
		}
	}
	return res, err
}

// TestHandedLeaseSurvivesLatencyBlip: a lease handed over by a release is
// trusted, until its first renewal answers, only for what is left of the
// head's queue entry (its last queue refresh + QueueTTL − margin). A store
// round trip that takes 0.7 s once, right after the handoff (a GC pause, a
// slow network, a Redis fork), must not lose it, as it does not lose the
// same Mutex's lease obtained by a request (9 s to spare). With plain
// entries of twice the margin (trusted until S + 1 s, first renewal at
// S + 0.5 s) it was lost; entries of three times the margin (S + 2 s) and
// a first renewal 50 ms after the handoff ride it out, as a Fair lease
// (S + 4 s) does.
func TestHandedLeaseSurvivesLatencyBlip(t *testing.T) {
	srv := testserver.StartRedis(t)
	for _, tc := range []struct {
		name   string
		handed bool
		opts   []dlock.Option
	}{
		{"handedblip/requested", false, nil},
		{"handedblip/handed", true, nil},
		{"handedblip/handed-fair", true, []dlock.Option{dlock.Fair()}}, // passes: 4 s of trust, renewed at 2 s
	} {
		name, handed := tc.name, tc.handed
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			px := testserver.StartProxy(t, srv.Addr())
			rdb := redis.NewClient(&redis.Options{Addr: px.Addr()})
			t.Cleanup(func() { _ = rdb.Close() })
			qs := &queuedSignal{Backend: redislock.New(rdb), queued: make(chan struct{}, 1)}
			var mu sync.Mutex
			var gotHanded bool
			xc := dlock.New(qs, dlock.WithObserver(dlock.ObserverFunc(func(e dlock.Event) {
				if e.Kind == dlock.EventLockGranted && !e.TryLock {
					mu.Lock()
					gotHanded = e.Handoff
					mu.Unlock()
				}
			})))
			defer xc.Close()
			var l *dlock.Lease
			var err error
			if handed {
				hc := dlock.New(redislock.New(srv.Client(t)))
				defer hc.Close()
				hl, err := hc.Mutex(name, tc.opts...).Lock(ctx)
				if err != nil {
					t.Fatal(err)
				}
				out := make(chan *dlock.Lease, 1)
				go func() {
					l, err := xc.Mutex(name, tc.opts...).Lock(ctx)
					if err != nil {
						t.Errorf("Lock: %v", err)
					}
					out <- l
				}()
				// Release right after one of X's queue refreshes: the
				// handoff is announced at once, well within its window.
				<-qs.queued
				<-qs.queued
				if err := hl.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
				l = <-out
				if l == nil {
					return
				}
			} else {
				if l, err = xc.Mutex(name, tc.opts...).Lock(ctx); err != nil {
					t.Fatal(err)
				}
			}
			// A latency blip of 700 ms on X's connection, from now on,
			// for 1.5 s.
			px.Latency(t, 700*time.Millisecond)
			time.Sleep(1500 * time.Millisecond)
			px.ClearLatency(t)
			mu.Lock()
			h := gotHanded
			mu.Unlock()
			if h != handed {
				t.Fatalf("lease handed over: %v, want %v (setup)", h, handed)
			}
			if err := l.Err(); err != nil {
				t.Errorf("%s: a Mutex lease (TTL 10 s, handed over: %v) was lost to one 700 ms round trip %v after it was granted: %v", name, handed, 1500*time.Millisecond, err)
			}
			_ = l.Unlock(context.WithoutCancel(ctx))
		})
	}
}
