package redislock_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// countingBackend counts the acquire requests its Client sends.
type countingBackend struct {
	*redislock.Backend
	acquires atomic.Int64
}

func (c *countingBackend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	c.acquires.Add(1)
	return c.Backend.Acquire(ctx, req)
}

// fairWaiter is one Lock of a fair shared or exclusive handle on a Client
// of its own, whose requests are counted and whose grant says whether a
// release handed it over.
type fairWaiter struct {
	b      *countingBackend
	out    chan *dlock.Lease
	handed atomic.Bool
}

// startWaiter starts lock (a Lock or RLock of a handle made on the
// waiter's Client by mk) and returns once the waiter is queued at position.
func startWaiter(t *testing.T, srv *testserver.Redis, inner *redislock.Backend, name string, position int, mk func(c *dlock.Client) func(context.Context) (*dlock.Lease, error)) *fairWaiter {
	t.Helper()
	w := &fairWaiter{b: &countingBackend{Backend: redislock.New(srv.Client(t))}, out: make(chan *dlock.Lease, 1)}
	c := dlock.New(w.b, dlock.WithObserver(dlock.ObserverFunc(func(e dlock.Event) {
		if e.Kind == dlock.EventLockGranted && !e.TryLock {
			w.handed.Store(e.Handoff)
		}
	})))
	t.Cleanup(func() { _ = c.Close() })
	lock := mk(c)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		l, err := lock(ctx)
		if err != nil {
			t.Errorf("waiter %d: %v", position, err)
		}
		w.out <- l
	}()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		info, _, err := inner.Inspect(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		if info.Queued >= position && w.b.acquires.Load() >= 2 {
			return w
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiter %d never queued", position)
		}
	}
}

func TestFairSemaphoreHandsPermitToHead(t *testing.T) {
	srv := testserver.StartRedis(t)
	const name = "fair-sem"
	inner := redislock.New(srv.Client(t))
	opts := []dlock.Option{dlock.Fair(), dlock.WithTTL(10 * time.Second)}
	var holders []*dlock.Lease
	for range 2 {
		c := dlock.New(redislock.New(srv.Client(t)))
		t.Cleanup(func() { _ = c.Close() })
		l, err := c.Semaphore(name, 2, opts...).Acquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		holders = append(holders, l)
	}
	mk := func(c *dlock.Client) func(context.Context) (*dlock.Lease, error) {
		return c.Semaphore(name, 2, opts...).Acquire
	}
	w1 := startWaiter(t, srv, inner, name, 1, mk)
	w2 := startWaiter(t, srv, inner, name, 2, mk)
	n1 := w1.b.acquires.Load()
	if err := holders[0].Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	l1 := <-w1.out
	if l1 == nil {
		t.FailNow()
	}
	if !w1.handed.Load() || w1.b.acquires.Load() != n1 {
		t.Errorf("head: handed %v, %d requests after the release; want handed, 0", w1.handed.Load(), w1.b.acquires.Load()-n1)
	}
	select {
	case l := <-w2.out:
		t.Fatalf("second waiter got a permit beyond the limit: %v", l)
	case <-time.After(100 * time.Millisecond):
	}
	n2 := w2.b.acquires.Load()
	if err := holders[1].Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	l2 := <-w2.out
	if l2 == nil {
		t.FailNow()
	}
	if !w2.handed.Load() || w2.b.acquires.Load() != n2 {
		t.Errorf("second: handed %v, %d requests after the release", w2.handed.Load(), w2.b.acquires.Load()-n2)
	}
	if err := l1.Refresh(t.Context()); err != nil {
		t.Errorf("Refresh of a handed permit: %v", err)
	}
	for _, l := range []*dlock.Lease{l1, l2} {
		if err := l.Unlock(t.Context()); err != nil {
			t.Error(err)
		}
	}
}

func TestFairRWMutexHandsReadersBatch(t *testing.T) {
	srv := testserver.StartRedis(t)
	const name = "fair-rw"
	inner := redislock.New(srv.Client(t))
	opts := []dlock.Option{dlock.Fair(), dlock.WithTTL(10 * time.Second)}
	c := dlock.New(redislock.New(srv.Client(t)))
	t.Cleanup(func() { _ = c.Close() })
	writer, err := c.RWMutex(name, opts...).Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	read := func(c *dlock.Client) func(context.Context) (*dlock.Lease, error) {
		return c.RWMutex(name, opts...).RLock
	}
	write := func(c *dlock.Client) func(context.Context) (*dlock.Lease, error) {
		return c.RWMutex(name, opts...).Lock
	}
	r1 := startWaiter(t, srv, inner, name, 1, read)
	r2 := startWaiter(t, srv, inner, name, 2, read)
	w2 := startWaiter(t, srv, inner, name, 3, write)
	r3 := startWaiter(t, srv, inner, name, 4, read)
	before := []int64{r1.b.acquires.Load(), r2.b.acquires.Load()}
	if err := writer.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	var readers []*dlock.Lease
	for i, r := range []*fairWaiter{r1, r2} {
		l := <-r.out
		if l == nil {
			t.FailNow()
		}
		readers = append(readers, l)
		if !r.handed.Load() || r.b.acquires.Load() != before[i] {
			t.Errorf("reader %d: handed %v, %d requests after the release", i+1, r.handed.Load(), r.b.acquires.Load()-before[i])
		}
	}
	select {
	case <-w2.out:
		t.Fatal("the writer behind the readers got the lock with readers in")
	case <-r3.out:
		t.Fatal("the reader behind the queued writer got in before it")
	case <-time.After(100 * time.Millisecond):
	}
	for _, l := range readers {
		if err := l.Unlock(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	lw := <-w2.out
	if lw == nil {
		t.FailNow()
	}
	if !w2.handed.Load() {
		t.Error("the writer was not handed the lock by the last reader's release")
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-r3.out:
			t.Error("the last reader got in while the writer held")
		case <-time.After(100 * time.Millisecond):
		}
	}()
	wg.Wait()
	if err := lw.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	l3 := <-r3.out
	if l3 == nil {
		t.FailNow()
	}
	if err := l3.Unlock(t.Context()); err != nil {
		t.Error(err)
	}
}

// holdChecker records the leases held at once on one name and reports a
// grant that exceeds what the kind allows among leases still valid: a
// lease that was lost (its Err set) may overlap the next holder.
type holdChecker struct {
	mu      sync.Mutex
	limit   int // permits; 0 for an RWMutex
	held    map[*dlock.Lease]bool
	overlap []string
}

func (c *holdChecker) granted(l *dlock.Lease, writer bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.held[l] = writer
	var readers, writers int
	for h, w := range c.held {
		if h.Err() != nil {
			continue
		}
		if w {
			writers++
		} else {
			readers++
		}
	}
	switch {
	case c.limit > 0 && readers > c.limit:
		c.overlap = append(c.overlap, fmt.Sprintf("%d permits of %d held", readers, c.limit))
	case c.limit == 0 && (writers > 1 || writers == 1 && readers > 0):
		c.overlap = append(c.overlap, fmt.Sprintf("%d writers beside %d readers", writers, readers))
	}
}

func (c *holdChecker) released(l *dlock.Lease) {
	c.mu.Lock()
	delete(c.held, l)
	c.mu.Unlock()
}

// TestFairSharedUnderConnectionFaults runs a fair Semaphore(2) and a fair
// RWMutex (2 writers, 4 readers) over a proxy that keeps dropping every
// connection (pub/sub ones too, so that handoff announcements are lost)
// and slowing them down, and checks that no grant exceeds the kind among
// valid leases, that no Lock fails while the others come and go (nothing
// stranded), that every worker is served, and that both names are free
// once the workers have stopped.
func TestFairSharedUnderConnectionFaults(t *testing.T) {
	srv := testserver.StartRedis(t)
	px := testserver.StartProxy(t, srv.Addr())
	opts := []dlock.Option{dlock.Fair(), dlock.WithTTL(3 * time.Second)}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	sem := &holdChecker{limit: 2, held: map[*dlock.Lease]bool{}}
	rw := &holdChecker{held: map[*dlock.Lease]bool{}}
	var wg sync.WaitGroup
	grants := make([]atomic.Int64, 12)
	for id := range 12 {
		rdb := redis.NewClient(&redis.Options{Addr: px.Addr()})
		t.Cleanup(func() { _ = rdb.Close() })
		c := dlock.New(redislock.New(rdb))
		t.Cleanup(func() { _ = c.Close() })
		var lock func(context.Context) (*dlock.Lease, error)
		check, writer := sem, false
		switch {
		case id < 6:
			lock = c.Semaphore("faults-sem", 2, opts...).Acquire
		case id < 8:
			lock, check, writer = c.RWMutex("faults-rw", opts...).Lock, rw, true
		default:
			lock, check = c.RWMutex("faults-rw", opts...).RLock, rw
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				lctx, lcancel := context.WithTimeout(ctx, 4*time.Second)
				l, err := lock(lctx)
				lcancel()
				if err != nil {
					if ctx.Err() == nil {
						t.Errorf("worker %d: Lock failed while the run went on: %v", id, err)
					}
					return
				}
				grants[id].Add(1)
				check.granted(l, writer)
				time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
				check.released(l)
				if err := l.Unlock(context.Background()); err != nil {
					t.Logf("worker %d: Unlock: %v", id, err)
				}
			}
		}()
	}
	// Faults for about 4 s: every 250 ms the proxy goes down for 30 ms
	// (every connection dropped) or slows down by 20 ms for 100 ms.
	for i := 0; ctx.Err() == nil && i < 12; i++ {
		if i%2 == 0 {
			px.Down(t)
			time.Sleep(30 * time.Millisecond)
			px.Up(t)
		} else {
			px.Latency(t, 20*time.Millisecond)
			time.Sleep(100 * time.Millisecond)
			px.ClearLatency(t)
		}
		time.Sleep(250 * time.Millisecond)
	}
	wg.Wait()
	for _, c := range []*holdChecker{sem, rw} {
		if len(c.overlap) > 0 {
			t.Errorf("%d forbidden overlaps (limit %d), the first: %s", len(c.overlap), c.limit, c.overlap[0])
		}
	}
	var per []int64
	for id := range grants {
		n := grants[id].Load()
		per = append(per, n)
		if n == 0 {
			t.Errorf("worker %d was never served", id)
		}
	}
	t.Logf("grants per worker %v", per)
	fresh := dlock.New(redislock.New(srv.Client(t)))
	defer fresh.Close()
	for range 2 {
		if _, err := fresh.Semaphore("faults-sem", 2).TryAcquire(t.Context()); err != nil {
			t.Errorf("a permit after the run: %v", err)
		}
	}
	if _, err := fresh.RWMutex("faults-rw").TryLock(t.Context()); err != nil {
		t.Errorf("the RWMutex after the run: %v", err)
	}
}

// TestReleaseOfIntentBesideBlockedHeadAnnounced checks that a release that
// removes a writer intent is announced to every waiter even when the
// queue's head, a fair writer, is still kept out by readers: plain readers
// that the intent kept out may come in now.
func TestReleaseOfIntentBesideBlockedHeadAnnounced(t *testing.T) {
	b, _, _ := setup(t)
	h := listenTo(t, b, "k")
	reader, plainWriter, fairWriter, plainReader := newToken(t), newToken(t), newToken(t), newToken(t)
	ttl := 10 * time.Second
	mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: reader, Owner: "r", TTL: ttl, Mode: driver.Shared})
	if res := acquire(t, b, driver.AcquireRequest{Key: "k", Token: plainWriter, Owner: "pw", TTL: ttl, Wait: true, QueueTTL: 5 * time.Second}); !res.Queued {
		t.Fatalf("plain writer: %+v, want its intent recorded", res)
	}
	if res := acquire(t, b, driver.AcquireRequest{Key: "k", Token: fairWriter, Owner: "fw", TTL: ttl, Fair: true, Wait: true,
		QueueTTL: 5 * time.Second, Handoff: true}); res.Position != 1 {
		t.Fatalf("fair writer: %+v, want the queue's head", res)
	}
	if res := acquire(t, b, driver.AcquireRequest{Key: "k", Token: plainReader, Owner: "pr", TTL: ttl, Mode: driver.Shared, Wait: true,
		QueueTTL: 5 * time.Second}); res.Acquired || !res.WriterWaiting {
		t.Fatalf("plain reader: %+v, want refused by the intent", res)
	}
	release(t, b, "k", plainWriter) // its wait ended: the intent goes
	if !h.within(2*time.Second, func(m string) bool { return m == "k " }) {
		t.Fatalf("heard %q; want the release announced to every waiter", h.all())
	}
	mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: plainReader, Owner: "pr", TTL: ttl, Mode: driver.Shared})
}

// TestHeadWriterLeavingLetsReadersBehindIn checks that a fair writer at the
// head of the queue that gives up while readers hold the name, without an
// intent of its own to take off, lets the fair reader queued behind it in
// at once: the release of its token hands the reader a hold, and its
// withdrawal names the reader as the next. (The writer queued while an
// exclusive holder had the name, so it recorded no intent; the holder's
// lease ran out and a plain reader, which does not queue, came in.)
func TestHeadWriterLeavingLetsReadersBehindIn(t *testing.T) {
	for _, how := range []string{"release", "withdraw"} {
		t.Run(how, func(t *testing.T) {
			b, rdb, _ := setup(t)
			waiter := redislock.New(rdb)
			h := listenTo(t, waiter, "k")
			holder, writer, reader, plain := newToken(t), newToken(t), newToken(t), newToken(t)
			ttl := 10 * time.Second
			fair := func(tok string, mode driver.Mode) driver.AcquireRequest {
				return driver.AcquireRequest{Key: "k", Token: tok, Owner: tok, TTL: ttl, Mode: mode, Fair: true, Wait: true,
					QueueTTL: 5 * time.Second, Handoff: true}
			}
			mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: holder, Owner: "x", TTL: 200 * time.Millisecond})
			if res := acquire(t, b, fair(writer, driver.Exclusive)); res.Position != 1 {
				t.Fatalf("writer: %+v, want the queue's head", res)
			}
			if res := acquire(t, waiter, fair(reader, driver.Shared)); res.Acquired || res.Position != 2 {
				t.Fatalf("reader: %+v, want queued behind the writer", res)
			}
			for rdb.Exists(t.Context(), "dlock:{k}").Val() == 1 {
				time.Sleep(5 * time.Millisecond) // the holder's lease runs out
			}
			mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: plain, Owner: "p", TTL: ttl, Mode: driver.Shared})
			if how == "release" {
				release(t, b, "k", writer)
				waitHeard(t, h, "k "+reader+"\x00") // handed a hold
			} else {
				if err := b.Withdraw(t.Context(), "k", writer); err != nil {
					t.Fatal(err)
				}
				if !h.within(2*time.Second, func(m string) bool { return m == "k "+reader }) {
					t.Fatalf("heard %q; want the reader named as the next", h.all())
				}
			}
			mustAcquire(t, waiter, fair(reader, driver.Shared))
		})
	}
}

// TestHandedWriterLeavesNoWriterIntent: a fair writer that readers kept out
// recorded a writer intent; a release that hands it the lock ends its wait
// as a grant of its own request does, so no writer is reported waiting
// (Inspect, dlock ls) while it holds the lock and nobody waits.
func TestHandedWriterLeavesNoWriterIntent(t *testing.T) {
	srv := testserver.StartRedis(t)
	b := redislock.New(srv.Client(t))
	ctx := t.Context()
	const key = "fair-rw-intent"
	r, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "r1", Owner: "r1", TTL: 10 * time.Second,
		Mode: driver.Shared, Fair: true})
	if err != nil || !r.Acquired {
		t.Fatal(r, err)
	}
	w, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "w1", Owner: "w1", TTL: 10 * time.Second,
		Fair: true, Wait: true, QueueTTL: 10 * time.Second, Handoff: true})
	if err != nil || w.Acquired || !w.Queued {
		t.Fatal(w, err)
	}
	if _, err := b.ReleaseGrant(ctx, key, "r1", r.Fence); err != nil {
		t.Fatal(err)
	}
	info, ok, err := b.Inspect(ctx, key)
	if err != nil || !ok {
		t.Fatal(info, ok, err)
	}
	if info.Owner != "w1" {
		t.Fatalf("holder %q, want the writer handed the lock", info.Owner)
	}
	if info.WriterWaiting || info.Queued != 0 {
		t.Errorf("with the handed writer holding and nobody waiting: WriterWaiting %v, Queued %d", info.WriterWaiting, info.Queued)
	}
}

// TestReadersBehindRequestedHeadAreLetIn: fair readers queue behind a
// writer whose lease then lapses (no release announces it). The head
// reader's next request takes a hold; the reader queued behind it, which
// the lock now lets in as well, must be handed a hold or told, not left to
// find out at its own next queue refresh (a convoy: one reader a refresh).
func TestReadersBehindRequestedHeadAreLetIn(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := t.Context()
	const key = "fair-rw-convoy"
	b := redislock.New(srv.Client(t))
	b1, b2 := redislock.New(srv.Client(t)), redislock.New(srv.Client(t))
	heard2 := listenTo(t, b2, key)
	w, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "w", Owner: "w", TTL: 300 * time.Millisecond, Fair: true})
	if err != nil || !w.Acquired {
		t.Fatal(w, err)
	}
	read := func(b *redislock.Backend, tok string) driver.AcquireResult {
		res, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Token: tok, Owner: tok, TTL: 10 * time.Second,
			Mode: driver.Shared, Fair: true, Wait: true, QueueTTL: 5 * time.Second, Handoff: true})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if r := read(b1, "r1"); r.Acquired || !r.Queued {
		t.Fatalf("first reader: %+v, want queued", r)
	}
	if r := read(b2, "r2"); r.Acquired || !r.Queued {
		t.Fatalf("second reader: %+v, want queued", r)
	}
	time.Sleep(400 * time.Millisecond) // the writer's lease lapses, unannounced
	if r := read(b1, "r1"); !r.Acquired {
		t.Fatalf("the head reader's refresh: %+v, want granted", r)
	}
	info, _, err := b.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	told := heard2.within(500*time.Millisecond, func(m string) bool { return strings.Contains(m, "r2") })
	if len(info.Shared) < 2 && !told {
		t.Errorf("the reader queued behind the head holds nothing (%d holds, %d queued) and was not told; it waits for its own refresh",
			len(info.Shared), info.Queued)
	}
}

// TestReaderBehindLeavingWriterHeadIsLetIn: a fair writer at the head of
// the queue, kept out by a reader that a release handed the lock to, gives
// up (its clean-up's release). The reader queued behind it, which the lock
// lets in, must be handed a hold or told, not left to find out at its own
// next queue refresh.
func TestReaderBehindLeavingWriterHeadIsLetIn(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := t.Context()
	const key = "fair-rw-leaving-writer"
	b := redislock.New(srv.Client(t))
	b3 := redislock.New(srv.Client(t))
	heard3 := listenTo(t, b3, key)
	w1, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "w1", Owner: "w1", TTL: 10 * time.Second, Fair: true})
	if err != nil || !w1.Acquired {
		t.Fatal(w1, err)
	}
	wait := func(b *redislock.Backend, tok string, mode driver.Mode) {
		res, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Token: tok, Owner: tok, TTL: 10 * time.Second,
			Mode: mode, Fair: true, Wait: true, QueueTTL: 5 * time.Second, Handoff: true})
		if err != nil || res.Acquired || !res.Queued {
			t.Fatalf("%s: %+v, %v; want queued", tok, res, err)
		}
	}
	wait(b, "r1", driver.Shared)
	wait(b, "w2", driver.Exclusive)
	wait(b3, "r3", driver.Shared)
	if _, err := b.ReleaseGrant(ctx, key, "w1", w1.Fence); err != nil {
		t.Fatal(err)
	}
	// r1 holds; the queue is w2 (kept out by r1), r3. w2 gives up.
	if _, err := b.Release(ctx, key, "w2"); err != nil {
		t.Fatal(err)
	}
	info, _, err := b.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	told := heard3.within(500*time.Millisecond, func(m string) bool { return strings.Contains(m, "r3") })
	if len(info.Shared) < 2 && !told {
		t.Errorf("the reader behind the writer that left holds nothing (%d holds, %d queued) and was not told", len(info.Shared), info.Queued)
	}
}

// TestFairWaitEndedByConflictLeavesNoEntry: a fair Semaphore queues behind
// another fair waiter's entry; a plain Semaphore of another limit takes a
// permit meanwhile, so the waiter's next request is refused with a
// *ConflictError, which ends its wait. The wait must take its queue entry
// off as a wait that ends otherwise does: left, the entry stays the head
// for a QueueTTL, keeping out the fair waiters behind it, and a release
// may hand it a permit that nobody claims.
func TestFairWaitEndedByConflictLeavesNoEntry(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := t.Context()
	const name = "fair-sem-conflict"
	rdb := srv.Client(t)
	b := redislock.New(rdb)
	w, err := b.Acquire(ctx, driver.AcquireRequest{Key: name, Token: "w0", Owner: "w0", TTL: 10 * time.Second, Fair: true})
	if err != nil || !w.Acquired {
		t.Fatal(w, err)
	}
	// A fair waiter whose entry lapses in a second, at the head once w0 goes.
	h0, err := b.Acquire(ctx, driver.AcquireRequest{Key: name, Token: "h0", Owner: "h0", TTL: 10 * time.Second,
		Fair: true, Wait: true, QueueTTL: time.Second})
	if err != nil || !h0.Queued {
		t.Fatal(h0, err)
	}
	if _, err := b.ReleaseGrant(ctx, name, "w0", w.Fence); err != nil {
		t.Fatal(err)
	}
	c := dlock.New(redislock.New(srv.Client(t)))
	t.Cleanup(func() { _ = c.Close() })
	done := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		l, err := c.Semaphore(name, 3, dlock.Fair(), dlock.WithTTL(10*time.Second)).Acquire(wctx)
		if l != nil {
			_ = l.Unlock(ctx)
		}
		done <- err
	}()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if n, _ := rdb.ZCard(ctx, "dlock:{"+name+"}:q").Result(); n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the fair Semaphore never queued")
		}
	}
	p, err := b.Acquire(ctx, driver.AcquireRequest{Key: name, Token: "p", Owner: "p", TTL: 10 * time.Second,
		Mode: driver.Shared, Limit: 2})
	if err != nil || !p.Acquired {
		t.Fatal(p, err)
	}
	err = <-done
	if !errors.Is(err, dlock.ErrConflict) {
		t.Fatalf("the fair Semaphore's wait ended with %v, want a ConflictError", err)
	}
	// The Semaphore's wait may end before h0's entry lapses (a wake-up can
	// bring its next attempt early): only h0 may be left in the queue.
	live, err := rdb.ZRangeArgs(ctx, redis.ZRangeArgs{Key: "dlock:{" + name + "}:qe", ByScore: true,
		Start: fmt.Sprintf("(%d", time.Now().UnixMilli()), Stop: "+inf"}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(live, func(m string) bool { return m != "h0" }) {
		t.Errorf("the wait that ended with a ConflictError left its queue entry (live entries %q)", live)
	}
}

// TestReadersWithoutHandoffWokenInTurn checks that fair readers whose
// entries take no handoff (a Backend with WithReplicaAck) are woken in turn
// when the lock comes free without a release: each reader's grant names
// the next reader on the release channel, which asks at once rather than
// at its queue refresh.
func TestReadersWithoutHandoffWokenInTurn(t *testing.T) {
	b, rdb, _ := setup(t)
	h := listenTo(t, redislock.New(rdb), "k")
	mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: "w", Owner: "w", TTL: 200 * time.Millisecond, Fair: true})
	read := func(tok string) driver.AcquireResult {
		return acquire(t, b, driver.AcquireRequest{Key: "k", Token: tok, Owner: tok, TTL: 10 * time.Second,
			Mode: driver.Shared, Fair: true, Wait: true, QueueTTL: 5 * time.Second})
	}
	for _, tok := range []string{"r1", "r2", "r3"} {
		if res := read(tok); res.Acquired || !res.Queued {
			t.Fatalf("%s: %+v, want queued", tok, res)
		}
	}
	for rdb.Exists(t.Context(), "dlock:{k}").Val() == 1 {
		time.Sleep(5 * time.Millisecond) // the writer's lease runs out, unreleased
	}
	for i, tok := range []string{"r1", "r2", "r3"} {
		if res := read(tok); !res.Acquired {
			t.Fatalf("%s after its turn came: %+v, want granted", tok, res)
		}
		if i < 2 {
			next := []string{"r2", "r3"}[i]
			if !h.within(2*time.Second, func(m string) bool { return m == "k "+next }) {
				t.Fatalf("heard %q after %s's grant; want %s named", h.all(), tok, next)
			}
		}
	}
}

// TestReaderWithoutHandoffBehindHandedReadersWoken checks that a fair
// reader whose entry takes no handoff (a Backend with WithReplicaAck),
// queued behind readers that are handed holds, is woken by the grant that
// hands them theirs: the lock lets it in too, and nothing else would tell
// it before its own queue refresh. Both grants that hand holds over are
// checked: the release of the writer ahead of them, and the head reader's
// own request after the writer's lease ran out unreleased.
func TestReaderWithoutHandoffBehindHandedReadersWoken(t *testing.T) {
	for _, how := range []string{"release", "lapse"} {
		t.Run(how, func(t *testing.T) {
			b, rdb, srv := setup(t)
			b3 := redislock.New(srv.Client(t))
			h := listenTo(t, b3, "k")
			ttl := 10 * time.Second
			if how == "lapse" {
				ttl = 200 * time.Millisecond
			}
			mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: "w", Owner: "w", TTL: ttl, Fair: true})
			read := func(b *redislock.Backend, tok string, handoff bool) driver.AcquireResult {
				return acquire(t, b, driver.AcquireRequest{Key: "k", Token: tok, Owner: tok, TTL: 10 * time.Second,
					Mode: driver.Shared, Fair: true, Wait: true, QueueTTL: 5 * time.Second, Handoff: handoff})
			}
			for i, tok := range []string{"r1", "r2", "r3"} {
				if res := read(b, tok, i < 2); res.Acquired || res.Position != i+1 {
					t.Fatalf("%s: %+v, want queued at %d", tok, res, i+1)
				}
			}
			if how == "release" {
				release(t, b, "k", "w")
			} else {
				for rdb.Exists(t.Context(), "dlock:{k}").Val() == 1 {
					time.Sleep(5 * time.Millisecond) // the writer's lease runs out, unreleased
				}
				if res := read(b, "r1", true); !res.Acquired {
					t.Fatalf("r1 after the writer's lease ran out: %+v, want granted", res)
				}
			}
			if held := rdb.ZScore(t.Context(), "dlock:{k}:s", "r2").Val(); held == 0 {
				t.Fatalf("r2 holds nothing; want handed a hold")
			}
			if !h.within(2*time.Second, func(m string) bool { return m == "k r3" }) {
				t.Errorf("heard %q; want r3, which the lock lets in, named as the next", h.all())
			}
		})
	}
}

// TestHeadWriterLeavingWakesReaderWithoutHandoff checks that a fair writer
// at the head of the queue that gives up while readers hold the name wakes
// the fair reader queued behind it when that reader's entry takes no
// handoff (a Backend with WithReplicaAck): the lock lets it in, and nothing
// else would tell it before its own queue refresh. (As in
// TestHeadWriterLeavingLetsReadersBehindIn, the writer queued while an
// exclusive holder had the name, and a plain reader came in after that
// holder's lease ran out.)
func TestHeadWriterLeavingWakesReaderWithoutHandoff(t *testing.T) {
	for _, how := range []string{"release", "withdraw"} {
		t.Run(how, func(t *testing.T) {
			b, rdb, _ := setup(t)
			waiter := redislock.New(rdb)
			h := listenTo(t, waiter, "k")
			ttl := 10 * time.Second
			fair := func(tok string, mode driver.Mode) driver.AcquireRequest {
				return driver.AcquireRequest{Key: "k", Token: tok, Owner: tok, TTL: ttl, Mode: mode, Fair: true, Wait: true,
					QueueTTL: 5 * time.Second}
			}
			mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: "x", Owner: "x", TTL: 200 * time.Millisecond})
			if res := acquire(t, b, fair("w", driver.Exclusive)); res.Position != 1 {
				t.Fatalf("writer: %+v, want the queue's head", res)
			}
			if res := acquire(t, waiter, fair("r", driver.Shared)); res.Acquired || res.Position != 2 {
				t.Fatalf("reader: %+v, want queued behind the writer", res)
			}
			for rdb.Exists(t.Context(), "dlock:{k}").Val() == 1 {
				time.Sleep(5 * time.Millisecond) // the holder's lease runs out
			}
			mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: "p", Owner: "p", TTL: ttl, Mode: driver.Shared})
			if how == "release" {
				release(t, b, "k", "w")
			} else if err := b.Withdraw(t.Context(), "k", "w"); err != nil {
				t.Fatal(err)
			}
			if !h.within(2*time.Second, func(m string) bool { return m == "k r" }) {
				t.Errorf("heard %q; want the reader named as the next", h.all())
			}
			mustAcquire(t, waiter, fair("r", driver.Shared))
		})
	}
}

// TestReleaseHandsAtMostHandBatchReaders checks the bound on one release's
// work: a writer's release hands holds to the first 100 readers queued
// behind it and names the next on the release channel; that reader's own
// grant hands a hold to the one behind it.
func TestReleaseHandsAtMostHandBatchReaders(t *testing.T) {
	b, rdb, _ := setup(t)
	h := listenTo(t, redislock.New(rdb), "k")
	writer := mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: "w", Owner: "w", TTL: 10 * time.Second, Fair: true})
	read := func(tok string) driver.AcquireResult {
		return acquire(t, b, driver.AcquireRequest{Key: "k", Token: tok, Owner: tok, TTL: 10 * time.Second,
			Mode: driver.Shared, Fair: true, Wait: true, QueueTTL: 5 * time.Second, Handoff: true})
	}
	const queued = 102
	for i := range queued {
		if res := read(fmt.Sprintf("r%03d", i)); res.Acquired || !res.Queued {
			t.Fatalf("reader %d: %+v, want queued", i, res)
		}
	}
	if _, err := b.ReleaseGrant(t.Context(), "k", "w", writer.Fence); err != nil {
		t.Fatal(err)
	}
	if n := rdb.ZCard(t.Context(), "dlock:{k}:s").Val(); n != 100 {
		t.Fatalf("%d readers handed holds by one release, want 100", n)
	}
	if !h.within(2*time.Second, func(m string) bool { return m == "k r100" }) {
		t.Fatalf("heard %q; want the 101st reader named", h.all())
	}
	if res := read("r100"); !res.Acquired {
		t.Fatalf("the 101st reader: %+v, want granted", res)
	}
	if n := rdb.ZCard(t.Context(), "dlock:{k}:s").Val(); n != queued {
		t.Errorf("%d readers hold after the 101st came in, want %d (it hands the last a hold)", n, queued)
	}
}

// plainWorker is one worker of contend: a Client of its own, the Lock of a
// plain handle made on it by mk, and what it was granted.
type plainWorker struct {
	name           string
	mk             func(c *dlock.Client) func(context.Context) (*dlock.Lease, error)
	grants, handed int
}

// contend runs the workers on one redis-server for d, each locking,
// holding for 200µs of busy work and locking again at once, and counts
// each worker's grants and those a release handed it (Event.Handoff).
func contend(t *testing.T, srv *testserver.Redis, d time.Duration, workers []*plainWorker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	var wg sync.WaitGroup
	for _, w := range workers {
		var handed atomic.Int64
		c := dlock.New(redislock.New(srv.Client(t)), dlock.WithObserver(dlock.ObserverFunc(func(e dlock.Event) {
			if e.Kind == dlock.EventLockGranted && !e.TryLock && e.Handoff {
				handed.Add(1)
			}
		})))
		t.Cleanup(func() { _ = c.Close() })
		lock := w.mk(c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { w.handed = int(handed.Load()) }()
			for ctx.Err() == nil {
				l, err := lock(ctx)
				if err != nil {
					if ctx.Err() == nil {
						t.Errorf("%s: %v", w.name, err)
					}
					return
				}
				for end := time.Now().Add(200 * time.Microsecond); time.Now().Before(end); {
				}
				if err := l.Unlock(context.Background()); err != nil {
					t.Errorf("%s: Unlock: %v", w.name, err)
					return
				}
				w.grants++
			}
		}()
	}
	wg.Wait()
	for _, w := range workers {
		t.Logf("%s: %d grants, %d of them handed over", w.name, w.grants, w.handed)
	}
}

// A plain Semaphore's waiters that starve join the fair queue, as a plain
// Mutex's do, and are handed permits by the releases: without it every
// release woke all the waiting Clients, which raced for the permit.
func TestPlainSemaphoreWaitersAreHandedPermits(t *testing.T) {
	_, _, srv := setup(t)
	var workers []*plainWorker
	for i := range 5 {
		workers = append(workers, &plainWorker{name: fmt.Sprintf("worker %d", i), mk: func(c *dlock.Client) func(context.Context) (*dlock.Lease, error) {
			return c.Semaphore("s", 2).Acquire
		}})
	}
	contend(t, srv, 1500*time.Millisecond, workers)
	total, handed := 0, 0
	for _, w := range workers {
		total, handed = total+w.grants, handed+w.handed
	}
	if total < 40*len(workers) {
		t.Fatalf("only %d grants; want at least %d to judge them", total, 40*len(workers))
	}
	if handed < total/4 {
		t.Errorf("%d of %d grants handed over; want at least a quarter: the starving waiters did not queue", handed, total)
	}
	for _, w := range workers {
		if w.grants < total/len(workers)/3 {
			t.Errorf("%s got %d of %d grants; want at least a third of an even share", w.name, w.grants, total)
		}
	}
}

// A plain RWMutex's readers and writers that starve join the fair queue
// and take turns in arrival order, each handed its turn by a release:
// without it the writers, whose releases woke every waiting Client, took
// several times the readers' share.
func TestPlainRWMutexWaitersTakeTurns(t *testing.T) {
	_, _, srv := setup(t)
	var workers []*plainWorker
	for i := range 2 {
		workers = append(workers, &plainWorker{name: fmt.Sprintf("writer %d", i), mk: func(c *dlock.Client) func(context.Context) (*dlock.Lease, error) {
			return c.RWMutex("rw").Lock
		}})
	}
	for i := range 4 {
		workers = append(workers, &plainWorker{name: fmt.Sprintf("reader %d", i), mk: func(c *dlock.Client) func(context.Context) (*dlock.Lease, error) {
			return c.RWMutex("rw").RLock
		}})
	}
	contend(t, srv, 1500*time.Millisecond, workers)
	total := 0
	for _, w := range workers {
		total += w.grants
	}
	if total < 40*len(workers) {
		t.Fatalf("only %d grants; want at least %d to judge them", total, 40*len(workers))
	}
	for _, w := range workers {
		if w.grants < total/len(workers)/2 {
			t.Errorf("%s got %d of %d grants; want at least half an even share", w.name, w.grants, total)
		}
		if w.handed == 0 {
			t.Errorf("%s was never handed the lock: its waits did not queue", w.name)
		}
	}
}

// A request without Fair that finds a shared hold a release handed its
// token (a plain waiter in the queue that fell back on a plain request
// after promisedGrace: waiter.fairNext) claims it, and the hold gets the
// request's TTL, as an exclusive handed grant does: the client trusts the
// grant for the request's TTL, where the handed hold lived only as long as
// the token's queue entry.
func TestPlainClaimOfHandedHoldGetsItsTTL(t *testing.T) {
	b, rdb, _ := setup(t)
	holder := sharedReq("s", newToken(t), "holder", 1)
	mustAcquire(t, b, holder)
	waiter := sharedReq("s", newToken(t), "waiter", 1)
	waiter.Fair, waiter.Wait, waiter.Handoff, waiter.QueueTTL = true, true, true, 3*time.Second
	refused(t, b, waiter)
	release(t, b, "s", holder.Token) // hands waiter a hold that lives with its entry
	plain := waiter
	plain.Fair, plain.Handoff = false, false
	mustAcquire(t, b, plain)
	exp, err := rdb.ZScore(t.Context(), lockKey("s")+":s", waiter.Token).Result()
	if err != nil {
		t.Fatal(err)
	}
	if left := time.Until(time.UnixMilli(int64(exp))); left < plain.TTL-2*time.Second {
		t.Errorf("the claimed hold expires in %v; want the request's TTL (%v)", left, plain.TTL)
	}
}

// beforeAcquire runs fn once, before the first acquire request that match
// accepts (given the request's script arguments, ARGV[1] first) goes out.
type beforeAcquire struct {
	once  *sync.Once
	match func(argv []any) bool
	fn    func()
}

func (h beforeAcquire) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h beforeAcquire) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.check(cmd.Args())
		return next(ctx, cmd)
	}
}

func (h beforeAcquire) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.check(cmd.Args())
		}
		return next(ctx, cmds)
	}
}

func (h beforeAcquire) check(args []any) {
	const argv = 3 + 9 // "evalsha", sha, 9, the keys
	if len(args) > argv+9 && args[0] == "evalsha" && args[1] == redislock.AcquireScriptHash() && h.match(args[argv:]) {
		h.once.Do(h.fn)
	}
}

// A plain Semaphore waiter in the queue, behind a head that does not come,
// falls back on a plain request after promisedGrace; when the head comes
// meanwhile and its grant hands the waiter a permit, that request claims
// it. The lease must not outlive the permit on the store: it lived as
// long as the waiter's queue entry (3 s), the lease was trusted for the
// TTL, and another Client could take the permit in between.
func TestPlainSemaphoreLeaseDoesNotOutliveHandedPermit(t *testing.T) {
	b, rdb, srv := setup(t)
	ctx := t.Context()
	h1, h2 := sharedReq("s", newToken(t), "h1", 2), sharedReq("s", newToken(t), "h2", 2)
	mustAcquire(t, b, h1)
	mustAcquire(t, b, h2)
	// The head takes no handoff: a release leaves it the lock to ask for.
	head := sharedReq("s", newToken(t), "head", 2)
	head.Fair, head.Wait, head.QueueTTL = true, true, 5*time.Second
	refused(t, b, head)

	hooked := srv.Client(t)
	var queued atomic.Bool
	hooked.AddHook(beforeAcquire{once: new(sync.Once), match: func(argv []any) bool {
		if argv[7] == "1" { // ARGV[8], fair: the waiter queued
			queued.Store(true)
			return false
		}
		return queued.Load() && argv[5] == "1" && argv[8] == "1" // a plain shared request that waits
	}, fn: func() {
		// The head comes: its grant hands the waiter behind it a permit
		// before the waiter's plain request lands.
		if res, err := b.Acquire(ctx, head); err != nil || !res.Acquired {
			t.Errorf("head: %+v, %v", res, err)
		}
	}})
	c := dlock.New(redislock.New(hooked))
	defer c.Close()
	got := make(chan *dlock.Lease, 1)
	go func() {
		l, err := c.Semaphore("s", 2).Acquire(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	for zcard(t, rdb, lockKey("s")+":q") < 2 {
		time.Sleep(time.Millisecond)
	}
	release(t, b, "s", h1.Token)
	release(t, b, "s", h2.Token)
	l := <-got
	if l == nil {
		t.FailNow()
	}
	defer l.Unlock(context.Background())
	holds, err := rdb.ZRangeWithScores(ctx, lockKey("s")+":s", 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(holds) != 2 {
		t.Fatalf("holds %v; want the head's and the waiter's", holds)
	}
	for _, z := range holds {
		if z.Member == head.Token {
			continue
		}
		// Redis counts the expiry in whole milliseconds of its clock, from
		// a moment after the request was sent; the lease's Deadline, from
		// the send time on this clock, may pass it by under a millisecond
		// (Lease.Deadline: its clock's granularity, which the safety margin
		// covers). A lease trusted for its TTL would pass it by seconds.
		const granularity = time.Millisecond
		if exp := time.UnixMilli(int64(z.Score)); l.Deadline().After(exp.Add(granularity)) {
			t.Errorf("the lease is trusted until %v after its permit expires on the store (in %v)",
				l.Deadline().Sub(exp), time.Until(exp).Round(time.Millisecond))
		}
	}
}

// A plain reader or permit queued behind a writer that waits for the
// shared holds to go is refused with nobody named (the writer has the
// lock's next turn, and nothing may pass it) and told that a writer waits:
// the lock is not free for it, and it sleeps until a release or its queue
// refresh rather than poll as it would for a lock promised to a head that
// does not come.
func TestQueuedSharedWaiterBehindWaitingWriterDoesNotPoll(t *testing.T) {
	for _, tc := range []struct {
		name           string
		holder, queued func(c *dlock.Client) func(context.Context) (*dlock.Lease, error)
		writer         func(c *dlock.Client) func(context.Context) (*dlock.Lease, error)
	}{
		{"reader",
			func(c *dlock.Client) func(context.Context) (*dlock.Lease, error) { return c.RWMutex("n").RLock },
			func(c *dlock.Client) func(context.Context) (*dlock.Lease, error) { return c.RWMutex("n").RLock },
			func(c *dlock.Client) func(context.Context) (*dlock.Lease, error) {
				return c.RWMutex("n", dlock.Fair()).Lock
			}},
		{"permit",
			func(c *dlock.Client) func(context.Context) (*dlock.Lease, error) { return c.Semaphore("n", 3).Acquire },
			func(c *dlock.Client) func(context.Context) (*dlock.Lease, error) { return c.Semaphore("n", 3).Acquire },
			func(c *dlock.Client) func(context.Context) (*dlock.Lease, error) {
				return c.Mutex("n", dlock.Fair()).Lock
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, _, srv := setup(t)
			c := dlock.New(redislock.New(srv.Client(t)))
			defer c.Close()
			held, err := tc.holder(c)(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			writer := startWaiter(t, srv, b, "n", 1, tc.writer)
			queued := startWaiter(t, srv, b, "n", 2, tc.queued)
			before := queued.b.acquires.Load()
			time.Sleep(1500 * time.Millisecond)
			if n := queued.b.acquires.Load() - before; n > 5 {
				t.Errorf("the queued %s sent %d requests in 1.5s while the lock was held and the writer ahead of it waited; want at most 5 (its queue refreshes)", tc.name, n)
			}
			if err := held.Unlock(t.Context()); err != nil {
				t.Fatal(err)
			}
			w := <-writer.out
			if w == nil {
				t.FailNow()
			}
			if err := w.Unlock(t.Context()); err != nil {
				t.Fatal(err)
			}
			if l := <-queued.out; l != nil {
				if err := l.Unlock(t.Context()); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// mixedRole is one worker of runMixed: how it locks, on a Client of its own.
type mixedRole struct {
	name   string
	writer bool
	mk     func(c *dlock.Client) func(context.Context) (*dlock.Lease, error)
}

// validChecker is holdChecker counting a lease as held while its Client
// trusts it (before its Deadline, Err nil): a dead Client's lease counts
// until then.
type validChecker struct {
	mu      sync.Mutex
	limit   int
	held    map[*dlock.Lease]bool
	dead    map[*dlock.Lease]bool // leases of killed Clients: held on the store until their deadline
	overlap []string
}

func (c *validChecker) markDead(l *dlock.Lease) {
	c.mu.Lock()
	c.dead[l] = true
	c.mu.Unlock()
}

func (c *validChecker) granted(l *dlock.Lease, writer bool, who string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	c.held[l] = writer
	var readers, writers int
	for h, w := range c.held {
		if h.Err() != nil && !c.dead[h] || !now.Before(h.Deadline()) {
			continue
		}
		if w {
			writers++
		} else {
			readers++
		}
	}
	switch {
	case c.limit > 0 && readers > c.limit:
		c.overlap = append(c.overlap, fmt.Sprintf("%s: %d permits of %d held", who, readers, c.limit))
	case c.limit == 0 && (writers > 1 || writers == 1 && readers > 0):
		c.overlap = append(c.overlap, fmt.Sprintf("%s: %d writers beside %d readers", who, writers, readers))
	}
}

func (c *validChecker) released(l *dlock.Lease) {
	c.mu.Lock()
	delete(c.held, l)
	c.mu.Unlock()
}

// waitStat is one Lock call's wait: how long, how many acquire requests.
type waitStat struct {
	who      string
	d        time.Duration
	requests int64
	ok       bool
}

// runMixed runs the roles on name for d: each locks with a random wait
// bound, holds for up to 3 ms and unlocks; one worker's
// Client dies (its go-redis client is closed under it, whatever it is
// doing) and the worker goes on with a new one (every killEvery; never
// when 0). It reports the forbidden
// overlaps, then checks that the store is left with nothing but the fence
// counter once the entries' times to live have run out.
func runMixed(t *testing.T, srv *testserver.Redis, name string, limit int, d, killEvery time.Duration, roles []mixedRole) []waitStat {
	t.Helper()
	check := &validChecker{limit: limit, held: map[*dlock.Lease]bool{}, dead: map[*dlock.Lease]bool{}}
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	type proc struct {
		rdb  *redis.Client
		c    *dlock.Client
		b    *countingBackend
		dead atomic.Bool
		// closed: Client.Close was called on it (every other kill); the
		// worker goes on with a new Client.
		closed atomic.Bool
	}
	newProc := func() *proc {
		p := &proc{rdb: redis.NewClient(&redis.Options{Addr: srv.Addr()})}
		p.b = &countingBackend{Backend: redislock.New(p.rdb)}
		p.c = dlock.New(p.b)
		return p
	}
	var (
		mu    sync.Mutex
		procs = make([]*proc, len(roles))
		stats []waitStat
		all   []*proc
		kills atomic.Int64
	)
	for i := range roles {
		procs[i] = newProc()
		all = append(all, procs[i])
	}
	var wg sync.WaitGroup
	for i, r := range roles {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				mu.Lock()
				p := procs[i]
				mu.Unlock()
				if p.dead.Load() || p.closed.Load() {
					np := newProc()
					mu.Lock()
					procs[i], all = np, append(all, np)
					mu.Unlock()
					continue
				}
				lctx, lcancel := context.WithTimeout(ctx, time.Duration(5+rand.IntN(1500))*time.Millisecond)
				before, start := p.b.acquires.Load(), time.Now()
				l, err := r.mk(p.c)(lctx)
				lcancel()
				mu.Lock()
				stats = append(stats, waitStat{r.name, time.Since(start), p.b.acquires.Load() - before, err == nil})
				mu.Unlock()
				if err != nil {
					continue
				}
				check.granted(l, r.writer, r.name)
				time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
				if p.dead.Load() {
					check.markDead(l) // dead with the lease: it stays counted until its deadline
					continue
				}
				check.released(l)
				_ = l.Unlock(context.Background())
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for killEvery > 0 && ctx.Err() == nil {
			time.Sleep(killEvery)
			i := rand.IntN(len(roles))
			mu.Lock()
			p := procs[i]
			mu.Unlock()
			if kills.Load()%2 == 1 {
				// Closed mid-wait or mid-hold: its waits end, its leases go.
				if p.closed.CompareAndSwap(false, true) {
					kills.Add(1)
					go p.c.Close()
				}
			} else if p.dead.CompareAndSwap(false, true) {
				kills.Add(1)
				_ = p.rdb.Close()
			}
		}
	}()
	wg.Wait()
	for _, p := range all {
		_ = p.c.Close() // a dead one's releases fail at once; its goroutines end
		_ = p.rdb.Close()
	}
	if len(check.overlap) > 0 {
		t.Errorf("%d forbidden overlaps on %s, the first: %v", len(check.overlap), name, check.overlap[:min(5, len(check.overlap))])
	}
	t.Logf("%s: %d Lock calls, %d Clients killed or closed", name, len(stats), kills.Load())
	return stats
}

// storeLeftovers waits up to within for the lock's keys (but its fence
// counter) to go, and returns those left with their times to live.
func storeLeftovers(t *testing.T, rdb *redis.Client, name string, within time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		keys, err := rdb.Keys(t.Context(), lockKey(name)+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		var left []string
		for _, k := range keys {
			if strings.HasSuffix(k, ":fence") || strings.HasSuffix(k, ":r") || strings.HasSuffix(k, ":late") {
				continue // kept on purpose: the fence counter, recent releases (15 s), late requests (5 s)
			}
			left = append(left, fmt.Sprintf("%s (pttl %v)", k, rdb.PTTL(t.Context(), k).Val()))
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func reportWaits(t *testing.T, stats []waitStat) {
	t.Helper()
	sort.Slice(stats, func(i, j int) bool { return stats[i].requests > stats[j].requests })
	for _, s := range stats[:min(5, len(stats))] {
		t.Logf("busiest wait: %s %v ok=%v, %d requests", s.who, s.d.Round(time.Millisecond), s.ok, s.requests)
	}
	var long []waitStat
	for _, s := range stats {
		if s.d > 500*time.Millisecond && float64(s.requests)/s.d.Seconds() > 25 {
			long = append(long, s)
		}
	}
	if len(long) > 0 {
		t.Logf("%d waits over 500ms at more than 25 requests/s, e.g. %+v", len(long), long[0])
	}
}

// mixedFor is how long each run of the mixed plain-and-fair tests lasts.
var mixedFor = flag.Duration("mixed.duration", 2*time.Second, "how long each mixed plain-and-fair run of TestMixedPlainAndFair* lasts")

func TestMixedPlainAndFairRWMutexKeepsExclusion(t *testing.T) {
	srv := testserver.StartRedis(t)
	rdb := srv.Client(t)
	short := dlock.WithTTL(time.Second)
	rw := func(opts ...dlock.Option) func(c *dlock.Client) *dlock.RWMutex {
		return func(c *dlock.Client) *dlock.RWMutex { return c.RWMutex("mix-rw", opts...) }
	}
	var roles []mixedRole
	for i, mk := range []func(c *dlock.Client) *dlock.RWMutex{rw(), rw(short), rw(dlock.Fair()), rw(dlock.Fair(), short)} {
		roles = append(roles,
			mixedRole{fmt.Sprintf("writer %d", i), true, func(c *dlock.Client) func(context.Context) (*dlock.Lease, error) { return mk(c).Lock }},
			mixedRole{fmt.Sprintf("reader %d", i), false, func(c *dlock.Client) func(context.Context) (*dlock.Lease, error) { return mk(c).RLock }},
			mixedRole{fmt.Sprintf("reader %db", i), false, func(c *dlock.Client) func(context.Context) (*dlock.Lease, error) { return mk(c).RLock }},
		)
	}
	for _, kill := range []time.Duration{0, 300 * time.Millisecond} {
		stats := runMixed(t, srv, "mix-rw", 0, *mixedFor, kill, roles)
		reportWaits(t, stats)
		if left := storeLeftovers(t, rdb, "mix-rw", 12*time.Second); len(left) > 0 {
			t.Errorf("left on the store: %v", left)
		}
	}
}

func TestMixedPlainAndFairSemaphoreKeepsLimit(t *testing.T) {
	for _, limit := range []int{2, 3} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			t.Parallel() // a server each
			srv := testserver.StartRedis(t)
			rdb := srv.Client(t)
			name := fmt.Sprintf("mix-sem%d", limit)
			var roles []mixedRole
			for i, opts := range [][]dlock.Option{nil, {dlock.WithTTL(time.Second)}, {dlock.Fair()}, {dlock.Fair(), dlock.WithTTL(time.Second)}} {
				for j := range 2 {
					roles = append(roles, mixedRole{fmt.Sprintf("permit %d.%d", i, j), false, func(c *dlock.Client) func(context.Context) (*dlock.Lease, error) {
						return c.Semaphore(name, limit, opts...).Acquire
					}})
				}
			}
			for _, kill := range []time.Duration{0, 300 * time.Millisecond} {
				stats := runMixed(t, srv, name, limit, *mixedFor, kill, roles)
				reportWaits(t, stats)
				if left := storeLeftovers(t, rdb, name, 12*time.Second); len(left) > 0 {
					t.Errorf("left on the store: %v", left)
				}
			}
		})
	}
}

// proc is a Client over a go-redis client of its own, as a process has;
// kill closes the go-redis client under it, as the process's death would
// (nothing it holds or left on the store is cleaned up).
type proc struct {
	rdb *redis.Client
	b   *countingBackend
	c   *dlock.Client
}

func newProc(t *testing.T, srv *testserver.Redis) *proc {
	t.Helper()
	p := &proc{rdb: redis.NewClient(&redis.Options{Addr: srv.Addr()})}
	p.b = &countingBackend{Backend: redislock.New(p.rdb)}
	p.c = dlock.New(p.b)
	t.Cleanup(func() { _ = p.c.Close(); _ = p.rdb.Close() })
	return p
}

func (p *proc) kill() { _ = p.rdb.Close() }

type lockResult struct {
	l   *dlock.Lease
	err error
	at  time.Time
}

// start runs lock in the background with a 30 s bound.
func start(t *testing.T, lock func(context.Context) (*dlock.Lease, error)) chan lockResult {
	out := make(chan lockResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		l, err := lock(ctx)
		out <- lockResult{l, err, time.Now()}
	}()
	return out
}

// queuedAt waits until the name's queue holds n entries.
func queuedAt(t *testing.T, inner *redislock.Backend, name string, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		info, _, err := inner.Inspect(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		if info.Queued >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d queued, want %d", name, info.Queued, n)
		}
	}
}

// A waiter queued behind a head whose Client died gets in once the dead
// head's entry (or the grant a release handed it) lapses, and does not
// poll meanwhile.
func TestQueuedSharedWaiterBehindDeadHeadGetsIn(t *testing.T) {
	rw := func(opts ...dlock.Option) func(p *proc) func(context.Context) (*dlock.Lease, error) {
		return func(p *proc) func(context.Context) (*dlock.Lease, error) { return p.c.RWMutex("n", opts...).Lock }
	}
	rd := func(opts ...dlock.Option) func(p *proc) func(context.Context) (*dlock.Lease, error) {
		return func(p *proc) func(context.Context) (*dlock.Lease, error) { return p.c.RWMutex("n", opts...).RLock }
	}
	sem := func(n int, opts ...dlock.Option) func(p *proc) func(context.Context) (*dlock.Lease, error) {
		return func(p *proc) func(context.Context) (*dlock.Lease, error) {
			return p.c.Semaphore("n", n, opts...).Acquire
		}
	}
	mu := func(opts ...dlock.Option) func(p *proc) func(context.Context) (*dlock.Lease, error) {
		return func(p *proc) func(context.Context) (*dlock.Lease, error) { return p.c.Mutex("n", opts...).Lock }
	}
	for _, tc := range []struct {
		name               string
		holder, head, back func(p *proc) func(context.Context) (*dlock.Lease, error)
		hold               time.Duration // how long the holder holds after the head died
		within             time.Duration // the waiter behind gets in within this of the head's death
	}{
		{"reader behind dead fair writer, released at once", rd(), rw(dlock.Fair()), rd(), 100 * time.Millisecond, 10 * time.Second},
		{"reader behind dead fair writer, held on", rd(), rw(dlock.Fair()), rd(), 20 * time.Second, 10 * time.Second},
		{"reader behind dead fair 1s writer, held on", rd(), rw(dlock.Fair(), dlock.WithTTL(time.Second)), rd(), 20 * time.Second, 5 * time.Second},
		{"fair reader behind dead fair writer, held on", rd(), rw(dlock.Fair()), rd(dlock.Fair()), 20 * time.Second, 10 * time.Second},
		{"permit behind dead fair writer, released at once", sem(1), mu(dlock.Fair()), sem(1), 100 * time.Millisecond, 10 * time.Second},
		{"permit behind dead fair writer, held on", sem(2), mu(dlock.Fair()), sem(2), 20 * time.Second, 10 * time.Second},
		{"permit behind dead plain permit, released at once", sem(1), sem(1), sem(1), 100 * time.Millisecond, 8 * time.Second},
		{"reader behind dead plain reader, writer held", rw(), rd(), rd(), 100 * time.Millisecond, 8 * time.Second},
		{"writer behind dead plain reader, writer held", rw(), rd(), rw(), 100 * time.Millisecond, 8 * time.Second},
		{"reader behind dead plain writer, writer held", rw(), rw(), rd(), 100 * time.Millisecond, 8 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // a server each; the bounds leave room for a loaded machine
			srv := testserver.StartRedis(t)
			inner := redislock.New(srv.Client(t))
			holder, head, back := newProc(t, srv), newProc(t, srv), newProc(t, srv)
			held, err := tc.holder(holder)(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			_ = start(t, tc.head(head))
			queuedAt(t, inner, "n", 1)
			got := start(t, tc.back(back))
			queuedAt(t, inner, "n", 2)
			time.Sleep(50 * time.Millisecond)
			info, _, _ := inner.Inspect(t.Context(), "n")
			t.Logf("before the death: %+v", info)
			head.kill()
			died := time.Now()
			n0 := back.b.acquires.Load()
			select {
			case r := <-got:
				t.Logf("got in %v after the head's death (before the release)", r.at.Sub(died))
			case <-time.After(tc.hold):
				_ = held.Unlock(t.Context())
				select {
				case r := <-got:
					t.Logf("got in %v after the head's death, err %v", r.at.Sub(died), r.err)
					if r.at.Sub(died) > tc.within {
						t.Errorf("the waiter behind the dead head got in %v after its death; want within %v", r.at.Sub(died), tc.within)
					}
				case <-time.After(tc.within):
					info, _, _ := inner.Inspect(t.Context(), "n")
					t.Errorf("the waiter behind the dead head still waits %v after its death: %+v", time.Since(died), info)
				}
			}
			n := back.b.acquires.Load() - n0
			t.Logf("%d requests of the waiter behind in %v", n, time.Since(died).Round(time.Millisecond))
			if per := float64(n) / time.Since(died).Seconds(); per > 10 {
				t.Errorf("the waiter behind sent %d requests in %v (%.0f/s)", n, time.Since(died).Round(time.Millisecond), per)
			}
		})
	}
}

// A plain reader queued behind two queued writers keeps its place when the
// first writer leaves (its wait cancelled, or its Client dead and its
// entry and intent lapsed): the second writer, now the head, has no writer
// intent until its next request, and the reader must not take that for a
// lock promised to a head that does not come, poll every 20 ms and pass
// the writer with a plain request after 100 ms.
func TestQueuedReaderDoesNotPassQueuedWriterHead(t *testing.T) {
	for _, tc := range []struct {
		death  string
		shared func(c *dlock.Client) func(context.Context) (*dlock.Lease, error)
		writer func(c *dlock.Client) func(context.Context) (*dlock.Lease, error)
	}{
		{"cancelled", func(c *dlock.Client) func(context.Context) (*dlock.Lease, error) { return c.RWMutex("n").RLock },
			func(c *dlock.Client) func(context.Context) (*dlock.Lease, error) {
				return c.RWMutex("n", dlock.Fair()).Lock
			}},
		{"dead", func(c *dlock.Client) func(context.Context) (*dlock.Lease, error) { return c.RWMutex("n").RLock },
			func(c *dlock.Client) func(context.Context) (*dlock.Lease, error) {
				return c.RWMutex("n", dlock.Fair()).Lock
			}},
		{"dead, permits", func(c *dlock.Client) func(context.Context) (*dlock.Lease, error) { return c.Semaphore("n", 3).Acquire },
			func(c *dlock.Client) func(context.Context) (*dlock.Lease, error) {
				return c.Mutex("n", dlock.Fair()).Lock
			}},
	} {
		death := strings.Split(tc.death, ",")[0]
		t.Run(tc.death, func(t *testing.T) {
			srv := testserver.StartRedis(t)
			inner := redislock.New(srv.Client(t))
			holder, w1, w2, r := newProc(t, srv), newProc(t, srv), newProc(t, srv), newProc(t, srv)
			held, err := tc.shared(holder.c)(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			ctx1, cancel1 := context.WithCancel(t.Context())
			defer cancel1()
			first := make(chan error, 1)
			go func() {
				l, err := tc.writer(w1.c)(ctx1)
				if l != nil {
					_ = l.Unlock(context.Background())
				}
				first <- err
			}()
			queuedAt(t, inner, "n", 1)
			// Out of step with the first writer's queue refreshes, so that
			// the second's do not renew its intent as the first's lapses.
			time.Sleep(800 * time.Millisecond)
			second := start(t, tc.writer(w2.c))
			queuedAt(t, inner, "n", 2)
			reader := start(t, tc.shared(r.c))
			queuedAt(t, inner, "n", 3)
			time.Sleep(100 * time.Millisecond)
			left := time.Now()
			if death == "cancelled" {
				cancel1()
				<-first
			} else {
				w1.kill()
				// Its entry and intent lapse within the queue TTL (5 s).
				for {
					info, _, _ := inner.Inspect(t.Context(), "n")
					if info.Queued == 2 && !info.WriterWaiting {
						break
					}
					if time.Since(left) > 7*time.Second {
						t.Fatalf("the dead writer's entry is still there: %+v", info)
					}
					time.Sleep(2 * time.Millisecond)
				}
				left = time.Now()
			}
			info, _, _ := inner.Inspect(t.Context(), "n")
			t.Logf("after the first writer left: %+v", info)
			n0 := r.b.acquires.Load()
			select {
			case res := <-reader:
				info, _, _ := inner.Inspect(t.Context(), "n")
				t.Errorf("the reader queued behind the waiting writer got in %v after the first writer left (err %v), before the writer: %+v; %d requests",
					res.at.Sub(left).Round(time.Millisecond), res.err, info, r.b.acquires.Load()-n0)
				if res.l != nil {
					_ = res.l.Unlock(t.Context())
				}
			case <-time.After(time.Second):
				t.Logf("%d requests of the reader in 1s", r.b.acquires.Load()-n0)
			}
			_ = held.Unlock(t.Context())
			if res := <-second; res.err != nil {
				t.Fatal(res.err)
			} else {
				_ = res.l.Unlock(t.Context())
			}
		})
	}
}

// A Client closed while its waiter (a permit, or a reader) heads the
// queue, as a release hands that waiter the lock, gives the grant back (or
// leaves the queue before the handoff): the waiter behind (a permit, or a
// writer) gets it at once, not when the closed Client's entry lapses. Run
// with the close and the release at random offsets.
func TestClosedHeadClientGivesHandedGrantBack(t *testing.T) {
	type mk func(p *proc, opts ...dlock.Option) func(context.Context) (*dlock.Lease, error)
	sem := func(p *proc, opts ...dlock.Option) func(context.Context) (*dlock.Lease, error) {
		return p.c.Semaphore("n", 1, opts...).Acquire
	}
	rd := func(p *proc, opts ...dlock.Option) func(context.Context) (*dlock.Lease, error) {
		return p.c.RWMutex("n", opts...).RLock
	}
	wr := func(p *proc, opts ...dlock.Option) func(context.Context) (*dlock.Lease, error) {
		return p.c.RWMutex("n", opts...).Lock
	}
	for _, tc := range []struct {
		name               string
		holder, head, back mk
	}{{"permit", sem, sem, sem}, {"reader", wr, rd, wr}} {
		for _, fair := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s fair=%v", tc.name, fair), func(t *testing.T) {
				srv := testserver.StartRedis(t)
				inner := redislock.New(srv.Client(t))
				rdb := srv.Client(t)
				var opts []dlock.Option
				if fair {
					opts = append(opts, dlock.Fair())
				}
				var slow []time.Duration
				for i := range 12 {
					holder, head, back := newProc(t, srv), newProc(t, srv), newProc(t, srv)
					held, err := tc.holder(holder)(t.Context())
					if err != nil {
						t.Fatal(err)
					}
					headGot := start(t, tc.head(head, opts...))
					queuedAt(t, inner, "n", 1)
					got := start(t, tc.back(back, opts...))
					queuedAt(t, inner, "n", 2)
					var wg sync.WaitGroup
					wg.Add(2)
					go func() {
						defer wg.Done()
						time.Sleep(time.Duration(rand.IntN(4000)) * time.Microsecond)
						_ = head.c.Close()
					}()
					go func() {
						defer wg.Done()
						time.Sleep(time.Duration(rand.IntN(4000)) * time.Microsecond)
						_ = held.Unlock(t.Context())
					}()
					wg.Wait()
					freed := time.Now()
					hr := <-headGot
					select {
					case r := <-got:
						if r.err != nil {
							t.Fatal(r.err)
						}
						if d := r.at.Sub(freed); d > 500*time.Millisecond {
							slow = append(slow, d)
							t.Logf("run %d: the waiter behind got in %v after the close (head's Lock: %v)", i, d.Round(time.Millisecond), hr.err)
						}
						_ = r.l.Unlock(t.Context())
					case <-time.After(6 * time.Second):
						info, _, _ := inner.Inspect(t.Context(), "n")
						t.Fatalf("run %d: the waiter behind still waits 6s after the close: %+v", i, info)
					}
					if left := storeLeftovers(t, rdb, "n", 6*time.Second); len(left) > 0 {
						t.Errorf("run %d: left on the store: %v", i, left)
					}
				}
				if len(slow) > 0 {
					t.Errorf("%d of 12 waiters behind a closed head waited over 500ms: %v", len(slow), slow)
				}
			})
		}
	}
}

// A plain reader or permit behind a plain writer that waits for the holds
// with its intent (it does not queue) and whose Client dies gets in once
// the intent lapses (three times the safety margin: 3 s), with few requests.
func TestSharedWaiterBehindDeadPlainWriterIntentGetsIn(t *testing.T) {
	for _, tc := range []struct {
		name   string
		shared func(p *proc) func(context.Context) (*dlock.Lease, error)
		writer func(p *proc) func(context.Context) (*dlock.Lease, error)
	}{
		{"reader", func(p *proc) func(context.Context) (*dlock.Lease, error) { return p.c.RWMutex("n").RLock },
			func(p *proc) func(context.Context) (*dlock.Lease, error) { return p.c.RWMutex("n").Lock }},
		{"permit", func(p *proc) func(context.Context) (*dlock.Lease, error) { return p.c.Semaphore("n", 2).Acquire },
			func(p *proc) func(context.Context) (*dlock.Lease, error) { return p.c.Mutex("n").Lock }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := testserver.StartRedis(t)
			inner := redislock.New(srv.Client(t))
			holder, writer, back := newProc(t, srv), newProc(t, srv), newProc(t, srv)
			if _, err := tc.shared(holder)(t.Context()); err != nil {
				t.Fatal(err)
			}
			_ = start(t, tc.writer(writer))
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				if info, _, _ := inner.Inspect(t.Context(), "n"); info.WriterWaiting {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("no writer intent")
				}
			}
			got := start(t, tc.shared(back))
			time.Sleep(300 * time.Millisecond)
			writer.kill()
			died := time.Now()
			n0 := back.b.acquires.Load()
			select {
			case r := <-got:
				if r.err != nil {
					t.Fatal(r.err)
				}
				t.Logf("in %v after the writer's death, %d requests", r.at.Sub(died).Round(time.Millisecond), back.b.acquires.Load()-n0)
				if d := r.at.Sub(died); d > 4*time.Second {
					t.Errorf("got in %v after the writer's death; want within its intent's 3 s", d)
				}
				if n := back.b.acquires.Load() - n0; n > 10 {
					t.Errorf("%d requests while the dead writer's intent lapsed", n)
				}
			case <-time.After(8 * time.Second):
				info, _, _ := inner.Inspect(t.Context(), "n")
				t.Fatalf("still waits 8s after the writer's death: %+v", info)
			}
		})
	}
}

// A release that hands the queue's readers their holds and stops at a
// queued writer (which queued behind an exclusive holder, so has no writer
// intent) leaves that writer the next turn: a new plain reader of another
// Client must not come in beside the handed readers until the writer has
// had it.
func TestWriterHeadAfterHandedReadersKeepsNewReadersOut(t *testing.T) {
	srv := testserver.StartRedis(t)
	inner := redislock.New(srv.Client(t))
	x, r1, w, n := newProc(t, srv), newProc(t, srv), newProc(t, srv), newProc(t, srv)
	held, err := x.c.RWMutex("n").Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	reader := start(t, r1.c.RWMutex("n").RLock)
	queuedAt(t, inner, "n", 1)
	writer := start(t, w.c.RWMutex("n").Lock)
	queuedAt(t, inner, "n", 2)
	time.Sleep(200 * time.Millisecond)
	if err := held.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	rr := <-reader
	if rr.err != nil {
		t.Fatal(rr.err)
	}
	info, _, _ := inner.Inspect(t.Context(), "n")
	t.Logf("after the release: %+v", info)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if l, err := n.c.RWMutex("n").RLock(ctx); err == nil {
		info, _, _ := inner.Inspect(t.Context(), "n")
		t.Errorf("a new plain reader came in beside the handed reader, before the queued writer: %+v", info)
		_ = l.Unlock(t.Context())
	}
	_ = rr.l.Unlock(t.Context())
	if wr := <-writer; wr.err != nil {
		t.Fatal(wr.err)
	} else {
		_ = wr.l.Unlock(t.Context())
	}
}

// TestHandedHoldsKeysExpireWithLatestHold: a release that hands permits
// gives the holds' keys the expiry of the latest hold, whether that is a
// live hold that stays (it expires after the handed ones) or a handed one,
// with a hold that expired and was never pruned still in the zset (a
// release does not prune it); the handed hold expires with its queue entry.
func TestHandedHoldsKeysExpireWithLatestHold(t *testing.T) {
	b, rdb, _ := setup(t)
	ctx := t.Context()
	for _, staysLatest := range []bool{true, false} {
		key := fmt.Sprintf("handed-latest-%v", staysLatest)
		s, si, qe := "dlock:{"+key+"}:s", "dlock:{"+key+"}:si", "dlock:{"+key+"}:qe"
		permit := func(tok string, ttl time.Duration) driver.AcquireRequest {
			return driver.AcquireRequest{Key: key, Token: tok, Owner: "owner-" + tok, TTL: ttl,
				Mode: driver.Shared, Limit: 3, Fair: true, Wait: true, QueueTTL: 20 * time.Second, Handoff: true}
		}
		stays := 5 * time.Second
		if staysLatest {
			stays = time.Minute
		}
		mustAcquire(t, b, permit("short", 200*time.Millisecond))
		mustAcquire(t, b, permit("stays", stays))
		mustAcquire(t, b, permit("goes", 10*time.Second))
		if res := acquire(t, b, permit("queued", 10*time.Second)); res.Acquired || !res.Queued {
			t.Fatalf("%s: the fourth permit request: %+v; want queued", key, res)
		}
		entry := rdb.ZScore(ctx, qe, "queued").Val()
		time.Sleep(300 * time.Millisecond) // "short" expires, unpruned
		if _, err := b.Release(ctx, key, "goes"); err != nil {
			t.Fatal(err)
		}
		holds := rdb.ZRangeWithScores(ctx, s, 0, -1).Val()
		scores := map[string]float64{}
		for _, z := range holds {
			scores[z.Member.(string)] = z.Score
		}
		if len(holds) != 3 || scores["short"] == 0 || scores["queued"] != entry {
			t.Fatalf("%s: holds %v after the release; want the expired one kept and the head's handed, expiring with its entry (%v)", key, holds, entry)
		}
		want := time.Duration(max(scores["stays"], scores["queued"])) * time.Millisecond
		for _, k := range []string{s, si} {
			if at := rdb.PExpireTime(ctx, k).Val(); at != want {
				t.Errorf("%s expires at %v, want %v (the latest hold's expiry)", k, at, want)
			}
		}
	}
}
