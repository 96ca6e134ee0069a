package etcdlock

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// countingLease counts the keep-alives, grants and revocations sent
// through it.
type countingLease struct {
	clientv3.Lease
	keepAlives, grants *atomic.Int64
	revoked            chan<- clientv3.LeaseID // nil: not reported
}

func (c countingLease) Revoke(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseRevokeResponse, error) {
	resp, err := c.Lease.Revoke(ctx, id)
	if err == nil && c.revoked != nil {
		select {
		case c.revoked <- id:
		default:
		}
	}
	return resp, err
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
	b.leases.kv = countingLease{b.leases.kv, keepAlives, grants, nil}
	return keepAlives, grants
}

// ReportRevokes makes b send the id of every lease it revokes to the
// returned channel (which holds 16; more are dropped). Call it before b is
// used.
func ReportRevokes(b *Backend) <-chan clientv3.LeaseID {
	ch := make(chan clientv3.LeaseID, 16)
	b.leases.kv = countingLease{b.leases.kv, new(atomic.Int64), new(atomic.Int64), ch}
	return ch
}

// WaitRevokes waits for b's revocations in flight.
func WaitRevokes(b *Backend) { b.leases.revokes.Wait() }

// grantHook runs fn once, before the first lease grant sent through it.
type grantHook struct {
	clientv3.Lease
	once *sync.Once
	fn   func()
}

func (g grantHook) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	g.once.Do(g.fn)
	return g.Lease.Grant(ctx, ttl)
}

// BeforeFirstLeaseGrant makes b run fn before the first lease grant it
// sends from now on: a step that lands between a read and the write that
// follows it on the store. Call it before b is used.
func BeforeFirstLeaseGrant(b *Backend, fn func()) {
	b.leases.kv = grantHook{b.leases.kv, new(sync.Once), fn}
}

// slowKeepAlive makes every keep-alive take delay before it is sent (a
// member that answers slowly), honouring ctx, and counts them.
type slowKeepAlive struct {
	clientv3.Lease
	delay time.Duration
	n     *atomic.Int64
}

func (s slowKeepAlive) KeepAliveOnce(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseKeepAliveResponse, error) {
	s.n.Add(1)
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.Lease.KeepAliveOnce(ctx, id)
}

// SlowKeepAlives makes each of the two calls of b's keep-alives (the
// keep-alive and the read of the Raft term that confirms it) take delay
// more from now on, and returns the count of keep-alives. Call it before b
// is used.
func SlowKeepAlives(b *Backend, delay time.Duration) *atomic.Int64 {
	n := new(atomic.Int64)
	b.leases.kv = slowKeepAlive{b.leases.kv, delay, n}
	term := b.leases.term
	b.leases.term = func(ctx context.Context) (uint64, error) {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		return term(ctx)
	}
	return n
}
