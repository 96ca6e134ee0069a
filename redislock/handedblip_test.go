package redislock_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

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
			qs := newQueuedSignal(redislock.New(rdb))
			obs, gotHanded := handoffObserver()
			xc := dlock.New(qs, obs)
			defer xc.Close()
			var l *dlock.Lease
			if handed {
				if l, _ = handOverRightAfterRefresh(t, srv, name, tc.opts, xc, qs); l == nil {
					return
				}
			} else {
				var err error
				if l, err = xc.Mutex(name, tc.opts...).Lock(ctx); err != nil {
					t.Fatal(err)
				}
			}
			// A latency blip of 700 ms on X's connection, from now on,
			// for 1.5 s.
			px.Latency(t, 700*time.Millisecond)
			time.Sleep(1500 * time.Millisecond)
			px.ClearLatency(t)
			if h := gotHanded(); h != handed {
				t.Fatalf("lease handed over: %v, want %v (setup)", h, handed)
			}
			if err := l.Err(); err != nil {
				t.Errorf("%s: a Mutex lease (TTL 10 s, handed over: %v) was lost to one 700 ms round trip %v after it was granted: %v", name, handed, 1500*time.Millisecond, err)
			}
			_ = l.Unlock(context.WithoutCancel(ctx))
		})
	}
}
