package etcdlock_test

import (
	"flag"
	"fmt"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/testserver"
)

var (
	manyLocks = flag.Int("etcd.locks", 300, "TestKeepAlivesDoNotGrowWithLocks: the larger number of locks (the issue's figure: 10000)")
	manyTTL   = flag.Duration("etcd.ttl", time.Second, "TestKeepAlivesDoNotGrowWithLocks: the locks' TTL")
	manyHold  = flag.Duration("etcd.hold", 3*time.Second, "TestKeepAlivesDoNotGrowWithLocks: how long the locks are held")
)

// One Client's auto-renewed locks share a lease: the keep-alives sent per
// interval do not grow with the number of locks, and none is lost. With
// -etcd.locks 10000 -etcd.ttl 5s -etcd.hold 15s it is the run of
// docs/ETCD.md.
func TestKeepAlivesDoNotGrowWithLocks(t *testing.T) {
	srv := testserver.StartEtcd(t)
	ttl := *manyTTL
	for _, n := range []int{10, *manyLocks} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			b := etcdlock.New(srv.Client(t), etcdlock.WithNamespace(fmt.Sprintf("ka%d/", n)))
			keepAlives, grants := etcdlock.CountLeaseCalls(b)
			c := dlock.New(b, dlock.WithTTL(ttl))
			defer c.Close()
			leases := make([]*dlock.Lease, n)
			for i := range leases {
				l, err := c.Mutex(fmt.Sprintf("lock-%d", i)).TryLock(t.Context())
				if err != nil {
					t.Fatalf("TryLock %d: %v", i, err)
				}
				leases[i] = l
			}
			start := keepAlives.Load()
			hold := *manyHold
			time.Sleep(hold)
			sent := keepAlives.Load() - start
			for i, l := range leases {
				if err := l.Err(); err != nil {
					t.Fatalf("lease %d lost: %v", i, err)
				}
				if err := l.Unlock(t.Context()); err != nil {
					t.Fatalf("Unlock %d: %v", i, err)
				}
			}
			// The lease (living 1.5 TTL, at least TTL + 1s) needs a
			// keep-alive about every half TTL at most: some 6 in 3s for a
			// TTL of 1s, whatever the number of locks. Allow twice that.
			t.Logf("%d locks for %v: %d keep-alives, %d lease grants", n, hold, sent, grants.Load())
			if limit := int64(2*hold/(ttl/2)) + 2; sent > limit {
				t.Errorf("%d keep-alives for %d locks in %v, want at most %d", sent, n, hold, limit)
			}
			if g := grants.Load(); g != 1 {
				t.Errorf("%d lease grants, want 1", g)
			}
		})
	}
}

// A lock that its holder stops renewing expires on the store even though
// it shares its lease with locks that are renewed: the lease is retired and
// the renewed locks move to a fresh one, keeping their fences.
func TestUnrenewedLockExpiresOnSharedLease(t *testing.T) {
	srv := testserver.StartEtcd(t)
	b := etcdlock.New(srv.Client(t))
	c := dlock.New(b, dlock.WithTTL(time.Second))
	defer c.Close()
	kept := lockNow(t, c.Mutex("kept"))
	left := lockNow(t, c.Mutex("left", dlock.WithAutoRenew(false)))

	other := dlock.New(etcdlock.New(srv.Client(t)))
	defer other.Close()
	// "left" must become free on the store: its TTL (1s) rounded to the
	// lease (2s), plus etcd's expiry check (up to 0.5s), plus a retired
	// lease's remaining life.
	deadline := time.Now().Add(6 * time.Second)
	for {
		l, err := other.Mutex("left").TryLock(t.Context())
		if err == nil {
			if l.Fence() <= left.Fence() {
				t.Errorf("fence %d after %d", l.Fence(), left.Fence())
			}
			_ = l.Unlock(t.Context())
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lock without renewal still held on the store after 6s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := left.Err(); err == nil {
		t.Error("the unrenewed lease is still shown as held")
	}
	if err := kept.Err(); err != nil {
		t.Fatalf("the renewed lock was lost: %v", err)
	}
	if _, err := other.Mutex("kept").TryLock(t.Context()); err == nil {
		t.Fatal("the renewed lock is free on the store")
	}
	info, ok, err := b.Inspect(t.Context(), "kept")
	if err != nil || !ok || info.Fence != kept.Fence() {
		t.Errorf("Inspect(kept) = %+v, %v, %v; want fence %d", info, ok, err, kept.Fence())
	}
	if err := kept.Unlock(t.Context()); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
}

func lockNow(t *testing.T, m *dlock.Mutex) *dlock.Lease {
	t.Helper()
	l, err := m.TryLock(t.Context())
	if err != nil {
		t.Fatalf("TryLock(%q): %v", m.Name(), err)
	}
	return l
}
