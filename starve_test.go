package dlock_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memlock"
	"github.com/dlock-go/dlock/sqllock"
)

// TestPlainMutexDoesNotStarveWaiters runs four owners, each with a Client of
// its own, on one name with a plain (not Fair) Mutex; each holds the lock
// briefly and locks again at once. The owner that just released would win
// nearly every race against waiters that must first hear of the release;
// waiters that starve join the store's queue, and then every owner queues,
// so each gets a fair share. It asserts shares, not speed.
func TestPlainMutexDoesNotStarveWaiters(t *testing.T) {
	t.Parallel()
	const owners = 4
	store := memlock.New()
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	grants := make([]int, owners)
	var longest time.Duration
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range owners {
		c := dlock.New(store)
		defer c.Close()
		m := c.Mutex("hot")
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				start := time.Now()
				l, err := m.Lock(ctx)
				if err != nil {
					return
				}
				waited := time.Since(start)
				for end := time.Now().Add(200 * time.Microsecond); time.Now().Before(end); {
				}
				if err := l.Unlock(context.Background()); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				grants[i]++
				longest = max(longest, waited)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	total := 0
	for _, g := range grants {
		total += g
	}
	t.Logf("grants per owner %v, longest wait %v", grants, longest)
	if total < 40*owners {
		t.Fatalf("only %d grants in 1.5s; want at least %d to judge the shares", total, 40*owners)
	}
	for i, g := range grants {
		if g < total/owners/3 {
			t.Errorf("owner %d got %d of %d grants; want at least a third of an even share (%d)", i, g, total, total/owners/3)
		}
	}
}

// TestPlainMutexDoesNotWaitOnDeadHead: a waiter that died leaves its queue
// entry for up to five seconds. A plain Mutex that learned of the queue
// queues behind it, but takes the free lock without the queue after a short
// grace instead of waiting the entry out; its TryLock ignores the queue.
func TestPlainMutexDoesNotWaitOnDeadHead(t *testing.T) {
	t.Parallel()
	store := memlock.New()
	ctx := context.Background()
	holder := dlock.New(store)
	defer holder.Close()
	h, err := holder.Mutex("k").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A fair waiter queues, then its process dies: its entry stays.
	if res, err := store.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: "dead", Owner: "dead",
		TTL: time.Minute, Fair: true, Wait: true, QueueTTL: 5 * time.Second}); err != nil || !res.Queued {
		t.Fatalf("queueing the dead waiter: %+v, %v", res, err)
	}
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	c := dlock.New(store)
	defer c.Close()
	m := c.Mutex("k")
	for i := range 3 {
		start := time.Now()
		l, err := m.Lock(ctxTimeout(t, 3*time.Second))
		if err != nil {
			t.Fatalf("Lock %d on a free lock with a dead head queued: %v after %v", i, err, time.Since(start))
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("Lock %d took %v", i, time.Since(start))
	}
	l, err := m.TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock on a free lock with a dead head queued: %v", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestClaimingWriterKeepsReadersOut: a plain Mutex waiting for readers on
// SQLite claims the next grant once it starves, and keeps its writer intent
// all the while with the full queue TTL, not the claim's 500 ms: one of its
// statements that takes 1.5 s (a loaded machine) does not let a reader that
// came after it in. The late reader gets its lease after the writer's.
func TestClaimingWriterKeepsReadersOut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "locks.db")
	open := func() *stallingBackend {
		db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return &stallingBackend{SQLiteBackend: sqllock.NewSQLite(db)}
	}
	newClient := func(b driver.Backend) *dlock.Client {
		c := dlock.New(b)
		t.Cleanup(func() { c.Close() })
		return c
	}
	ctx := t.Context()
	r1, err := newClient(open()).RWMutex("book").RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}

	wb := open()
	claiming := make(chan struct{})
	var once sync.Once
	wb.answered = func(req driver.AcquireRequest, res driver.AcquireResult) {
		if req.Claim && res.Queued && res.Shared > 0 {
			once.Do(func() { close(claiming) })
		}
	}
	type result struct {
		fence uint64
		err   error
	}
	writer, late := make(chan result, 1), make(chan result, 1)
	take := func(lock func(context.Context) (*dlock.Lease, error), out chan<- result) {
		lctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		l, err := lock(lctx)
		if err != nil {
			out <- result{err: err}
			return
		}
		err = l.Unlock(ctx)
		out <- result{fence: l.Fence(), err: err}
	}
	go take(newClient(wb).Mutex("book").Lock, writer)
	await(t, claiming, "the writer's claim beside the reader")

	lb := open()
	refused := make(chan struct{})
	var lonce sync.Once
	lb.answered = func(_ driver.AcquireRequest, res driver.AcquireResult) {
		if res.WriterWaiting {
			lonce.Do(func() { close(refused) })
		}
	}
	go take(newClient(lb).RWMutex("book").RLock, late)
	await(t, refused, "the late reader's refusal")

	wb.stall(1500 * time.Millisecond)
	await(t, wb.stalled, "the writer's slow attempt")
	if err := r1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	w, l := <-writer, <-late
	if w.err != nil || l.err != nil {
		t.Fatalf("writer: %v; late reader: %v", w.err, l.err)
	}
	if l.fence < w.fence {
		t.Errorf("the late reader got fence %d before the waiting writer's %d", l.fence, w.fence)
	}
}

// stallingBackend is a SQLite backend whose next Acquire, once stall is
// called, waits before it is sent, as a statement does on a loaded machine,
// and that shows each answer to answered.
type stallingBackend struct {
	*sqllock.SQLiteBackend
	answered func(driver.AcquireRequest, driver.AcquireResult)
	pause    atomic.Int64  // how long the next Acquire waits, once
	stalled  chan struct{} // closed when the Acquire that waited returns
}

// stall makes the next Acquire wait d before it is sent.
func (b *stallingBackend) stall(d time.Duration) {
	b.stalled = make(chan struct{})
	b.pause.Store(int64(d))
}

func (b *stallingBackend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	if d := time.Duration(b.pause.Swap(0)); d > 0 {
		defer close(b.stalled)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	res, err := b.SQLiteBackend.Acquire(ctx, req)
	if err == nil && b.answered != nil {
		b.answered(req, res)
	}
	return res, err
}

// await waits for ch to close, failing t after a generous bound.
func await(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("no sign of %s after 30s", what)
	}
}
