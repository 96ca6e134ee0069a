package dlock_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memlock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// batchSpy counts the renewal calls that reach the backend.
type batchSpy struct {
	*memlock.Backend
	mu      sync.Mutex
	batches int
	renewed int
	singles int
}

func (s *batchSpy) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) []driver.RenewResult {
	s.mu.Lock()
	s.batches++
	s.renewed += len(reqs)
	s.mu.Unlock()
	return s.Backend.RenewBatch(ctx, reqs)
}

func (s *batchSpy) Renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	s.mu.Lock()
	s.singles++
	s.renewed++
	s.mu.Unlock()
	return s.Backend.Renew(ctx, key, token, ttl)
}

func TestRenewalsAreBatched(t *testing.T) {
	const leases = 300
	const ttl = 600 * time.Millisecond
	spy := &batchSpy{Backend: memlock.New()}
	c := dlock.New(spy, dlock.WithTTL(ttl))
	defer c.Close()

	before := runtime.NumGoroutine()
	held := make([]*dlock.Lease, leases)
	for i := range held {
		l, err := c.Mutex(fmt.Sprintf("batch/%d", i)).TryLock(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		held[i] = l
	}
	if extra := runtime.NumGoroutine() - before; extra > 3 {
		t.Errorf("%d goroutines more while holding %d leases, want at most 3", extra, leases)
	}
	time.Sleep(2*ttl + ttl/6) // six renewal intervals of TTL/3 and a bit
	for _, l := range held {
		if err := l.Err(); err != nil {
			t.Fatalf("lease lost: %v", err)
		}
		if err := l.Unlock(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	spy.mu.Lock()
	defer spy.mu.Unlock()
	// Six renewal intervals of 300 leases: 1,800 renewals, in a handful of
	// batches each time, never one call per lease.
	if spy.renewed < 4*leases {
		t.Errorf("%d renewals, want at least %d", spy.renewed, 4*leases)
	}
	calls := spy.batches + spy.singles
	if calls > spy.renewed/20 {
		t.Errorf("%d renewal calls for %d renewals (%d batches, %d single), want at least 20 per call",
			calls, spy.renewed, spy.batches, spy.singles)
	}
	t.Logf("%d renewals in %d batches and %d single calls", spy.renewed, spy.batches, spy.singles)
}

func TestExponentialBackoff(t *testing.T) {
	b := dlock.ExponentialBackoff(10*time.Millisecond, 80*time.Millisecond)
	for attempt, want := range map[int]time.Duration{1: 10, 2: 20, 3: 40, 4: 80, 5: 80, 50: 80} {
		want *= time.Millisecond
		for range 100 {
			if d := b.Delay(attempt); d < want/2 || d > want {
				t.Fatalf("Delay(%d) = %v, want within [%v, %v]", attempt, d, want/2, want)
			}
		}
	}
}

func TestLostErrorWording(t *testing.T) {
	for r, want := range map[dlock.LostReason]string{
		dlock.LostExpired:     `dlock: lease "x" lost: expired without renewal`,
		dlock.LostMissing:     `dlock: lease "x" lost: no longer held on the store`,
		dlock.LostUnreachable: `dlock: lease "x" lost: store unreachable until the lease ran out`,
		dlock.LostClosed:      `dlock: lease "x" lost: client closed`,
	} {
		if got := (&dlock.LostError{Name: "x", Reason: r}).Error(); got != want {
			t.Errorf("Error() = %q, want %q", got, want)
		}
	}
}
