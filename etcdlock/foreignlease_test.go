package etcdlock_test

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/testserver"
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
