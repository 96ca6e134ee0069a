package redlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
)

// newClient returns a dlock Client on a Backend of its own on servers.
func newClient(t *testing.T, servers []*testserver.Redis, opts ...dlock.Option) *dlock.Client {
	t.Helper()
	c := dlock.New(newBackend(t, servers), opts...)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func lostReason(t *testing.T, l *dlock.Lease) dlock.LostReason {
	t.Helper()
	var lost *dlock.LostError
	if !errors.As(l.Err(), &lost) {
		t.Fatalf("Err() = %v, want a *LostError", l.Err())
	}
	return lost.Reason
}

func waitDone(t *testing.T, l *dlock.Lease, limit time.Duration) {
	t.Helper()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case <-l.Done():
	case <-timer.C:
		t.Fatalf("lease still held after %v", limit)
	}
}

// A waiter that would otherwise not look again for an hour is woken by the
// release, also with one node down.
func TestWaiterWokenByRelease(t *testing.T) {
	for _, down := range []bool{false, true} {
		servers := startNodes(t, 3)
		if down {
			servers[0].Kill(t)
		}
		holder, waiter := newClient(t, servers), newClient(t, servers)
		held, err := holder.Mutex("k", dlock.WithTTL(time.Minute)).Lock(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			l, err := waiter.Mutex("k", dlock.WithRetry(dlock.ExponentialBackoff(time.Hour, time.Hour))).Lock(t.Context())
			if err == nil {
				err = l.Unlock(t.Context())
			}
			got <- err
		}()
		time.Sleep(200 * time.Millisecond) // let the waiter settle into its wait
		if err := held.Unlock(t.Context()); err != nil {
			t.Fatal(err)
		}
		timer := time.NewTimer(10 * time.Second)
		select {
		case err := <-got:
			if err != nil {
				t.Errorf("node down %v: waiter: %v", down, err)
			}
		case <-timer.C:
			t.Fatalf("node down %v: waiter not woken by the release", down)
		}
		timer.Stop()
	}
}

// A renewal that a quorum refuses ends the lease: the holder is told.
func TestRenewQuorumLossEndsLease(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	c := newClient(t, servers)
	const ttl = 600 * time.Millisecond
	l, err := c.Mutex("k", dlock.WithTTL(ttl)).Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(ttl / 2) // one renewal on all nodes
	if err := l.Err(); err != nil {
		t.Fatalf("lease lost with every node up: %v", err)
	}
	// One node losing the grant is not enough to lose the lease.
	nodes[0].Del(t.Context(), lockKey("k"))
	time.Sleep(ttl / 2)
	if err := l.Err(); err != nil {
		t.Fatalf("lease lost with a quorum still holding: %v", err)
	}
	nodes[1].Del(t.Context(), lockKey("k"))
	waitDone(t, l, 2*ttl)
	if r := lostReason(t, l); r != dlock.LostMissing {
		t.Errorf("reason %v, want %v", r, dlock.LostMissing)
	}
}

// With a majority unreachable, renewals fail and the lease ends before its
// validity does.
func TestMajorityDownEndsLease(t *testing.T) {
	servers := startNodes(t, 3)
	c := newClient(t, servers)
	const ttl = 600 * time.Millisecond
	l, err := c.Mutex("k", dlock.WithTTL(ttl)).Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	servers[0].Kill(t)
	servers[1].Kill(t)
	waitDone(t, l, 2*ttl)
	if now := time.Now(); !now.Before(l.Deadline()) {
		t.Errorf("lease ended %v after its deadline", now.Sub(l.Deadline()))
	}
	if r := lostReason(t, l); r != dlock.LostUnreachable {
		t.Errorf("reason %v, want %v", r, dlock.LostUnreachable)
	}
}

func TestLockDelay(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	a, b := newClient(t, servers), newClient(t, servers)
	const ttl, delay = 300 * time.Millisecond, 2 * time.Second
	opts := []dlock.Option{dlock.WithTTL(ttl), dlock.WithLockDelay(delay)}

	// A released lock is free at once.
	l, err := a.Mutex("released", opts...).Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	l, err = b.Mutex("released", opts...).TryLock(t.Context())
	if err != nil {
		t.Fatalf("TryLock after a release: %v", err)
	}
	_ = l.Unlock(t.Context())

	// An expired lease keeps the others out for the delay on a quorum.
	start := time.Now()
	l, err = a.Mutex("expired", append(opts, dlock.WithAutoRenew(false))...).Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, l, 2*ttl)
	for time.Since(start) < ttl+100*time.Millisecond {
		time.Sleep(10 * time.Millisecond) // until the lease has expired on every node
	}
	for i, f := range lockFields(t, nodes, "expired") {
		if len(f) == 0 {
			t.Errorf("node %d dropped the expired lock before its delay", i)
		}
	}
	if _, err := b.Mutex("expired", opts...).TryLock(t.Context()); !errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("TryLock during the lock-delay = %v, want ErrNotObtained", err)
	}
	got, err := b.Mutex("expired", opts...).Lock(t.Context())
	if err != nil {
		t.Fatalf("Lock after the delay: %v", err)
	}
	if took := time.Since(start); took < ttl+delay-100*time.Millisecond {
		t.Errorf("obtained %v after the first grant, before its TTL %v and delay %v ran out", took, ttl, delay)
	}
	if got.Fence() <= l.Fence() {
		t.Errorf("fence %d after %d", got.Fence(), l.Fence())
	}
	_ = got.Unlock(t.Context())
}

// The dlock client finds every capability of the backend.
func TestCapabilities(t *testing.T) {
	servers := startNodes(t, 1)
	var b driver.Backend = newBackend(t, servers)
	if cb, ok := b.(driver.Capabler); !ok || !cb.Supports(driver.CapLockDelay) {
		t.Error("no lock-delay capability")
	}
	if _, ok := b.(driver.Drifter); !ok {
		t.Error("not a Drifter")
	}
}
