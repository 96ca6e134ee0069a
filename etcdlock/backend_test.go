package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/test/testserver"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A namespace is a directory: names follow it directly, so a namespace
// that does not end with '/' would share keys with another namespace's
// names ("app/x" + "y" is "app/" + "xy"). Such a backend grants nothing,
// and says why; "" (no prefix at all) and "app/x/" work.
func TestNamespaceMustEndWithSlash(t *testing.T) {
	srv := testserver.StartEtcd(t)
	cli := srv.Client(t)
	c := dlock.New(etcdlock.New(cli, etcdlock.WithNamespace("app/x")))
	defer c.Close()
	if l, err := c.Mutex("y").TryLock(t.Context()); !errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("TryLock under namespace app/x: lease %v, err %v; want ErrInvalid", l, err)
	}
	for _, ns := range []string{"app/x/", ""} {
		c := dlock.New(etcdlock.New(cli, etcdlock.WithNamespace(ns)))
		l, err := c.Mutex("y").TryLock(t.Context())
		if err != nil {
			t.Fatalf("TryLock under namespace %q: %v", ns, err)
		}
		if err := l.Unlock(t.Context()); err != nil {
			t.Fatalf("Unlock under namespace %q: %v", ns, err)
		}
		c.Close()
	}
}

// A handle with an owner ID but not Reentrant holds at most once: a second
// Lock of the same ID, in another process, waits like any other owner (as
// on Redis). Were it handed the first one's grant, the first one's Unlock
// would free the lock under it, and a third owner would hold it too.
func TestOwnerIDWithoutReentrantIsRefusedWhileHeld(t *testing.T) {
	srv := testserver.StartEtcd(t)
	x := dlock.New(etcdlock.New(srv.Client(t)))
	defer x.Close()
	y := dlock.New(etcdlock.New(srv.Client(t)))
	defer y.Close()
	z := dlock.New(etcdlock.New(srv.Client(t)))
	defer z.Close()
	ctx := t.Context()
	const name = "ownerid/not-reentrant"
	lx, err := x.Mutex(name, dlock.WithOwnerID("job-9")).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ly, err := y.Mutex(name, dlock.WithOwnerID("job-9")).TryLock(ctx)
	if err == nil {
		defer ly.Unlock(ctx)
		if err := lx.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if lz, err := z.Mutex(name).TryLock(ctx); err == nil {
			defer lz.Unlock(ctx)
			t.Fatalf("two holders: the second TryLock of the owner ID was granted (fence %d, lease %v), and after the first one's Unlock another owner too (fence %d)", ly.Fence(), ly.Err(), lz.Fence())
		}
		t.Fatalf("the second TryLock of the owner ID was granted (fence %d) while the first held the lock (fence %d)", ly.Fence(), lx.Fence())
	}
	if !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("the second TryLock: %v, want ErrNotObtained", err)
	}
	_ = lx.Unlock(ctx)
}

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

// delayedLease answers every lease grant after delay (a loaded member),
// honouring ctx, and counts the grants sent.
type delayedLease struct {
	clientv3.Lease
	delay time.Duration
	sent  *atomic.Int64
}

func (l delayedLease) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	l.sent.Add(1)
	select {
	case <-time.After(l.delay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return l.Lease.Grant(ctx, ttl)
}

// A member that answers every lease grant in 700 ms, more than one call's
// base bound (500 ms with the default call timeout), as a loaded member
// does: the acquires that need a new lease are granted, and the grants are
// not sent again and again, each copy adding to the load that made the
// member slow.
func TestSlowMemberCallsNotMultiplied(t *testing.T) {
	srv := testserver.StartEtcd(t)
	cli := srv.Client(t)
	var sent atomic.Int64
	cli.Lease = delayedLease{cli.Lease, 700 * time.Millisecond, &sent}
	b := etcdlock.New(cli)
	const n = 4
	for i := range n {
		// A TTL each: a lease each.
		req := driver.AcquireRequest{Key: fmt.Sprint("k", i), Token: fmt.Sprint("t", i), Owner: "o", TTL: time.Duration(i+1) * time.Second}
		res, err := b.Acquire(t.Context(), req)
		if err != nil || !res.Acquired {
			t.Fatalf("acquire %d with grants answered in 700 ms: %+v, %v (%d grants sent)", i, res, err, sent.Load())
		}
	}
	t.Logf("%d acquires needing a lease each: %d grants sent", n, sent.Load())
	if got := sent.Load(); got > n+1 {
		t.Errorf("%d grants sent for %d leases, want at most %d: each copy cut short is run by the member all the same", got, n, n+1)
	}
}

// A member that answers every lease grant in 1.5 s, more than one call's
// longest attempt (1 s with the default call timeout): a waiting call's
// acquire is granted with one grant, where each grant cut short at an
// attempt's bound and sent again was one more lease for the member to make,
// and none was ever answered in time.
func TestSlowMemberWaitingAcquireSendsOneGrant(t *testing.T) {
	srv := testserver.StartEtcd(t)
	cli := srv.Client(t)
	var sent atomic.Int64
	cli.Lease = delayedLease{cli.Lease, 1500 * time.Millisecond, &sent}
	b := etcdlock.New(cli)
	for _, fair := range []bool{false, true} {
		before := sent.Load()
		req := driver.AcquireRequest{Key: fmt.Sprint("k", fair), Token: fmt.Sprint("t", fair), Owner: "o", TTL: 10 * time.Second, Fair: fair, Wait: true, QueueTTL: 5 * time.Second}
		res, err := b.Acquire(t.Context(), req)
		if err != nil || !res.Acquired {
			t.Fatalf("waiting acquire (fair %v) with grants answered in 1.5 s: %+v, %v (%d grants sent)", fair, res, err, sent.Load()-before)
		}
		// One lease each: the TTL's, then (fair) the queue entries'.
		if got := sent.Load() - before; got != 1 {
			t.Errorf("waiting acquire (fair %v): %d grants sent, want 1", fair, got)
		}
	}
}
