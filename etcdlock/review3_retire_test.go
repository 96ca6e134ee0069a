package etcdlock_test

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/testserver"
)

// A lock left unrenewed (WithAutoRenew(false)) past its TTL makes the next
// acquire that needs the shared lease extended fail: forTTL passes
// extend's errRetired (the lease was just retired for the abandoned hold)
// back to the caller as a store error, instead of granting a fresh lease.
func TestReview3AcquireFailsWhenLeaseRetires(t *testing.T) {
	srv := testserver.StartEtcd(t)
	c := dlock.New(etcdlock.New(srv.Client(t)), dlock.WithTTL(time.Second))
	defer c.Close()
	left, err := c.Mutex("left", dlock.WithAutoRenew(false)).TryLock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer left.Unlock(t.Context())
	time.Sleep(1300 * time.Millisecond) // past left's TTL, within the lease's 2s
	l, err := c.Mutex("x").TryLock(t.Context())
	if err != nil {
		t.Fatalf("TryLock of a free lock failed: %v", err)
	}
	_ = l.Unlock(t.Context())
}
