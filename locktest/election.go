package locktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// testElection checks Client.Election across Clients, as separate processes
// would use it: one leader at a time, its value and fence read by others,
// an observer told of each change, a resignation that lets the next
// campaign in at once, and a leadership lost behind the leader's back that
// ends its context. A backend without driver.Inspector must refuse it.
func testElection(t *testing.T, s *Store) {
	const name = "locktest/election"
	if _, ok := s.NewBackend(t).(driver.Inspector); !ok {
		e := client(t, s).Election(name)
		if _, err := e.Campaign(t.Context(), "a"); !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("Campaign on a backend without Inspector = %v, want ErrInvalid", err)
		}
		if _, err := e.Leader(t.Context()); !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("Leader on a backend without Inspector = %v, want ErrInvalid", err)
		}
		return
	}
	a := client(t, s, dlock.WithTTL(ttl)).Election(name)
	// b's leadership is renewed past its TTL below: three times the
	// case's TTL, so that a loaded machine cannot hold its renewals back
	// past its deadline.
	const bTTL = 3 * ttl
	b := client(t, s, dlock.WithTTL(bTTL)).Election(name)
	watcher := client(t, s).Election(name)

	if _, err := watcher.Leader(t.Context()); !errors.Is(err, dlock.ErrNoLeader) {
		t.Fatalf("Leader of an empty election = %v, want ErrNoLeader", err)
	}
	octx, stop := context.WithCancel(t.Context())
	defer stop()
	seen, err := watcher.Observe(octx)
	if err != nil {
		t.Fatal(err)
	}
	if first := nextLeader(t, seen); first.Fence != 0 {
		t.Fatalf("Observe's first value = %+v, want no leader", first)
	}

	la, err := a.Campaign(t.Context(), "node a | zone 1")
	if err != nil {
		t.Fatal(err)
	}
	if got := nextLeader(t, seen); got.Value != "node a | zone 1" || got.Fence != la.Fence() {
		t.Fatalf("Observe after a's campaign = %+v, want value %q fence %d", got, "node a | zone 1", la.Fence())
	}
	if got, err := watcher.Leader(t.Context()); err != nil || got.Value != "node a | zone 1" || got.Fence != la.Fence() || got.Owner != la.Lease().Owner() {
		t.Fatalf("Leader = %+v, %v; want a's value, fence %d and owner %q", got, err, la.Fence(), la.Lease().Owner())
	}

	// A second campaigner waits; short campaigns fail naming the leader.
	// (Short, but long enough for a loaded machine's first attempt to come
	// back: a campaign that heard no answer cannot name anyone.)
	short, cancel := context.WithTimeout(t.Context(), time.Second)
	_, err = b.Campaign(short, "node b")
	cancel()
	var no *dlock.NotObtainedError
	if !errors.As(err, &no) || !errors.Is(err, context.DeadlineExceeded) || no.Holder != la.Lease().Owner() {
		t.Fatalf("Campaign while a leads = %v, want a *NotObtainedError naming a and DeadlineExceeded", err)
	}
	type result struct {
		ld  *dlock.Leadership
		err error
	}
	won := make(chan result, 1)
	go func() {
		ld, err := b.Campaign(t.Context(), "node b")
		won <- result{ld, err}
	}()
	time.Sleep(50 * time.Millisecond)
	select {
	case r := <-won:
		t.Fatalf("b won while a led: %v, %v", r.ld, r.err)
	default:
	}

	// Resigning lets b in at once (well within a's TTL) and ends a's context.
	resigned := time.Now()
	if err := la.Resign(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := context.Cause(la.Context()); !errors.Is(err, dlock.ErrReleased) {
		t.Fatalf("a's context after Resign: cause %v, want ErrReleased", err)
	}
	var lb *dlock.Leadership
	select {
	case r := <-won:
		if r.err != nil {
			t.Fatal(r.err)
		}
		lb = r.ld
	case <-time.After(5 * time.Second):
		t.Fatal("b did not win after a resigned")
	}
	if took := time.Since(resigned); hasNotifier(t, s) && took > ttl {
		t.Errorf("b won %v after a resigned, want within a TTL (%v)", took, ttl)
	}
	if lb.Fence() <= la.Fence() {
		t.Fatalf("b's fence %d is not above a's %d", lb.Fence(), la.Fence())
	}
	for got := nextLeader(t, seen); got.Fence != lb.Fence(); got = nextLeader(t, seen) {
		if got.Fence != 0 {
			t.Fatalf("Observe after b's win = %+v, want no leader or b (fence %d)", got, lb.Fence())
		}
	}
	if got, err := watcher.Leader(t.Context()); err != nil || got.Value != "node b" || got.Fence != lb.Fence() {
		t.Fatalf("Leader = %+v, %v; want b", got, err)
	}

	// The leadership is renewed past its TTL, then lost behind b's back.
	time.Sleep(bTTL * 3 / 2)
	if err := lb.Err(); err != nil {
		t.Fatalf("b's leadership ended while renewed: %v", err)
	}
	s.Delete(t, name)
	select {
	case <-lb.Context().Done():
		if !errors.Is(context.Cause(lb.Context()), dlock.ErrLost) {
			t.Fatalf("b's context ended with %v, want ErrLost", context.Cause(lb.Context()))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("b's leadership context did not end after it was deleted")
	}
	if got := nextLeader(t, seen); got.Fence != 0 {
		t.Fatalf("Observe after the leader was removed = %+v, want no leader", got)
	}
	if _, err := watcher.Leader(t.Context()); !errors.Is(err, dlock.ErrNoLeader) {
		t.Fatalf("Leader after the leader was removed = %v, want ErrNoLeader", err)
	}
	if err := lb.Resign(t.Context()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Resign of a lost leadership = %v, want ErrNotHeld", err)
	}

	stop()
	select {
	case _, open := <-seen:
		for open {
			_, open = <-seen
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Observe's channel not closed after its context ended")
	}
	noLeftoversWithin(t, s, 3*time.Second, name)
}

// nextLeader returns the next value an Observe channel gives, within 5s.
func nextLeader(t *testing.T, seen <-chan dlock.LeaderInfo) dlock.LeaderInfo {
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
