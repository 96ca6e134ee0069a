package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memlock"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// toxiproxy's links (the tests' proxies) end a moment after their
		// proxy is removed; they are the test rig's, not dlock's.
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).Start.func1"),
	)
}

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

// RenewGrant is the single renewal the client sends (memlock ties
// renewals to their grant), counted as Renew is.
func (s *batchSpy) RenewGrant(ctx context.Context, key, token string, fence uint64, ttl time.Duration) (bool, error) {
	s.mu.Lock()
	s.singles++
	s.renewed++
	s.mu.Unlock()
	return s.Backend.RenewGrant(ctx, key, token, fence, ttl)
}

func TestRenewalsAreBatched(t *testing.T) {
	const leases = 300
	const ttl = 600 * time.Millisecond
	spy := &batchSpy{Backend: memlock.New()}
	c := dlock.New(spy, dlock.WithTTL(ttl))
	defer c.Close()

	before := runtime.NumGoroutine()
	held := make([]*dlock.Lease, leases)
	start := time.Now()
	for i := range held {
		l, err := c.Mutex(fmt.Sprintf("batch/%d", i)).TryLock(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		held[i] = l
	}
	// The leases fall due as they were taken: renewals up to TTL/30 early
	// join a batch, so each interval needs at least spread/(TTL/30) calls.
	spread := time.Since(start)
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
	intervals := spy.renewed/leases + 1
	perInterval := int(spread/(ttl/30)) + 2
	if calls > intervals*perInterval || calls > spy.renewed/10 {
		t.Errorf("%d renewal calls for %d renewals (%d batches, %d single); want at most %d per renewal interval "+
			"(the leases were taken over %v) and at least 10 renewals per call",
			calls, spy.renewed, spy.batches, spy.singles, perInterval, spread)
	}
	t.Logf("%d renewals in %d batches and %d single calls; leases taken over %v", spy.renewed, spy.batches, spy.singles, spread)
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

// drifting is a memlock store that declares a drift allowance, as Redlock
// does.
type drifting struct {
	*memlock.Backend
	drift time.Duration
}

func (d drifting) Drift(time.Duration) time.Duration { return d.drift }

// TestDriftShortensValidity checks that a backend's drift allowance comes
// off every deadline: at the grant and after a renewal.
func TestDriftShortensValidity(t *testing.T) {
	const ttl, drift = time.Second, 300 * time.Millisecond
	c := dlock.New(drifting{memlock.New(), drift}, dlock.WithTTL(ttl), dlock.WithAutoRenew(false))
	defer c.Close()
	before := time.Now()
	l, err := c.Mutex("drift").Lock(t.Context())
	after := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	// The deadline is send time + TTL − drift, and the send time lies
	// between before and after.
	if d := l.Deadline(); d.Before(before.Add(ttl-drift)) || d.After(after.Add(ttl-drift)) {
		t.Errorf("Deadline %v after the acquire began, want TTL − drift (%v)", d.Sub(before), ttl-drift)
	}
	time.Sleep(50 * time.Millisecond)
	before = time.Now()
	if err := l.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	after = time.Now()
	if d := l.Deadline(); d.Before(before.Add(ttl-drift)) || d.After(after.Add(ttl-drift)) {
		t.Errorf("Deadline %v after the refresh began, want TTL − drift (%v)", d.Sub(before), ttl-drift)
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestLockDelayOptionChecked checks that a negative lock-delay and a backend
// without lock-delay are refused before any store call.
func TestLockDelayOptionChecked(t *testing.T) {
	c := dlock.New(memlock.New())
	defer c.Close()
	if _, err := c.Mutex("x", dlock.WithLockDelay(-time.Second)).TryLock(t.Context()); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("negative lock delay: %v, want ErrInvalid", err)
	}
	type plain struct{ driver.Backend } // hides memlock's capabilities (lock-delay among them)
	c2 := dlock.New(plain{memlock.New()}, dlock.WithLockDelay(time.Second))
	defer c2.Close()
	if _, err := c2.Mutex("x").TryLock(t.Context()); !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), "lock delay") {
		t.Errorf("lock delay on a backend without it: %v, want ErrInvalid naming the option", err)
	}
}

// TestOptionsCheckedAgainstBackend checks the options refused because of
// what the backend keeps: reserved owner IDs, and a TTL that the drift
// allowance and the safety margin use up.
func TestOptionsCheckedAgainstBackend(t *testing.T) {
	c := dlock.New(drifting{memlock.New(), 900 * time.Millisecond})
	defer c.Close()
	if _, err := c.Mutex("x", dlock.WithTTL(time.Second)).TryLock(t.Context()); !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), "drift") {
		t.Errorf("TTL 1s with a 900ms drift and a 100ms margin: %v, want ErrInvalid naming the drift", err)
	}
	l, err := c.Mutex("x", dlock.WithTTL(2*time.Second)).TryLock(t.Context())
	if err != nil {
		t.Fatalf("TTL 2s with a 900ms drift: %v", err)
	}
	_ = l.Unlock(t.Context())
	for _, id := range []string{"owner", "fence", "at", "exp", "delay"} {
		if _, err := c.Mutex("x", dlock.WithOwnerID(id), dlock.WithTTL(2*time.Second)).TryLock(t.Context()); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("WithOwnerID(%q): %v, want ErrInvalid", id, err)
		}
	}
}

// TestLeaseFromContext: fn's context in Do and a lease's own Context carry
// the lease, and contexts made from them too; other contexts carry none.
func TestLeaseFromContext(t *testing.T) {
	c := dlock.New(memlock.New())
	defer c.Close()
	if l, ok := dlock.LeaseFromContext(context.Background()); ok || l != nil {
		t.Errorf("LeaseFromContext(Background) = %v, %v", l, ok)
	}
	err := c.Do(t.Context(), "from-ctx", func(ctx context.Context) error {
		l, ok := dlock.LeaseFromContext(ctx)
		if !ok || l.Name() != "from-ctx" || l.Fence() == 0 || l.Err() != nil {
			t.Errorf("in Do: %v, %v", l, ok)
			return nil
		}
		sub, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if l2, _ := dlock.LeaseFromContext(sub); l2 != l {
			t.Errorf("a context made from fn's carries %v, want %v", l2, l)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Mutex("from-lease").Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := dlock.LeaseFromContext(l.Context()); !ok || got != l {
		t.Errorf("LeaseFromContext(lease.Context()) = %v, %v; want the lease", got, ok)
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// A Do inside a Do of another name: each name's lease is found by its
// name, and the one-name lookup refuses to guess between them, so that a
// fence never guards a resource of another name.
func TestLeaseFromContextInNestedDoOfAnotherName(t *testing.T) {
	c := dlock.New(memlock.New())
	defer c.Close()
	for range 3 { // audit's fence runs ahead of stock's
		if err := c.Do(t.Context(), "audit", func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	err := c.Do(t.Context(), "stock", func(ctx context.Context) error {
		stock, _ := dlock.LeaseFromContext(ctx)
		return c.Do(ctx, "audit", func(ctx context.Context) error {
			if l, ok := dlock.LeaseFromContext(ctx); ok {
				t.Errorf("LeaseFromContext under stock and audit = %s fence %d; want none (ambiguous)", l.Name(), l.Fence())
			}
			if l, ok := dlock.LeaseFromContextByName(ctx, "stock"); !ok || l != stock {
				t.Errorf("LeaseFromContextByName(stock) = %v, %v; want stock's lease", l, ok)
			}
			if l, ok := dlock.LeaseFromContextByName(ctx, "audit"); !ok || l.Name() != "audit" || l.Fence() != 4 {
				t.Errorf("LeaseFromContextByName(audit) = %v, %v; want audit's lease, fence 4", l, ok)
			}
			if _, ok := dlock.LeaseFromContextByName(ctx, "other"); ok {
				t.Error("LeaseFromContextByName(other) found a lease")
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A MultiLease's Context gives the lease of each of its names by name.
func TestLeaseFromContextOfMultiLease(t *testing.T) {
	c := dlock.New(memlock.New())
	defer c.Close()
	ml, err := c.Multi([]string{"m/a", "m/b"}).Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer ml.Unlock(t.Context())
	for _, name := range []string{"m/a", "m/b"} {
		if l, ok := dlock.LeaseFromContextByName(ml.Context(), name); !ok || l != ml.Lease(name) {
			t.Errorf("LeaseFromContextByName(ml.Context(), %q) = %v, %v; want its lease", name, l, ok)
		}
	}
	if l, ok := dlock.LeaseFromContext(ml.Context()); ok {
		t.Errorf("LeaseFromContext(ml.Context()) = %s; want none (two names)", l.Name())
	}
}
