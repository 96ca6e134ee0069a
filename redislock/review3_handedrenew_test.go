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

// renewCounter is a Backend that signals each "queued" answer to a fair
// request and records the time of every renewal call (Renew, RenewGrant,
// and one per request of a RenewBatch).
type renewCounter struct {
	*redislock.Backend
	queued chan struct{}

	mu     sync.Mutex
	renews []time.Time
}

func (c *renewCounter) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	res, err := c.Backend.Acquire(ctx, req)
	if err == nil && req.Fair && res.Queued {
		select {
		case c.queued <- struct{}{}:
		default:
		}
	}
	return res, err
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
	return c.Backend.Renew(ctx, key, token, ttl)
}

func (c *renewCounter) RenewGrant(ctx context.Context, key, token string, fence uint64, ttl time.Duration) (bool, error) {
	c.note(1)
	return c.Backend.RenewGrant(ctx, key, token, fence, ttl)
}

func (c *renewCounter) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) []driver.RenewResult {
	c.note(len(reqs))
	return c.Backend.RenewBatch(ctx, reqs)
}

func (c *renewCounter) calls() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.renews...)
}

// TestHandedGrantFirstRenewalAfter50ms (review 3): a plain Mutex's lease
// obtained by a direct handoff (default TTL 10 s: 3 s entries, trusted until
// S + 2 s) has its first renewal sent about 50 ms after the handoff
// (handle.handedLease: handedRenewAfter), and a hold that ends before then
// sends none. Held 10 ms: no renewal. Held 300 ms: exactly one, sent within
// [handoff, handoff + 150 ms], and none at S + safe/2 (about 1 s later).
func TestHandedGrantFirstRenewalAfter50ms(t *testing.T) {
	srv := testserver.StartRedis(t)
	for _, tc := range []struct {
		name      string
		hold      time.Duration
		wantCalls int
		opts      []dlock.Option
	}{
		{"held10ms", 10 * time.Millisecond, 0, nil},
		{"held300ms", 300 * time.Millisecond, 1, nil},
		// Fair too (its handed lease is trusted for S + 4 s, and was
		// first renewed at S + 2 s before this commit): a hold of 300 ms
		// now costs a renewal (on etcd a migration, one more Raft commit).
		{"fair-held300ms", 300 * time.Millisecond, 1, []dlock.Option{dlock.Fair()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			name := "review3renew/" + tc.name
			rc := &renewCounter{Backend: redislock.New(srv.Client(t)), queued: make(chan struct{}, 1)}
			var mu sync.Mutex
			var handed bool
			xc := dlock.New(rc, dlock.WithObserver(dlock.ObserverFunc(func(e dlock.Event) {
				if e.Kind == dlock.EventLockGranted && !e.TryLock {
					mu.Lock()
					handed = e.Handoff
					mu.Unlock()
				}
			})))
			defer xc.Close()
			hc := dlock.New(redislock.New(srv.Client(t)))
			defer hc.Close()
			hl, err := hc.Mutex(name, tc.opts...).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			type got struct {
				l  *dlock.Lease
				at time.Time
			}
			out := make(chan got, 1)
			go func() {
				l, err := xc.Mutex(name, tc.opts...).Lock(ctx)
				if err != nil {
					t.Errorf("Lock: %v", err)
				}
				out <- got{l, time.Now()}
			}()
			<-rc.queued // first attempt queued
			<-rc.queued // a refresh: the subscription is up by now
			if err := hl.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			g := <-out
			if g.l == nil {
				return
			}
			time.Sleep(tc.hold)
			if err := g.l.Unlock(ctx); err != nil {
				t.Fatalf("Unlock: %v", err)
			}
			// Anything scheduled (S + safe/2 is 1 s after S, 2 s for Fair) would
			// have gone out by now, had the grant stayed scheduled.
			time.Sleep(2500 * time.Millisecond)
			mu.Lock()
			h := handed
			mu.Unlock()
			if !h {
				t.Fatal("setup: the lease was not handed over")
			}
			calls := rc.calls()
			var offs []time.Duration
			for _, c := range calls {
				offs = append(offs, c.Sub(g.at).Round(time.Millisecond))
			}
			t.Logf("held %v: renewals at %v after Lock returned", tc.hold, offs)
			if len(calls) != tc.wantCalls {
				t.Errorf("a handed lease held %v sent %d renewals (at %v after the handoff), want %d", tc.hold, len(calls), offs, tc.wantCalls)
			}
			if len(calls) > 0 && (calls[0].Sub(g.at) > 150*time.Millisecond) {
				t.Errorf("first renewal of a handed lease %v after the handoff, want about 50 ms", calls[0].Sub(g.at))
			}
		})
	}
}
