package etcdlock

import (
	"context"
	"sync/atomic"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// countingLease counts the keep-alives and grants sent through it.
type countingLease struct {
	clientv3.Lease
	keepAlives, grants *atomic.Int64
}

func (c countingLease) KeepAliveOnce(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseKeepAliveResponse, error) {
	c.keepAlives.Add(1)
	return c.Lease.KeepAliveOnce(ctx, id)
}

func (c countingLease) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	c.grants.Add(1)
	return c.Lease.Grant(ctx, ttl)
}

// CountLeaseCalls makes b count the keep-alives and lease grants it sends
// from now on. Call it before b is used.
func CountLeaseCalls(b *Backend) (keepAlives, grants *atomic.Int64) {
	keepAlives, grants = new(atomic.Int64), new(atomic.Int64)
	b.leases.kv = countingLease{b.leases.kv, keepAlives, grants}
	return keepAlives, grants
}
