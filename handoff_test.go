package dlock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memlock"
)

// earlyHandoff is a memlock that claims driver.CapHandoff and, when armed,
// announces a handoff to the token of a queued request before that
// request's answer reaches the client: the announcement comes before the
// waiter waits.
type earlyHandoff struct {
	*memlock.Backend
	mu       sync.Mutex
	fn       func(key, next string)
	armed    bool
	acquires int
}

func (e *earlyHandoff) Supports(c driver.Capability) bool {
	return c == driver.CapHandoff || e.Backend.Supports(c)
}

func (e *earlyHandoff) Listen(ctx context.Context, fn func(key, next string)) (driver.Listener, error) {
	e.mu.Lock()
	e.fn = fn
	e.mu.Unlock()
	return e.Backend.Listen(ctx, fn)
}

func (e *earlyHandoff) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	res, err := e.Backend.Acquire(ctx, req)
	e.mu.Lock()
	e.acquires++
	fn, armed := e.fn, e.armed && req.Handoff && res.Queued
	if armed {
		e.armed = false
	}
	e.mu.Unlock()
	if armed && fn != nil {
		fn(req.Key, driver.Handoff{Token: req.Token, Fence: 99}.Next())
	}
	return res, err
}

// TestHandoffHeardBeforeTheWait: a handoff announced between a waiter's
// first attempt and its wait is not lost: Lock completes from it at once,
// without a request, rather than at the waiter's next queue refresh.
func TestHandoffHeardBeforeTheWait(t *testing.T) {
	store := &earlyHandoff{Backend: memlock.New()}
	holder, waiter := dlock.New(store.Backend), dlock.New(store)
	defer holder.Close()
	defer waiter.Close()
	ctx := t.Context()
	opts := []dlock.Option{dlock.Fair(), dlock.WithTTL(3 * time.Second)} // queue refresh every 1s
	h, err := holder.Mutex("k", opts...).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A first wait opens the Client's subscription, which lingers.
	go func() { time.Sleep(50 * time.Millisecond); _ = h.Unlock(ctx) }()
	l, err := waiter.Mutex("k", opts...).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Unlock(ctx)

	if h, err = holder.Mutex("k", opts...).Lock(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Unlock(ctx) }()
	store.mu.Lock()
	store.armed, store.acquires = true, 0
	store.mu.Unlock()
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	l, err = waiter.Mutex("k", opts...).Lock(wctx)
	if err != nil {
		t.Fatalf("Lock with a handoff announced before the wait: %v", err)
	}
	took := time.Since(start)
	store.mu.Lock()
	n := store.acquires
	store.mu.Unlock()
	if l.Fence() != 99 {
		t.Errorf("fence %d, want the handed grant's 99", l.Fence())
	}
	if took > 500*time.Millisecond || n != 1 {
		t.Errorf("Lock took %v and %d acquire requests; want the announcement used at once, with the first request only", took, n)
	}
}

// handoffRecorder is a memlock that claims driver.CapHandoff and records
// which waiting requests accepted a handoff, and their entries' TTLs.
type handoffRecorder struct {
	*memlock.Backend
	mu            sync.Mutex
	fairHandoff   int // queued fair requests with Handoff
	fairNoHandoff int // queued fair requests without
	queueTTLs     map[time.Duration]int
}

func (r *handoffRecorder) Supports(c driver.Capability) bool {
	return c == driver.CapHandoff || r.Backend.Supports(c)
}

func (r *handoffRecorder) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	r.mu.Lock()
	if req.Fair && req.Wait {
		if req.Handoff {
			r.fairHandoff++
		} else {
			r.fairNoHandoff++
		}
		if r.queueTTLs == nil {
			r.queueTTLs = make(map[time.Duration]int)
		}
		r.queueTTLs[req.QueueTTL]++
	}
	r.mu.Unlock()
	return r.Backend.Acquire(ctx, req)
}

// TestHandoffForFairAndQueuedPlain: a Fair Mutex's waits accept a direct
// handoff, and so do a plain Mutex's once they queue, with entries of
// three times the safety margin (a head that died holds the lock up that
// long at most), unless the margin leaves a handed lease too little time; a
// reentrant handle's do not.
func TestHandoffForFairAndQueuedPlain(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	for _, tc := range []struct {
		name     string
		opts     []dlock.Option
		want     bool
		queueTTL time.Duration
	}{
		{"plain", nil, true, 3 * time.Second},
		{"plain, TTL 3s", []dlock.Option{dlock.WithTTL(3 * time.Second)}, true, time.Second},
		{"plain, margin 4s", []dlock.Option{dlock.WithSafetyMargin(4 * time.Second)}, false, 5 * time.Second},
		{"plain, TTL 30s", []dlock.Option{dlock.WithTTL(30 * time.Second)}, false, 5 * time.Second},
		{"plain, TTL 28s", []dlock.Option{dlock.WithTTL(28 * time.Second)}, true, 5 * time.Second},
		{"fair reentrant", []dlock.Option{dlock.Fair(), dlock.Reentrant()}, false, 5 * time.Second},
		{"fair", []dlock.Option{dlock.Fair()}, true, 5 * time.Second},
	} {
		store := &handoffRecorder{Backend: memlock.New()}
		holder, waiter := dlock.New(store), dlock.New(store)
		h, err := holder.Mutex("k", tc.opts...).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		if l, err := waiter.Mutex("k", tc.opts...).Lock(wctx); err == nil { // waits, starves, queues
			_ = l.Unlock(ctx)
			t.Fatalf("%s: Lock of a held lock succeeded", tc.name)
		}
		cancel()
		_ = h.Unlock(ctx)
		store.mu.Lock()
		with, without, ttls := store.fairHandoff, store.fairNoHandoff, store.queueTTLs
		store.mu.Unlock()
		switch {
		case with+without == 0:
			t.Errorf("%s: no queued request: the case tests nothing", tc.name)
		case tc.want && without > 0, !tc.want && with > 0:
			t.Errorf("%s: %d queued requests with Handoff, %d without; want Handoff %v", tc.name, with, without, tc.want)
		}
		if len(ttls) != 1 || ttls[tc.queueTTL] == 0 {
			t.Errorf("%s: queued requests' QueueTTLs %v; want all %v", tc.name, ttls, tc.queueTTL)
		}
		_ = holder.Close()
		_ = waiter.Close()
	}
}
