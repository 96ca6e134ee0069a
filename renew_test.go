package dlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memlock"
)

// failingRenewals is a memlock whose renewals all fail at once (a store
// that refuses connections), recording when each was sent.
type failingRenewals struct {
	*memlock.Backend
	mu sync.Mutex
	at []time.Time
}

var errRefused = errors.New("connection refused")

func (f *failingRenewals) note(n int) {
	f.mu.Lock()
	for range n {
		f.at = append(f.at, time.Now())
	}
	f.mu.Unlock()
}

func (f *failingRenewals) Renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	f.note(1)
	return false, errRefused
}

func (f *failingRenewals) RenewGrant(ctx context.Context, key, token string, fence uint64, ttl time.Duration) (bool, error) {
	f.note(1)
	return false, errRefused
}

func (f *failingRenewals) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) []driver.RenewResult {
	f.note(len(reqs))
	res := make([]driver.RenewResult, len(reqs))
	for i := range res {
		res[i].Err = errRefused
	}
	return res
}

// TestFailedRenewalRetriesBounded: a failed renewal is retried
// at a third of the time left once little is left (grant.finishRenewal),
// never in a tight loop, and the loss is reported at the safety deadline
// (Deadline − margin), not later. TTL 3 s (margin 300 ms): renewals fail
// from the first (at 1 s) to the loss (2.7 s): some 14 attempts, where
// every 300 ms would be 6.
func TestFailedRenewalRetriesBounded(t *testing.T) {
	store := &failingRenewals{Backend: memlock.New()}
	c := dlock.New(store)
	defer c.Close()
	const ttl = 3 * time.Second
	l, err := c.Mutex("k", dlock.WithTTL(ttl)).Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	safe := l.Deadline().Add(-ttl / 10)
	select {
	case <-l.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("lease not lost 5 s after its renewals started failing")
	}
	lostAt := time.Now()
	store.mu.Lock()
	at := append([]time.Time(nil), store.at...)
	store.mu.Unlock()
	var gaps []time.Duration
	for i := 1; i < len(at); i++ {
		gaps = append(gaps, at[i].Sub(at[i-1]).Round(time.Millisecond))
	}
	t.Logf("%d renewal attempts, gaps %v; lost %v after the safety deadline: %v", len(at), gaps, lostAt.Sub(safe).Round(time.Millisecond), l.Err())
	if len(at) > 25 {
		t.Errorf("%d renewal attempts in the lease's life: a tight retry loop", len(at))
	}
	for i, g := range gaps {
		if g < 5*time.Millisecond {
			t.Errorf("retry %d came %v after the one before: a tight loop", i+1, g)
		}
	}
	if late := lostAt.Sub(safe); late > 50*time.Millisecond {
		t.Errorf("loss reported %v after the safety deadline", late)
	}
	var lost *dlock.LostError
	if !errors.As(l.Err(), &lost) || lost.Reason != dlock.LostUnreachable {
		t.Errorf("loss %v, want LostUnreachable", l.Err())
	}
}

// sickRenewals is a memlock whose renewals of "sick" fail, recording the
// call timeout of every renewal call that carries "healthy".
type sickRenewals struct {
	*memlock.Backend
	mu       sync.Mutex
	timeouts []time.Duration
}

func (f *sickRenewals) noteCall(ctx context.Context, reqs []driver.RenewRequest) {
	for _, r := range reqs {
		if r.Key == "healthy" {
			d, ok := ctx.Deadline()
			if !ok {
				d = time.Now().Add(time.Hour)
			}
			f.mu.Lock()
			f.timeouts = append(f.timeouts, time.Until(d))
			f.mu.Unlock()
		}
	}
}

func (f *sickRenewals) RenewGrant(ctx context.Context, key, token string, fence uint64, ttl time.Duration) (bool, error) {
	f.noteCall(ctx, []driver.RenewRequest{{Key: key}})
	if key == "sick" {
		return false, errRefused
	}
	return f.Backend.RenewGrant(ctx, key, token, fence, ttl)
}

func (f *sickRenewals) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) []driver.RenewResult {
	f.noteCall(ctx, reqs)
	res := make([]driver.RenewResult, len(reqs))
	for i, r := range reqs {
		if r.Key == "sick" {
			res[i].Err = errRefused
			continue
		}
		res[i].Held, res[i].Err = f.Backend.RenewGrant(ctx, r.Key, r.Token, r.Fence, r.TTL)
	}
	return res
}

// TestNearDeadlineRetryDoesNotCutOtherRenewals: a renewal call gives up at
// the earliest safety deadline among its grants, so a grant that retries
// with little time left must not share a call with grants that have much
// more: their renewal would be cut to a few milliseconds. "sick" fails
// every renewal until its loss at 2.7 s, retrying ever faster; "healthy",
// taken at 1.6 s, is due at 2.6 s, among sick's last retries (coalesced
// when due within 50 ms), with some 1.9 s of its own left.
func TestNearDeadlineRetryDoesNotCutOtherRenewals(t *testing.T) {
	store := &sickRenewals{Backend: memlock.New()}
	c := dlock.New(store)
	defer c.Close()
	const ttl = 3 * time.Second
	sick, err := c.Mutex("sick", dlock.WithTTL(ttl)).Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1600 * time.Millisecond)
	healthy, err := c.Mutex("healthy", dlock.WithTTL(ttl)).Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer healthy.Unlock(context.Background())
	select {
	case <-sick.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("sick not lost")
	}
	time.Sleep(300 * time.Millisecond) // healthy's renewal, due at 2.6 s, is done
	store.mu.Lock()
	timeouts := append([]time.Duration(nil), store.timeouts...)
	store.mu.Unlock()
	if len(timeouts) == 0 {
		t.Fatal("healthy was not renewed")
	}
	for _, d := range timeouts {
		if d < time.Second {
			t.Errorf("a renewal call of healthy had a timeout of %v, with some 1.9 s of its own left: cut by sick's near-deadline retry (timeouts %v)", d.Round(time.Millisecond), timeouts)
			break
		}
	}
	if err := healthy.Err(); err != nil {
		t.Errorf("healthy lost: %v", err)
	}
}
