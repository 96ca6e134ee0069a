package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/memlock"
	"github.com/dlock-go/dlock/redislock"
	"github.com/redis/go-redis/v9"
)

// A lease makes its Done channel on first use; it must behave as one made
// at the start: the same channel every time, closed when the lease ends,
// and closed already when first asked for after the end.
func TestLeaseDoneOnDemand(t *testing.T) {
	ctx := t.Context()
	store := memlock.New()
	c := dlock.New(store, dlock.WithTTL(time.Second))
	defer c.Close()

	early, err := c.Mutex("done/early").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d := early.Done()
	if early.Done() != d {
		t.Fatal("Done returned two different channels")
	}
	select {
	case <-d:
		t.Fatal("Done closed while the lease is held")
	default:
	}
	if err := early.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d:
	default:
		t.Fatal("Done asked for before Unlock is not closed after it")
	}
	if early.Done() != d {
		t.Fatal("Done changed after Unlock")
	}

	late, err := c.Mutex("done/late").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := late.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-late.Done():
	default:
		t.Fatal("Done first asked for after Unlock is not closed")
	}

	// A loss (the store dropped the lock) closes a channel asked for
	// before it; Refresh reports the loss.
	lost, err := c.Mutex("done/lost").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d = lost.Done()
	if _, _, err := store.ForceRelease(ctx, "done/lost"); err != nil {
		t.Fatal(err)
	}
	if err := lost.Refresh(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Refresh after a force release = %v, want ErrNotHeld", err)
	}
	select {
	case <-d:
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed after the loss")
	}
	if !errors.Is(lost.Err(), dlock.ErrLost) {
		t.Fatalf("Err = %v, want ErrLost", lost.Err())
	}
}

// Owner strings are shared by the acquires of one second with the same
// metadata; handles with different metadata must still get their own.
func TestOwnerStringPerMetadata(t *testing.T) {
	ctx := t.Context()
	c := dlock.New(memlock.New())
	defer c.Close()
	pattern := "^" + regexp.QuoteMeta(driver.ProcessIdentity()) + `( client \d+)?\|(proc:[0-9a-f]{8}:\d+\|)?\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`
	for _, meta := range []string{"", "a", "", "b", "b"} {
		l, err := c.Mutex("owner/"+meta, dlock.WithMetadata(meta)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := pattern + "$"
		if meta != "" {
			want = pattern + `\|` + meta + "$"
		}
		if !regexp.MustCompile(want).MatchString(l.Owner()) {
			t.Errorf("Owner() = %q, want it to match %s", l.Owner(), want)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Two Clients of one process are two owners: their owner strings differ,
// and both are of this process (redlock tells a quorum held by one owner
// from nodes split between contenders by these strings: with one string,
// contenders of two Clients looked like a holder and their waiters slept
// for the TTL).
func TestOwnerStringPerClient(t *testing.T) {
	ctx := t.Context()
	store := memlock.New()
	var owners []string
	for i := range 2 {
		c := dlock.New(store)
		defer c.Close()
		l, err := c.Mutex(fmt.Sprintf("owner-per-client/%d", i)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		owners = append(owners, l.Owner())
		if !driver.OfThisProcess(l.Owner()) {
			t.Errorf("OfThisProcess(%q) = false", l.Owner())
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The two may straddle a second: compare what comes before the time.
	who := func(owner string) string { return owner[:strings.LastIndex(owner, "|")] }
	if who(owners[0]) == who(owners[1]) {
		t.Errorf("two Clients share the owner identity %q (owners %q)", who(owners[0]), owners)
	}
	for _, o := range []string{"otherhost|pid 1|2026-11-21T10:00:03Z", driver.ProcessIdentity() + "0|2026-11-21T10:00:03Z", ""} {
		if driver.OfThisProcess(o) {
			t.Errorf("OfThisProcess(%q) = true", o)
		}
	}
}

// TestUnlockWithEndedContextStillReleases checks that Unlock with a context
// that has already ended (a request that timed out, a deferred Unlock after
// Ctrl-C) still releases the lock, in the background, instead of leaving it
// on the store for its TTL.
func TestUnlockWithEndedContextStillReleases(t *testing.T) {
	store := memlock.New()
	c, other := dlock.New(slowRelease{store}), dlock.New(store)
	defer c.Close()
	defer other.Close()
	for _, cut := range []string{"before", "during"} {
		l, err := c.Mutex("k", dlock.WithTTL(time.Minute)).Lock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		if cut == "before" {
			cancel()
		} else {
			time.AfterFunc(10*time.Millisecond, cancel) // while the release is on its way
		}
		if err := l.Unlock(ctx); !errors.Is(err, context.Canceled) {
			t.Errorf("%s: Unlock = %v, want context.Canceled", cut, err)
		}
		cancel()
		// Released within seconds, not the minute of the TTL.
		got, err := other.Mutex("k").Lock(ctxTimeout(t, 10*time.Second))
		if err != nil {
			t.Fatalf("%s: the lock stayed after Unlock with an ended context: %v", cut, err)
		}
		if err := got.Unlock(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// slowRelease is a store whose releases take 50ms to arrive; one whose
// context ends first never arrives.
type slowRelease struct{ driver.Backend }

func (s slowRelease) Release(ctx context.Context, key, token string) (driver.ReleaseResult, error) {
	select {
	case <-time.After(50 * time.Millisecond):
	case <-ctx.Done():
		return driver.ReleaseResult{}, ctx.Err()
	}
	return s.Backend.Release(ctx, key, token)
}

func TestCallContext(t *testing.T) {
	c := dlock.New(memlock.New(), dlock.WithTTL(time.Second))
	defer c.Close()
	l, err := c.Mutex("call").Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := l.CallContext(t.Context())
	defer cancel()
	d, ok := ctx.Deadline()
	if want := l.Deadline().Add(-100 * time.Millisecond); !ok || !d.Equal(want) {
		t.Errorf("deadline = %v, %v; want the safe deadline %v", d, ok, want)
	}
	if got, ok := dlock.LeaseFromContext(ctx); !ok || got != l {
		t.Error("the call's context does not carry the lease")
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(time.Second):
		t.Fatal("the call's context outlived the lease")
	}
	if cause := context.Cause(ctx); !errors.Is(cause, dlock.ErrReleased) {
		t.Errorf("cause = %v, want ErrReleased", cause)
	}
}

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

// Refresh during an Unlock that waits for a renewal in flight returns at once.
func TestRefreshDuringUnlock(t *testing.T) {
	f := newFaulty()
	f.renewGate = make(chan struct{})
	c := dlock.New(f)
	defer c.Close()
	l, err := c.Mutex("k", dlock.WithAutoRenew(false)).Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = l.Refresh(context.Background()) }() // blocks in Renew
	time.Sleep(20 * time.Millisecond)
	unlocked := make(chan error, 1)
	go func() { unlocked <- l.Unlock(context.Background()) }() // waits for that renewal
	time.Sleep(20 * time.Millisecond)

	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = l.Refresh(ctx)
	if took := time.Since(start); took > time.Second {
		t.Errorf("Refresh took %v while Unlock was in progress", took)
	}
	if !errors.Is(err, dlock.ErrReleased) {
		t.Errorf("Refresh during Unlock = %v, want ErrReleased", err)
	}
	close(f.renewGate)
	if err := <-unlocked; err != nil {
		t.Fatalf("Unlock: %v", err)
	}
}

// A second Unlock while the first is on its way returns when the lease has
// ended, with ErrReleased.
func TestConcurrentUnlock(t *testing.T) {
	f := newFaulty()
	f.renewGate = make(chan struct{})
	c := dlock.New(f)
	defer c.Close()
	l, err := c.Mutex("k", dlock.WithAutoRenew(false)).Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = l.Refresh(context.Background()) }()
	time.Sleep(20 * time.Millisecond)
	first := make(chan error, 1)
	go func() { first <- l.Unlock(context.Background()) }()
	time.Sleep(20 * time.Millisecond)
	second := make(chan error, 1)
	go func() { second <- l.Unlock(context.Background()) }()
	time.Sleep(20 * time.Millisecond)
	close(f.renewGate)
	if err := <-first; err != nil {
		t.Fatalf("first Unlock: %v", err)
	}
	err = <-second
	if !errors.Is(err, dlock.ErrReleased) {
		t.Errorf("second Unlock = %v, want ErrReleased", err)
	}
	if l.Err() == nil {
		t.Error("second Unlock returned before the lease ended")
	}
}

// A release held up on its way to the store (a frozen member, a slow link)
// may land after the store let the hold lapse. The lease was valid when
// Unlock began, so the caller's work ran under it: Unlock reports a
// release, not a loss. A hold that the store dropped before Unlock began
// (deleted under a valid lease) is still reported lost.
func TestUnlockHeldUpPastTTLReleases(t *testing.T) {
	ctx := t.Context()
	srv := testserver.StartRedis(t)
	px := testserver.StartProxy(t, srv.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr(), ReadTimeout: 10 * time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	c := dlock.New(redislock.New(rdb), dlock.WithTTL(time.Second))
	defer c.Close()

	l, err := c.Mutex("unlock/late").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	px.RequestLatency(t, 2500*time.Millisecond, 0)
	err = l.Unlock(ctx)
	px.RequestLatency(t, 0, 0)
	if err != nil {
		t.Fatalf("Unlock whose release reached the store after the TTL = %v, want nil", err)
	}
	if !errors.Is(l.Err(), dlock.ErrReleased) {
		t.Fatalf("Err after Unlock = %v, want ErrReleased", l.Err())
	}
	inspect := redislock.New(srv.Client(t))
	if info, held, err := inspect.Inspect(ctx, "unlock/late"); err != nil || held {
		t.Fatalf("the lock is still on the store (%v, %v)", info, err)
	}

	gone, err := c.Mutex("unlock/deleted").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := inspect.ForceRelease(ctx, "unlock/deleted"); err != nil {
		t.Fatal(err)
	}
	if err := gone.Unlock(ctx); !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("Unlock of a hold deleted before it = %v, want ErrNotHeld and ErrLost", err)
	}
}
