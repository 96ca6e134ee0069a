package dlock_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memlock"
)

// releaseFlaky is a memlock store whose releases fail with an error that
// may heal, before or after the store acted on them.
type releaseFlaky struct {
	*memlock.Backend
	fail     atomic.Int64 // releases still to fail; -1: all of them
	acted    atomic.Bool  // a failing release acts first (its answer is lost)
	releases atomic.Int64
}

func (f *releaseFlaky) failing() bool {
	for {
		n := f.fail.Load()
		if n == 0 {
			return false
		}
		if n < 0 || f.fail.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

func (f *releaseFlaky) Release(ctx context.Context, key, token string) (driver.ReleaseResult, error) {
	return f.do(func() (driver.ReleaseResult, error) { return f.Backend.Release(ctx, key, token) })
}

func (f *releaseFlaky) ReleaseGrant(ctx context.Context, key, token string, fence uint64) (driver.ReleaseResult, error) {
	return f.do(func() (driver.ReleaseResult, error) { return f.Backend.ReleaseGrant(ctx, key, token, fence) })
}

func (f *releaseFlaky) do(release func() (driver.ReleaseResult, error)) (driver.ReleaseResult, error) {
	f.releases.Add(1)
	if !f.failing() {
		return release()
	}
	if f.acted.Load() {
		_, _ = release()
	}
	return driver.ReleaseResult{}, driver.Transient(errDropped)
}

// TestUnlockRetriesTransientStoreErrors checks that Unlock sends its
// release again through errors that may heal, and returns nil with the
// lock free, whether or not the failed tries had acted.
func TestUnlockRetriesTransientStoreErrors(t *testing.T) {
	for _, acted := range []bool{false, true} {
		f := &releaseFlaky{Backend: memlock.New()}
		f.acted.Store(acted)
		c := dlock.New(f)
		l, err := c.Mutex("k").Lock(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		f.fail.Store(3)
		if err := l.Unlock(t.Context()); err != nil {
			t.Errorf("acted=%v: Unlock through 3 transient errors = %v, want nil", acted, err)
		}
		if info := held(t, f.Backend, "k"); info.Holds != 0 {
			t.Errorf("acted=%v: after Unlock the lock is held: %+v", acted, info)
		}
		if n := f.releases.Load(); n < 4 {
			t.Errorf("acted=%v: %d releases reached the store, want at least 4", acted, n)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestUnlockUnconfirmedGoesOnInBackground checks that a release that the
// store keeps failing until the lease's safe deadline is reported as
// unconfirmed, and goes on in the background: once the store heals, the
// lock is free long before its TTL.
func TestUnlockUnconfirmedGoesOnInBackground(t *testing.T) {
	t.Parallel()
	f := &releaseFlaky{Backend: memlock.New()}
	c := dlock.New(f, dlock.WithTTL(10*time.Second))
	defer c.Close()
	l, err := c.Mutex("k").Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	f.fail.Store(-1)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	err = l.Unlock(ctx)
	if err == nil || !errors.Is(err, errDropped) {
		t.Fatalf("Unlock on a failing store = %v, want an error wrapping the store's", err)
	}
	if !errors.Is(l.Err(), dlock.ErrReleased) {
		t.Errorf("lease Err after Unlock = %v, want ErrReleased", l.Err())
	}
	f.fail.Store(0)
	deadline := time.Now().Add(5 * time.Second)
	for held(t, f.Backend, "k").Holds != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the lock is still held 5s after the store healed (TTL 10s): the release was not retried")
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Unconfirmed by the safe deadline, with ctx still running: the error
	// says so.
	c2 := dlock.New(f, dlock.WithTTL(time.Second), dlock.WithSafetyMargin(500*time.Millisecond))
	defer c2.Close()
	l, err = c2.Mutex("k2").Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	f.fail.Store(-1)
	err = l.Unlock(t.Context())
	f.fail.Store(0)
	if err == nil || !errors.Is(err, errDropped) || !strings.Contains(err.Error(), "unconfirmed") {
		t.Fatalf("Unlock = %v, want an unconfirmed release wrapping the store's error", err)
	}
}
