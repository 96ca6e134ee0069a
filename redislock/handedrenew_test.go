package redislock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// renewCounter is a queuedSignal that also records the time of every
// renewal call (Renew, RenewGrant, and one per request of a RenewBatch).
type renewCounter struct {
	*queuedSignal

	mu     sync.Mutex
	renews []time.Time
}

func (c *renewCounter) note(n int) {
	c.mu.Lock()
	for range n {
		c.renews = append(c.renews, time.Now())
	}
	c.mu.Unlock()
}

func (c *renewCounter) Renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	c.note(1)
	return c.queuedSignal.Renew(ctx, key, token, ttl)
}

func (c *renewCounter) RenewGrant(ctx context.Context, key, token string, fence uint64, ttl time.Duration) (bool, error) {
	c.note(1)
	return c.queuedSignal.RenewGrant(ctx, key, token, fence, ttl)
}

func (c *renewCounter) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) []driver.RenewResult {
	c.note(len(reqs))
	return c.queuedSignal.RenewBatch(ctx, reqs)
}

func (c *renewCounter) calls() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.renews...)
}

// TestHandedGrantFirstRenewal: a lease obtained by a direct handoff is
// trusted, until its first renewal answers, only until its head's last
// queued request S + the entry's time, less the margin; that renewal goes
// out early enough to leave 1.5 s for its answer, at half that time at the
// latest, and not sooner than 50 ms after the handoff (handedRenewBy). The
// holder here is handed the lock right after a queue refresh (S ≈ the
// handoff): a plain Mutex with the default TTL (3 s entries, S + 2 s)
// renews once at about S + 0.5 s when it holds 800 ms, not at all when it
// holds 10 ms; a Fair one (S + 4 s) keeps its first renewal at S + 2 s, so
// an 800 ms hold costs none; with a 3 s TTL (1 s entries, S + 0.7 s) a
// plain lease renews 50 ms after the handoff.
func TestHandedGrantFirstRenewal(t *testing.T) {
	srv := testserver.StartRedis(t)
	for _, tc := range []struct {
		name          string
		hold          time.Duration
		wantCalls     int
		first, within time.Duration // the first renewal's time after the handoff: first ± within
		opts          []dlock.Option
	}{
		{"held10ms", 10 * time.Millisecond, 0, 0, 0, nil},
		{"held800ms", 800 * time.Millisecond, 1, 500 * time.Millisecond, 150 * time.Millisecond, nil},
		{"fair-held800ms", 800 * time.Millisecond, 0, 0, 0, []dlock.Option{dlock.Fair()}},
		{"ttl3s-held300ms", 300 * time.Millisecond, 1, 50 * time.Millisecond, 100 * time.Millisecond, []dlock.Option{dlock.WithTTL(3 * time.Second)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			name := "handedrenew/" + tc.name
			rc := &renewCounter{queuedSignal: newQueuedSignal(redislock.New(srv.Client(t)))}
			obs, handed := handoffObserver()
			xc := dlock.New(rc, obs)
			defer xc.Close()
			l, at := handOverRightAfterRefresh(t, srv, name, tc.opts, xc, rc.queuedSignal)
			if l == nil {
				return
			}
			time.Sleep(tc.hold)
			if err := l.Unlock(ctx); err != nil {
				t.Fatalf("Unlock: %v", err)
			}
			// Anything scheduled (S + safe/2 is 1 s after S, 2 s for Fair) would
			// have gone out by now, had the grant stayed scheduled.
			time.Sleep(2500 * time.Millisecond)
			if !handed() {
				t.Fatal("setup: the lease was not handed over")
			}
			calls := rc.calls()
			var offs []time.Duration
			for _, c := range calls {
				offs = append(offs, c.Sub(at).Round(time.Millisecond))
			}
			t.Logf("held %v: renewals at %v after Lock returned", tc.hold, offs)
			if len(calls) != tc.wantCalls {
				t.Errorf("a handed lease held %v sent %d renewals (at %v after the handoff), want %d", tc.hold, len(calls), offs, tc.wantCalls)
			}
			if len(calls) > 0 {
				if d := calls[0].Sub(at); d < tc.first-tc.within || d > tc.first+tc.within {
					t.Errorf("first renewal of a handed lease %v after the handoff, want %v ± %v", d.Round(time.Millisecond), tc.first, tc.within)
				}
			}
		})
	}
}
