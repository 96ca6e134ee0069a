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
