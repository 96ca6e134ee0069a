package redislock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// handoffRig is a lock name held by one Client and waited for, in the
// store's fair queue, by a Lock of another Client (X), whose observer says
// whether its grant came from a handoff announcement.
type handoffRig struct {
	inner  *redislock.Backend // for Inspect
	holder *dlock.Lease
	out    chan *dlock.Lease // X's lease, nil when its Lock failed

	mu              sync.Mutex
	handed, granted bool
}

// queueBehindHolder locks name with opts on one Client and starts X's Lock
// of it (bounded by 20 s), returning once X's entry is in the queue.
func queueBehindHolder(t *testing.T, srv *testserver.Redis, name string, opts []dlock.Option) *handoffRig {
	t.Helper()
	ctx := t.Context()
	r := &handoffRig{inner: redislock.New(srv.Client(t)), out: make(chan *dlock.Lease, 1)}
	holder := dlock.New(redislock.New(srv.Client(t)))
	t.Cleanup(func() { _ = holder.Close() })
	x := dlock.New(redislock.New(srv.Client(t)), dlock.WithObserver(dlock.ObserverFunc(func(e dlock.Event) {
		if e.Kind == dlock.EventLockGranted && !e.TryLock {
			r.mu.Lock()
			r.handed, r.granted = e.Handoff, true
			r.mu.Unlock()
		}
	})))
	t.Cleanup(func() { _ = x.Close() })
	var err error
	if r.holder, err = holder.Mutex(name, opts...).Lock(ctx); err != nil {
		t.Fatal(err)
	}
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		l, err := x.Mutex(name, opts...).Lock(wctx)
		if err != nil {
			t.Errorf("X's Lock: %v", err)
		}
		r.out <- l
	}()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		info, _, err := r.inner.Inspect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if info.Queued > 0 {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatal("X never queued")
		}
	}
}

// release unlocks the holder's lease and returns X's lease (nil when its
// Lock failed) and whether it came from a handoff announcement.
func (r *handoffRig) release(t *testing.T) (l *dlock.Lease, handed bool) {
	t.Helper()
	if err := r.holder.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	l = <-r.out
	r.mu.Lock()
	defer r.mu.Unlock()
	if l != nil && !r.granted {
		t.Error("X's grant was not observed")
	}
	return l, r.handed
}

// queuedSignal wraps a Backend and signals each answer "queued" to a fair
// request (a waiter's queue entry made or refreshed).
type queuedSignal struct {
	*redislock.Backend
	queued chan struct{}
}

func newQueuedSignal(b *redislock.Backend) *queuedSignal {
	return &queuedSignal{Backend: b, queued: make(chan struct{}, 1)}
}

func (q *queuedSignal) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	res, err := q.Backend.Acquire(ctx, req)
	if err == nil && req.Fair && res.Queued {
		select {
		case q.queued <- struct{}{}:
		default:
		}
	}
	return res, err
}

// handoffObserver is an option for X's Client that records whether its
// last Lock was granted by a handoff announcement.
func handoffObserver() (dlock.Option, func() bool) {
	var mu sync.Mutex
	var handed bool
	return dlock.WithObserver(dlock.ObserverFunc(func(e dlock.Event) {
			if e.Kind == dlock.EventLockGranted && !e.TryLock {
				mu.Lock()
				handed = e.Handoff
				mu.Unlock()
			}
		})), func() bool {
			mu.Lock()
			defer mu.Unlock()
			return handed
		}
}

// handOverRightAfterRefresh has another Client hold name, starts x's Lock
// of it, and releases right after x's second "queued" answer (its first
// attempt, then a refresh: its subscription is up by then), so that x's
// head time S is about the handoff. It returns x's lease (nil when its
// Lock failed) and when Lock returned.
func handOverRightAfterRefresh(t *testing.T, srv *testserver.Redis, name string, opts []dlock.Option, x *dlock.Client, q *queuedSignal) (*dlock.Lease, time.Time) {
	t.Helper()
	ctx := t.Context()
	hc := dlock.New(redislock.New(srv.Client(t)))
	t.Cleanup(func() { _ = hc.Close() })
	hl, err := hc.Mutex(name, opts...).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		l  *dlock.Lease
		at time.Time
	}
	out := make(chan got, 1)
	go func() {
		l, err := x.Mutex(name, opts...).Lock(ctx)
		if err != nil {
			t.Errorf("Lock: %v", err)
		}
		out <- got{l, time.Now()}
	}()
	<-q.queued
	<-q.queued
	if err := hl.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	g := <-out
	return g.l, g.at
}

// TestHandedLeaseWithinStoreExpiry: the lease a queued waiter builds from
// a handoff announcement must not outlive the handed grant on the store
// (Lease.Deadline: "the store cannot have let the lease go before then").
// The grant expires with the head's queue entry, whose time to live is the
// handle's QueueTTL: 3 s for a plain Mutex with the default TTL, 1 s with
// TTL 3 s (the floor), 5 s for a Fair one; with a 40 s TTL a plain Mutex
// takes no handoff. A handedLease that used another time to live than the
// requests (say 5 s for a plain handle) fails here, and in no other test.
func TestHandedLeaseWithinStoreExpiry(t *testing.T) {
	srv := testserver.StartRedis(t)
	for _, tc := range []struct {
		name    string
		opts    []dlock.Option
		handoff bool
	}{
		{"plain", nil, true},
		{"plain TTL 3s", []dlock.Option{dlock.WithTTL(3 * time.Second)}, true},
		{"fair", []dlock.Option{dlock.Fair()}, true},
		{"plain TTL 40s", []dlock.Option{dlock.WithTTL(40 * time.Second)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "handedlease/" + tc.name
			r := queueBehindHolder(t, srv, name, tc.opts)
			// X subscribes to the name's releases after its first attempt:
			// give it time to, so that it hears the handoff. (Its entry
			// was refreshed within 50 ms, well within a quarter of it.)
			time.Sleep(50 * time.Millisecond)
			l, handed := r.release(t)
			if l == nil {
				return
			}
			defer l.Unlock(context.Background())
			info, _, err := r.inner.Inspect(t.Context(), name)
			if err != nil {
				t.Fatal(err)
			}
			storeExp := time.Now().Add(info.TTL) // after the answer: errs late, never early
			t.Logf("handed %v; store TTL %v; lease deadline in %v", handed, info.TTL.Round(time.Millisecond), time.Until(l.Deadline()).Round(time.Millisecond))
			if handed != tc.handoff {
				t.Errorf("granted by handoff: %v; want %v", handed, tc.handoff)
			}
			if l.Deadline().After(storeExp.Add(20 * time.Millisecond)) {
				t.Errorf("lease Deadline %v after the store's expiry of the grant (fence %d, store TTL %v)",
					l.Deadline().Sub(storeExp).Round(time.Millisecond), l.Fence(), info.TTL.Round(time.Millisecond))
			}
		})
	}
}

// TestPlainHandoffLateInRefreshCycle: a queued waiter can use a handoff
// announcement only within safe − QueueTTL/4 of its last fair request, and
// must refresh its entry within that window, or the grants released late
// in its refresh cycle are claimed with a request instead. A plain waiter
// (default TTL: entries of 3 s, margin 1 s, a 1.25 s window, refreshes
// every 1 s) and a Fair one (5 s entries, a 2.75 s window, refreshes every
// 1.67 s) are released to 950 ms after they queued, just before a plain
// refresh. (With entries of twice the margin and refreshes every third of
// them, a plain waiter lost such handoffs: 2 of 31 waits handed in a run
// of 4 clients holding 190 ms each.)
func TestPlainHandoffLateInRefreshCycle(t *testing.T) {
	srv := testserver.StartRedis(t)
	for _, tc := range []struct {
		name string
		opts []dlock.Option
	}{
		{"fair", []dlock.Option{dlock.Fair()}},
		{"plain", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := queueBehindHolder(t, srv, "handoffwindow/"+tc.name, tc.opts)
			time.Sleep(950 * time.Millisecond) // before the plain 1 s refresh
			l, handed := r.release(t)
			if l != nil {
				_ = l.Unlock(t.Context())
			}
			if !handed {
				t.Errorf("%s: the queued waiter did not take the handoff released to it 950 ms after it queued (claimed with a request)", tc.name)
			}
		})
	}
}
