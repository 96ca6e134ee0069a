package etcdlock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/testserver"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// slowLease makes lease grants take 300ms (a slow leader), honouring ctx.
type slowLease struct{ clientv3.Lease }

func (l slowLease) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	select {
	case <-time.After(300 * time.Millisecond):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return l.Lease.Grant(ctx, ttl)
}

// Two acquires need the same new lease; the second waits for the first's
// grant. When the first caller's ctx ends, the second must not fail with
// the first caller's ctx error while its own ctx is alive: one caller's
// cancellation is no store failure for another.
func TestOtherCallersCancelDoesNotFailAcquire(t *testing.T) {
	srv := testserver.StartEtcd(t)
	cli := srv.Client(t)
	cli.Lease = slowLease{cli.Lease}
	c := dlock.New(etcdlock.New(cli), dlock.WithTTL(time.Second))
	defer c.Close()

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		_, _ = c.Mutex("a").TryLock(ctx) // gives up while the grant is on its way
	}()
	time.Sleep(30 * time.Millisecond)
	l, err := c.Mutex("b").TryLock(t.Context()) // nobody cancels this one
	wg.Wait()
	if err != nil {
		t.Fatalf("TryLock(b) with a live ctx failed with another caller's ctx error: %v", err)
	}
	_ = l.Unlock(t.Context())
}
