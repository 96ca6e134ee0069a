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

// TestLeadershipProclaim checks that Proclaim changes the leader's value in
// place: the same fence and lease, the new value in Value, the lease's
// owner, another Client's Leader and its observer; that a bad value is
// refused; and that a lost or resigned leadership cannot proclaim.
func TestLeadershipProclaim(t *testing.T) {
	store := memlock.New()
	a := dlock.New(store, dlock.WithTTL(10*time.Second))
	defer a.Close()
	b := dlock.New(store)
	defer b.Close()

	ld, err := a.Election("e").Campaign(t.Context(), "v1")
	if err != nil {
		t.Fatal(err)
	}
	seen, err := b.Election("e").Observe(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got := recvLeader(t, seen); got.Value != "v1" {
		t.Fatalf("first observed = %+v, want v1", got)
	}
	fence, deadline := ld.Fence(), ld.Lease().Deadline()
	if err := ld.Proclaim(t.Context(), "v2 | zone b"); err != nil {
		t.Fatal(err)
	}
	if ld.Value() != "v2 | zone b" || ld.Fence() != fence || ld.Err() != nil || ld.Lease().Deadline().Before(deadline) {
		t.Fatalf("after Proclaim: value %q fence %d err %v; want v2, fence %d, still held", ld.Value(), ld.Fence(), ld.Err(), fence)
	}
	got, err := b.Election("e").Leader(t.Context())
	if err != nil || got.Value != "v2 | zone b" || got.Fence != fence || got.Owner != ld.Lease().Owner() {
		t.Fatalf("Leader after Proclaim = %+v, %v; want value v2, fence %d, owner %q", got, err, fence, ld.Lease().Owner())
	}
	if got := recvLeader(t, seen); got.Value != "v2 | zone b" || got.Fence != fence {
		t.Fatalf("observed after Proclaim = %+v, want v2 with fence %d", got, fence)
	}

	if err := ld.Proclaim(t.Context(), "bad\nvalue"); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Proclaim of a value with a control character = %v, want ErrInvalid", err)
	}
	if ld.Value() != "v2 | zone b" {
		t.Errorf("value after a refused Proclaim = %q, want v2 kept", ld.Value())
	}

	if _, _, err := store.ForceRelease(t.Context(), "e"); err != nil {
		t.Fatal(err)
	}
	if err := ld.Proclaim(t.Context(), "v3"); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Proclaim after the leadership was removed = %v, want ErrNotHeld", err)
	}
	if err := ld.Err(); !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("Err after a Proclaim found the leadership gone = %v, want ErrLost", err)
	}

	ld2, err := a.Election("e").Campaign(t.Context(), "w1")
	if err != nil {
		t.Fatal(err)
	}
	if err := ld2.Resign(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := ld2.Proclaim(t.Context(), "w2"); !errors.Is(err, dlock.ErrReleased) {
		t.Fatalf("Proclaim after Resign = %v, want ErrReleased", err)
	}
	if err := (&dlock.Leadership{}).Proclaim(t.Context(), "x"); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("Proclaim of a zero Leadership = %v, want ErrInvalid", err)
	}
}

// TestLeadershipProclaimRetriesTransient checks that Proclaim goes through
// a store outage that heals within the lease, as Unlock does.
func TestLeadershipProclaimRetriesTransient(t *testing.T) {
	store := memlock.New()
	c := dlock.New(store, dlock.WithTTL(10*time.Second))
	defer c.Close()
	ld, err := c.Election("e").Campaign(t.Context(), "v1")
	if err != nil {
		t.Fatal(err)
	}
	store.SetUnavailable(driver.Transient(errors.New("store restarting")))
	healed := time.AfterFunc(100*time.Millisecond, func() { store.SetUnavailable(nil) })
	defer healed.Stop()
	if err := ld.Proclaim(t.Context(), "v2"); err != nil {
		t.Fatalf("Proclaim through a short transient outage = %v, want nil", err)
	}
	if got, err := c.Election("e").Leader(t.Context()); err != nil || got.Value != "v2" {
		t.Fatalf("Leader = %+v, %v; want v2", got, err)
	}
}

// lateProclaims holds back the first proclaim it is given, answers it with
// an error (its outcome unknown to the caller), and delivers it when told:
// a request that lands after a later one.
type lateProclaims struct {
	*memlock.Backend
	held []driver.ProclaimRequest
}

func (s *lateProclaims) Proclaim(ctx context.Context, req driver.ProclaimRequest) (bool, error) {
	if len(s.held) == 0 {
		s.held = append(s.held, req)
		return false, errors.New("connection reset")
	}
	return s.Backend.Proclaim(ctx, req)
}

// TestLeadershipProclaimLateLandingHarmless checks that a proclaim whose
// answer was lost and that reaches the store after a later proclaim leaves
// the later value in place.
func TestLeadershipProclaimLateLandingHarmless(t *testing.T) {
	store := memlock.New()
	late := &lateProclaims{Backend: store}
	c := dlock.New(late, dlock.WithTTL(10*time.Second))
	defer c.Close()
	ld, err := c.Election("e").Campaign(t.Context(), "v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := ld.Proclaim(t.Context(), "v2"); err == nil {
		t.Fatal("Proclaim whose request was held back = nil, want the store's error")
	}
	if err := ld.Proclaim(t.Context(), "v3"); err != nil {
		t.Fatal(err)
	}
	if held, err := store.Proclaim(t.Context(), late.held[0]); err != nil || !held {
		t.Fatalf("late proclaim = %v, %v; want held, nil", held, err)
	}
	if got, err := c.Election("e").Leader(t.Context()); err != nil || got.Value != "v3" || ld.Value() != "v3" {
		t.Fatalf("Leader after a late proclaim = %+v, %v (Value %q); want v3", got, err, ld.Value())
	}
}
