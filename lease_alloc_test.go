package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memlock"
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
