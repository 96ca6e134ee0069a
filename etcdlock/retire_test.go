package etcdlock_test

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/testserver"
)

// A lock left unrenewed (WithAutoRenew(false)) past its TTL retires the
// shared lease at the next acquire that needs the lease extended. That
// acquire must get a fresh lease, not fail with the retirement ("lease
// retired") as a store error.
func TestAcquireWhenLeaseRetires(t *testing.T) {
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
