package etcdlock_test

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/testserver"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A process holds "k" with owner ID X on a lease of 1s (living 2s), then
// dies. A second process with the same owner ID re-enters with a TTL of
// 10s: its lease's deadline is 10s away. The key must not stay on the dead
// process's 2s lease (a keep-alive of that lease extends it by 2s only, and
// the key would expire long before the second holder's deadline, letting a
// third process in while the second still believes it holds the lock): the
// re-entry moves it onto a lease of the second process's.
func TestReentryOnForeignLeaseKeepsItsTTL(t *testing.T) {
	srv := testserver.StartEtcd(t)
	dead := etcdlock.New(srv.Client(t))
	if res, err := dead.Acquire(t.Context(), driver.AcquireRequest{Key: "k", Token: "X", Owner: "dead", TTL: time.Second, Reentrant: true}); err != nil || !res.Acquired {
		t.Fatalf("Acquire: %+v, %v", res, err)
	}
	// The process dies: no renewal, no release.

	b := dlock.New(etcdlock.New(srv.Client(t)))
	defer b.Close()
	lb, err := b.Mutex("k", dlock.WithOwnerID("X"), dlock.Reentrant(), dlock.WithTTL(10*time.Second)).TryLock(t.Context())
	if err != nil {
		t.Fatalf("re-entry: %v", err)
	}
	defer lb.Unlock(t.Context())
	t.Logf("re-entered: fence %d, deadline in %v", lb.Fence(), time.Until(lb.Deadline()).Round(time.Millisecond))

	c := dlock.New(etcdlock.New(srv.Client(t)))
	defer c.Close()
	until := time.Now().Add(6 * time.Second)
	for time.Now().Before(until) {
		lc, err := c.Mutex("k", dlock.WithTTL(time.Second)).TryLock(t.Context())
		if err == nil {
			held := lb.Err() == nil
			left := time.Until(lb.Deadline())
			_ = lc.Unlock(t.Context())
			if held {
				t.Fatalf("two holders: a third process got fence %d while the re-entered lease (fence %d) is held, %v before its deadline",
					lc.Fence(), lb.Fence(), left.Round(time.Millisecond))
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A process that dies leaves two grants on its shared lease: "k" with
// owner ID X and "other". Another process holds "k" with the same owner
// ID; it must not keep the dead process's lease alive for it, or "other",
// which nobody holds any more, would never expire.
func TestForeignLeaseNotKeptAlive(t *testing.T) {
	srv := testserver.StartEtcd(t)
	dead := etcdlock.New(srv.Client(t))
	for _, r := range []driver.AcquireRequest{
		{Key: "k", Token: "X", Owner: "dead", TTL: time.Second, Reentrant: true},
		{Key: "other", Token: "o", Owner: "dead", TTL: time.Second},
	} {
		if res, err := dead.Acquire(t.Context(), r); err != nil || !res.Acquired {
			t.Fatalf("Acquire %s: %+v, %v", r.Key, res, err)
		}
	}

	b := dlock.New(etcdlock.New(srv.Client(t)))
	defer b.Close()
	lb, err := b.Mutex("k", dlock.WithOwnerID("X"), dlock.Reentrant(), dlock.WithTTL(time.Second)).TryLock(t.Context())
	if err != nil {
		t.Fatalf("re-entry: %v", err)
	}
	defer lb.Unlock(t.Context())

	c := dlock.New(etcdlock.New(srv.Client(t)))
	defer c.Close()
	// "other" was granted for 1s on a lease of 2s: free within ~3s.
	until := time.Now().Add(8 * time.Second)
	for time.Now().Before(until) {
		if l, err := c.Mutex("other").TryLock(t.Context()); err == nil {
			_ = l.Unlock(t.Context())
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("\"other\", abandoned by a dead process with a 1s TTL, is still held after 8s (lease kept alive by another Backend's renewal of \"k\"); lb err=%v", lb.Err())
}

// A renewal that finds its grant on another Backend's lease (the owner ID
// shared with another process) moves it onto a lease of its own, and that
// lease must cover the other holder's TTL as well as the renewal's: the
// other process's holder counts on its own TTL until its next renewal, and
// the key must not expire before then. For an exclusive grant and for a
// shared hold.
func TestForeignGrantMovesToLeaseOfLongestTTL(t *testing.T) {
	srv := testserver.StartEtcd(t)
	admin := srv.Client(t)
	a := etcdlock.New(srv.Client(t))
	b := etcdlock.New(srv.Client(t))
	for _, tc := range []struct {
		mode driver.Mode
		key  string
	}{
		{driver.Exclusive, "dlock/e\x00e"},
		{driver.Shared, "dlock/s\x00s\x00X"},
	} {
		name := tc.key[len("dlock/") : len("dlock/")+1]
		if res, err := a.Acquire(t.Context(), driver.AcquireRequest{Key: name, Token: "X", Owner: "a", TTL: 6 * time.Second, Mode: tc.mode, Reentrant: true}); err != nil || !res.Acquired {
			t.Fatalf("Acquire %s: %+v, %v", name, res, err)
		}
		before, err := admin.Get(t.Context(), tc.key)
		if err != nil || len(before.Kvs) != 1 {
			t.Fatalf("Get %q: %v, %v", tc.key, before, err)
		}
		if held, err := b.Renew(t.Context(), name, "X", time.Second); err != nil || !held {
			t.Fatalf("Renew %s from the other Backend: %v, %v", name, held, err)
		}
		after, err := admin.Get(t.Context(), tc.key)
		if err != nil || len(after.Kvs) != 1 {
			t.Fatalf("Get %q after the renewal: %v, %v", tc.key, after, err)
		}
		kv := after.Kvs[0]
		if kv.Lease == before.Kvs[0].Lease {
			t.Errorf("%s: still on the other Backend's lease after the renewal", name)
		}
		if kv.CreateRevision != before.Kvs[0].CreateRevision {
			t.Errorf("%s: create revision (fence) %d, was %d", name, kv.CreateRevision, before.Kvs[0].CreateRevision)
		}
		ttl, err := admin.TimeToLive(t.Context(), clientv3.LeaseID(kv.Lease))
		if err != nil {
			t.Fatal(err)
		}
		if ttl.TTL < 6 {
			t.Errorf("%s: moved to a lease with %ds left (granted %ds), less than the other holder's TTL of 6s", name, ttl.TTL, ttl.GrantedTTL)
		}
	}
}
