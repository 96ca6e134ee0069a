package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

// wantExpired fails t unless err reports the lease lost at its deadline.
func wantExpired(t *testing.T, what string, err error) {
	t.Helper()
	var lost *dlock.LostError
	if !errors.As(err, &lost) || lost.Reason != dlock.LostExpired {
		t.Errorf("%s = %v; want a loss at the safe deadline", what, err)
	}
}

// wantClosed fails t unless d is closed.
func wantClosed(t *testing.T, what string, d <-chan struct{}) {
	t.Helper()
	select {
	case <-d:
	default:
		t.Errorf("%s is not closed past the safe deadline", what)
	}
}

// Past its safe deadline a lease reads as lost at once, whether or not the
// renewal goroutine has run since (it has not after a pause): Err, Done and
// a Context taken before.
func TestLeaseEndsWhenReadPastSafeDeadline(t *testing.T) {
	c := dlock.New(memlock.New(), dlock.WithTTL(time.Minute))
	defer c.Close()
	for _, read := range []string{"Err", "Done", "Context", "Context.Done"} {
		l, err := c.Mutex("paused/" + read).Lock(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		ctx := l.Context() // taken while held
		dlock.PassSafeDeadline(l)
		switch read {
		case "Err":
			wantExpired(t, "Err", l.Err())
		case "Done":
			wantClosed(t, "Done", l.Done())
		case "Context":
			wantExpired(t, "Context().Err", context.Cause(l.Context()))
			if l.Context().Err() == nil {
				t.Error("Context().Err() = nil past the safe deadline")
			}
		case "Context.Done":
			wantClosed(t, "the earlier Context's Done", ctx.Done())
		}
		if ctx.Err() == nil {
			t.Errorf("%s: the earlier Context's Err() = nil past the safe deadline", read)
		}
		wantExpired(t, read+": Err afterwards", l.Err())
	}
}

// fn's context in Do reads the safe deadline too.
func TestDoContextEndsWhenReadPastSafeDeadline(t *testing.T) {
	c := dlock.New(memlock.New(), dlock.WithTTL(time.Minute))
	defer c.Close()
	err := c.Do(t.Context(), "paused/do", func(ctx context.Context) error {
		l, _ := dlock.LeaseFromContext(ctx)
		dlock.PassSafeDeadline(l)
		if ctx.Err() == nil {
			t.Error("fn's ctx.Err() = nil past the safe deadline")
		}
		wantExpired(t, "context.Cause(fn's ctx)", context.Cause(ctx))
		return nil
	})
	if !errors.Is(err, dlock.ErrLost) {
		t.Errorf("Do = %v; want ErrLost", err)
	}
}

// A MultiLease and a Leadership read the safe deadlines of their leases.
func TestMultiAndLeadershipEndWhenReadPastSafeDeadline(t *testing.T) {
	c := dlock.New(memlock.New(), dlock.WithTTL(time.Minute))
	defer c.Close()

	ml, err := c.Multi([]string{"paused/a", "paused/b"}).Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ctx := ml.Context()
	dlock.PassSafeDeadline(ml.Lease("paused/b"))
	if ctx.Err() == nil {
		t.Error("MultiLease.Context().Err() = nil past a lease's safe deadline")
	}
	wantExpired(t, "MultiLease.Err", ml.Err())
	wantClosed(t, "MultiLease.Done", ml.Done())

	e := c.Election("paused/election")
	ld, err := e.Campaign(t.Context(), "v")
	if err != nil {
		t.Fatal(err)
	}
	dlock.PassSafeDeadline(ld.Lease())
	wantExpired(t, "Leadership.Err", ld.Err())
}

// context.Cause of a context taken while held gives the loss past the safe
// deadline, as its Err does, even when nothing has read Err or Done since:
// Lease.Context, fn's context in Do, MultiLease.Context. (Before Go 1.25
// context.Cause asks the context for its canceller without calling Err.)
func TestContextCauseWhenReadPastSafeDeadline(t *testing.T) {
	c := dlock.New(memlock.New(), dlock.WithTTL(time.Minute))
	defer c.Close()

	l, err := c.Mutex("paused/cause").Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ctx := l.Context()
	dlock.PassSafeDeadline(l)
	wantExpired(t, "context.Cause(Lease.Context())", context.Cause(ctx))

	err = c.Do(t.Context(), "paused/cause-do", func(ctx context.Context) error {
		l, _ := dlock.LeaseFromContext(ctx)
		dlock.PassSafeDeadline(l)
		wantExpired(t, "context.Cause(fn's ctx)", context.Cause(ctx))
		return nil
	})
	if !errors.Is(err, dlock.ErrLost) {
		t.Errorf("Do = %v; want ErrLost", err)
	}

	ml, err := c.Multi([]string{"paused/cause-a", "paused/cause-b"}).Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	mctx := ml.Context()
	dlock.PassSafeDeadline(ml.Lease("paused/cause-a"))
	wantExpired(t, "context.Cause(MultiLease.Context())", context.Cause(mctx))
}

// enteredRenew is a memlock store whose renewals signal entered and wait
// for gate: a renewal that is on the wire while the caller looks on.
type enteredRenew struct {
	*memlock.Backend
	entered, gate chan struct{}
}

func (b *enteredRenew) RenewGrant(ctx context.Context, key, token string, fence uint64, ttl time.Duration) (bool, error) {
	b.entered <- struct{}{}
	<-b.gate
	return b.Backend.RenewGrant(ctx, key, token, fence, ttl)
}

// A lease that a read found past its safe deadline while its Refresh was
// on the wire stays lost, and that Refresh says so rather than report a
// renewal of a lease its holder has already been told it lost.
func TestRefreshOfLeaseEndedMeanwhileFails(t *testing.T) {
	b := &enteredRenew{Backend: memlock.New(), entered: make(chan struct{}), gate: make(chan struct{})}
	c := dlock.New(b, dlock.WithTTL(time.Minute), dlock.WithAutoRenew(false))
	defer c.Close()
	l, err := c.Mutex("paused/refresh").Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	refreshed := make(chan error, 1)
	go func() { refreshed <- l.Refresh(t.Context()) }()
	<-b.entered
	dlock.PassSafeDeadline(l)
	if err := l.Err(); !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("Err while the Refresh is on the wire = %v; want ErrLost", err)
	}
	close(b.gate)
	if err := <-refreshed; !errors.Is(err, dlock.ErrNotHeld) || !errors.Is(err, dlock.ErrLost) {
		t.Errorf("Refresh of a lease lost meanwhile = %v; want ErrNotHeld and ErrLost", err)
	}
	if err := l.Err(); !errors.Is(err, dlock.ErrLost) {
		t.Errorf("Err after the Refresh = %v; want ErrLost", err)
	}
}
