package dlock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memlock"
)

// inspectSpy counts the Inspect calls that reach a memlock.
type inspectSpy struct {
	*memlock.Backend
	inspects atomic.Int32
}

func (s *inspectSpy) Inspect(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	s.inspects.Add(1)
	return s.Backend.Inspect(ctx, key)
}

// TestElectionObserveNotified checks that an observer of an election with a
// leader sleeps until the store announces a release, instead of polling,
// and sees the resignation of a leader of another Client at once.
func TestElectionObserveNotified(t *testing.T) {
	t.Parallel()
	store := memlock.New()
	spy := &inspectSpy{Backend: store}
	watcher := dlock.New(spy)
	defer watcher.Close()
	leader := dlock.New(store, dlock.WithTTL(10*time.Second))
	defer leader.Close()

	ld, err := leader.Election("e").Campaign(t.Context(), "v1")
	if err != nil {
		t.Fatal(err)
	}
	seen, err := watcher.Election("e").Observe(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got := recvLeader(t, seen); got.Value != "v1" || got.Fence != ld.Fence() {
		t.Fatalf("first observed = %+v, want v1", got)
	}
	before := spy.inspects.Load()
	time.Sleep(500 * time.Millisecond)
	if n := spy.inspects.Load() - before; n > 0 {
		t.Errorf("%d reads of the election in 500ms while its leader held it, want none (woken by releases)", n)
	}
	resigned := time.Now()
	if err := ld.Resign(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := recvLeader(t, seen); got.Fence != 0 {
		t.Fatalf("observed after the resignation = %+v, want no leader", got)
	}
	if took := time.Since(resigned); took > 200*time.Millisecond {
		t.Errorf("resignation observed after %v, want at once", took)
	}
}

// TestElectionObserveOwnCampaign checks that a campaign of the observer's
// own Client is seen at once, though the store announces no grant.
func TestElectionObserveOwnCampaign(t *testing.T) {
	c := dlock.New(memlock.New())
	defer c.Close()
	e := c.Election("e", dlock.WithRetry(dlock.ExponentialBackoff(time.Minute, time.Minute)))
	seen, err := e.Observe(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got := recvLeader(t, seen); got.Fence != 0 {
		t.Fatalf("first observed = %+v, want no leader", got)
	}
	ld, err := e.Campaign(t.Context(), "me")
	if err != nil {
		t.Fatal(err)
	}
	if got := recvLeader(t, seen); got.Value != "me" || got.Fence != ld.Fence() {
		t.Fatalf("observed = %+v, want me", got)
	}
}

// TestElectionCloseEndsObserve checks that Client.Close ends an observer
// (goleak in TestMain checks its goroutine) and closes its channel.
func TestElectionCloseEndsObserve(t *testing.T) {
	c := dlock.New(memlock.New())
	seen, err := c.Election("e").Observe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	recvLeader(t, seen)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case _, ok := <-seen:
		if ok {
			t.Fatal("Observe's channel gave a value after Close, want it closed")
		}
	case <-time.After(time.Second):
		t.Fatal("Observe's channel not closed by Close")
	}
	if _, err := c.Election("e").Observe(t.Context()); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("Observe after Close = %v, want ErrClosed", err)
	}
}

func TestElectionInvalid(t *testing.T) {
	c := dlock.New(memlock.New())
	defer c.Close()
	for name, e := range map[string]*dlock.Election{
		"Reentrant":    c.Election("e", dlock.Reentrant()),
		"WithOwnerID":  c.Election("e", dlock.WithOwnerID("me")),
		"empty name":   c.Election(""),
		"no Inspector": dlock.New(struct{ driver.Backend }{memlock.New()}).Election("e"),
	} {
		if _, err := e.Campaign(t.Context(), "v"); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("%s: Campaign = %v, want ErrInvalid", name, err)
		}
		if _, err := e.Leader(t.Context()); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("%s: Leader = %v, want ErrInvalid", name, err)
		}
		if _, err := e.Observe(t.Context()); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("%s: Observe = %v, want ErrInvalid", name, err)
		}
	}
	if _, err := c.Election("e").Campaign(t.Context(), "bad\nvalue"); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Campaign with a control character in the value = %v, want ErrInvalid", err)
	}
}

func recvLeader(t *testing.T, seen <-chan dlock.LeaderInfo) dlock.LeaderInfo {
	t.Helper()
	select {
	case got, ok := <-seen:
		if !ok {
			t.Fatal("Observe's channel closed")
		}
		return got
	case <-time.After(5 * time.Second):
		t.Fatal("Observe gave nothing within 5s")
		return dlock.LeaderInfo{}
	}
}

// TryCampaign makes one attempt: refused at once, naming the leader, while
// another leads; granted, with its value, when the election is free.
func TestElectionTryCampaign(t *testing.T) {
	store := memlock.New()
	a := dlock.New(store, dlock.WithTTL(10*time.Second))
	defer a.Close()
	b := dlock.New(store)
	defer b.Close()

	la, err := a.Election("e").Campaign(t.Context(), "a")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = b.Election("e").TryCampaign(t.Context(), "b")
	var no *dlock.NotObtainedError
	if !errors.As(err, &no) || no.Holder != la.Lease().Owner() {
		t.Fatalf("TryCampaign while a leads = %v; want a *NotObtainedError naming a", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("TryCampaign took %v; want one attempt", took)
	}
	if err := la.Resign(t.Context()); err != nil {
		t.Fatal(err)
	}
	lb, err := b.Election("e").TryCampaign(t.Context(), "b")
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Resign(t.Context())
	if got, err := a.Election("e").Leader(t.Context()); err != nil || got.Value != "b" || got.Fence != lb.Fence() {
		t.Errorf("Leader after TryCampaign = %+v, %v; want b", got, err)
	}
}
