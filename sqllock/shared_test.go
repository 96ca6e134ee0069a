package sqllock_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/sqllock"
)

// The driver-level rules for shared holds, writer intents and fair queues
// (driver.AcquireRequest's documentation), one test per rule, on every
// engine.

func readReq(key, owner string, ttl time.Duration, limit int) driver.AcquireRequest {
	return driver.AcquireRequest{Key: key, Token: newToken(), Owner: owner, TTL: ttl, Mode: driver.Shared, Limit: limit}
}

func writeReq(key, owner string, ttl time.Duration) driver.AcquireRequest {
	return driver.AcquireRequest{Key: key, Token: newToken(), Owner: owner, TTL: ttl}
}

// waiting returns req with Wait and a QueueTTL.
func waiting(req driver.AcquireRequest, queueTTL time.Duration) driver.AcquireRequest {
	req.Wait, req.QueueTTL = true, queueTTL
	return req
}

func fair(req driver.AcquireRequest) driver.AcquireRequest {
	req.Fair = true
	return req
}

func refused(t *testing.T, b driver.Backend, req driver.AcquireRequest) driver.AcquireResult {
	t.Helper()
	res := acquire(t, b, req)
	if res.Acquired {
		t.Fatalf("Acquire(%q, %s owner %q) granted, want refused", req.Key, req.Mode, req.Owner)
	}
	return res
}

// noRows checks that the tables keep nothing for key but its row and fence.
func noRows(t *testing.T, db *database, key string) {
	t.Helper()
	if left := heldRows(t, db, key); len(left) > 0 {
		t.Errorf("left for %q: %v", key, left)
	}
}

// testSharedExcludesExclusive: readers share; an exclusive request is
// refused while a live shared hold is there, naming the one that expires
// last; a reader is refused while an exclusive holder is there; the last
// reader's release lets a writer in at once.
func testSharedExcludesExclusive(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	b := db.backend(t)
	req0 := readReq("k", "r0", 10*time.Second, 0)
	req1 := readReq("k", "r1", 10*time.Second, 0)
	req2 := readReq("k", "r2", 20*time.Second, 0)
	g0 := mustAcquire(t, b, req0)
	g1 := mustAcquire(t, b, req1)
	g2 := mustAcquire(t, b, req2)
	if g1.Fence <= g0.Fence || g2.Fence <= g1.Fence || g1.Holds != 1 {
		t.Errorf("shared grants %+v, %+v, %+v: want increasing fences and 1 hold", g0, g1, g2)
	}

	for _, req := range []driver.AcquireRequest{
		writeReq("k", "w", time.Minute),
		fair(writeReq("k", "w", time.Minute)),
		func() driver.AcquireRequest { r := writeReq("k", "w", time.Minute); r.Reentrant = true; return r }(),
	} {
		res := refused(t, b, req)
		if res.Holder != "r2" || !near(res.HolderTTL, 20*time.Second, 2*time.Second) || res.Shared != 3 || res.Queued || res.Position != 0 {
			t.Errorf("exclusive (fair %v) beside readers = %+v, want refused naming r2 (about 20s) with 3 shared, nothing recorded", req.Fair, res)
		}
	}
	if info, ok := inspect(t, b, "k"); !ok || len(info.Shared) != 3 || info.Owner != "" || info.WriterWaiting || info.Queued != 0 {
		t.Errorf("Inspect = %+v, %v; want 3 shared holds and nothing else", info, ok)
	}

	// Releasing the readers: a shared hold's release is one hold, none left.
	for _, r := range []driver.AcquireRequest{req1, req2} {
		if got := release(t, b, "k", r.Token); got != (driver.ReleaseResult{Held: true, Remaining: 0}) {
			t.Errorf("Release of a shared hold = %+v, want held with 0 remaining", got)
		}
		if got := release(t, b, "k", r.Token); got.Held {
			t.Errorf("second Release of a shared hold = %+v, want not held", got)
		}
	}
	// One reader left, then none.
	if res := refused(t, b, writeReq("k", "w", time.Minute)); res.Shared != 1 || res.Holder != "r0" {
		t.Errorf("exclusive beside one reader = %+v, want refused naming r0", res)
	}
	release(t, b, "k", req0.Token)

	// No reader left: the writer is in at once, with the next fence.
	w := writeReq("k", "w", time.Minute)
	gw := mustAcquire(t, b, w)
	if gw.Fence != g2.Fence+1 {
		t.Errorf("writer's fence %d, want %d", gw.Fence, g2.Fence+1)
	}
	for _, limit := range []int{0, 3} {
		res := refused(t, b, readReq("k", "r3", time.Minute, limit))
		if res.Holder != "w" || !near(res.HolderTTL, time.Minute, 2*time.Second) || res.WriterWaiting || res.Queued || res.Shared != 0 {
			t.Errorf("reader (limit %d) beside a writer = %+v, want refused naming w", limit, res)
		}
	}
	release(t, b, "k", w.Token)
	noRows(t, db, "k")
}

// testSharedExpires: an expired shared hold keeps nobody out, cannot be
// renewed, and its release is not held (and removes its row).
func testSharedExpires(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	b := db.backend(t)
	r := readReq("k", "r", 100*time.Millisecond, 0)
	mustAcquire(t, b, r)
	time.Sleep(250 * time.Millisecond)
	if _, ok := inspect(t, b, "k"); ok {
		t.Error("Inspect shows an expired shared hold")
	}
	if renew(t, b, "k", r.Token, time.Minute) {
		t.Error("Renew revived an expired shared hold")
	}
	w := writeReq("k", "w", time.Minute)
	mustAcquire(t, b, w)
	if got := release(t, b, "k", r.Token); got.Held {
		t.Errorf("Release of an expired shared hold = %+v, want not held", got)
	}
	release(t, b, "k", w.Token)

	// A semaphore counts live holds only. A refusal seen after p's TTL had
	// run out would show nothing (a loaded machine can take that long):
	// then the check is made again with a TTL twice as long.
	for ttl := 100 * time.Millisecond; ; ttl *= 2 {
		start := time.Now()
		p := readReq("sem", "p", ttl, 1)
		mustAcquire(t, b, p)
		early := readReq("sem", "q", time.Minute, 1)
		res := acquire(t, b, early)
		if time.Since(start) >= ttl && ttl < 10*time.Second {
			if res.Acquired {
				release(t, b, "sem", early.Token)
			}
			release(t, b, "sem", p.Token)
			continue
		}
		if res.Acquired {
			t.Fatalf("Acquire(%q, shared owner %q) granted beside a live permit, want refused", early.Key, early.Owner)
		}
		time.Sleep(ttl + 150*time.Millisecond)
		break
	}
	q := readReq("sem", "q", time.Minute, 1)
	mustAcquire(t, b, q)
	release(t, b, "sem", q.Token)
	noRows(t, db, "k")
	noRows(t, db, "sem")
}

// testSemaphoreLimit: Limit caps the live shared holds; a refusal names the
// hold that expires first and counts them, and records nothing; a lower
// limit refuses without taking a hold away.
func testSemaphoreLimit(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	b := db.backend(t)
	var held []driver.AcquireRequest
	for i, ttl := range []time.Duration{30 * time.Second, 10 * time.Second, 20 * time.Second} {
		req := readReq("sem", fmt.Sprint("p", i), ttl, 3)
		mustAcquire(t, b, req)
		held = append(held, req)
	}
	for _, wait := range []bool{false, true} {
		req := readReq("sem", "late", time.Minute, 3)
		if wait {
			req = waiting(req, 5*time.Second)
		}
		res := refused(t, b, req)
		if res.Holder != "p1" || !near(res.HolderTTL, 10*time.Second, 2*time.Second) || res.Shared != 3 || res.Queued || res.WriterWaiting {
			t.Errorf("permit over the limit (wait %v) = %+v, want refused naming p1 (about 10s), 3 shared, nothing recorded", wait, res)
		}
	}
	// Another limit, lower or higher, or a reader: refused as a conflict
	// while the holds live; the holds stay.
	for _, limit := range []int{2, 4, 0} {
		res := refused(t, b, readReq("sem", "other", time.Minute, limit))
		if !res.Conflict || res.HeldLimit != 3 || res.Shared != 3 || res.Holder != "p0" {
			t.Errorf("shared request of limit %d beside permits of 3 = %+v, want a conflict with limit 3, 3 shared, naming p0 (the last to expire)", limit, res)
		}
	}
	info, _ := inspect(t, b, "sem")
	if len(info.Shared) != 3 || info.Limit != 3 {
		t.Errorf("Inspect = %+v, want 3 holds and Limit 3", info)
	}
	for _, r := range held {
		if got := release(t, b, "sem", r.Token); !got.Held {
			t.Errorf("Release of permit %s = %+v", r.Owner, got)
		}
	}
	noRows(t, db, "sem")
}

// testWriterIntent: an exclusive request with Wait that readers refuse
// records its intent, which keeps new readers out (WriterWaiting, naming
// the writer) but not the readers already in; another writer's intent is
// not replaced; the writer's grant, or its Release, removes the intent.
func testWriterIntent(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	b := db.backend(t)
	r := readReq("k", "r", time.Minute, 0)
	mustAcquire(t, b, r)

	// Without Wait nothing is recorded.
	if res := refused(t, b, writeReq("k", "w", time.Minute)); res.Queued {
		t.Errorf("TryLock beside a reader = %+v, want nothing recorded", res)
	}
	r2 := readReq("k", "r2", time.Minute, 0)
	mustAcquire(t, b, r2)

	w := waiting(writeReq("k", "w", time.Minute), 5*time.Second)
	if res := refused(t, b, w); !res.Queued || res.Shared != 2 {
		t.Errorf("writer with Wait beside readers = %+v, want Queued with 2 shared", res)
	}
	res := refused(t, b, readReq("k", "r3", time.Minute, 0))
	if !res.WriterWaiting || res.Holder != "w" || !near(res.HolderTTL, 5*time.Second, 2*time.Second) || res.Queued {
		t.Errorf("reader behind a writer's intent = %+v, want WriterWaiting naming w (about 5s)", res)
	}
	// A permit beside readers conflicts, whatever else refuses it.
	if res := refused(t, b, readReq("k", "r3", time.Minute, 5)); !res.Conflict || res.HeldLimit != 0 || res.Queued {
		t.Errorf("permit beside readers, behind a writer's intent = %+v, want a conflict with readers", res)
	}
	if info, _ := inspect(t, b, "k"); !info.WriterWaiting {
		t.Errorf("Inspect = %+v, want WriterWaiting", info)
	}

	// A second writer waits without an intent of its own.
	w2 := waiting(writeReq("k", "w2", time.Minute), 5*time.Second)
	if res := refused(t, b, w2); res.Queued {
		t.Errorf("second writer = %+v, want not Queued (the first writer's intent is live)", res)
	}
	// The first writer refreshes its intent.
	time.Sleep(50 * time.Millisecond)
	if res := refused(t, b, w); !res.Queued {
		t.Errorf("writer's second attempt = %+v, want Queued", res)
	}

	// The readers leave; the writer gets in, its intent goes with the grant.
	release(t, b, "k", r.Token)
	refused(t, b, w)
	release(t, b, "k", r2.Token)
	mustAcquire(t, b, w)
	info, _ := inspect(t, b, "k")
	if info.WriterWaiting || info.Owner != "w" {
		t.Errorf("after the writer's grant: %+v, want w holding and no intent", info)
	}
	release(t, b, "k", w.Token)
	r4 := readReq("k", "r4", time.Minute, 0)
	mustAcquire(t, b, r4)

	// A writer that gives up removes its intent with Release.
	w3 := waiting(writeReq("k", "w3", time.Minute), 5*time.Second)
	if res := refused(t, b, w3); !res.Queued {
		t.Fatalf("writer w3 = %+v, want Queued", res)
	}
	if got := release(t, b, "k", w3.Token); got.Held {
		t.Errorf("Release of a waiting writer = %+v, want not held", got)
	}
	r5 := readReq("k", "r5", time.Minute, 0)
	mustAcquire(t, b, r5)
	release(t, b, "k", r4.Token)
	release(t, b, "k", r5.Token)
	noRows(t, db, "k")

	// An intent lapses QueueTTL after it was last kept.
	r6 := readReq("k", "r6", time.Minute, 0)
	mustAcquire(t, b, r6)
	w4 := waiting(writeReq("k", "w4", time.Minute), 150*time.Millisecond)
	refused(t, b, w4)
	refused(t, b, readReq("k", "blocked", time.Minute, 0))
	time.Sleep(300 * time.Millisecond)
	r7 := readReq("k", "r7", time.Minute, 0)
	mustAcquire(t, b, r7)
	release(t, b, "k", r6.Token)
	release(t, b, "k", r7.Token)
	release(t, b, "k", w4.Token)
	noRows(t, db, "k")
}

// testFairPollTakesNoRowLock checks that a fair waiter's poll, while
// another token holds the lock and the waiter's entry is fresh, is answered
// from a read that waits for no lock: with the name's row locked by another
// transaction, as a release or a grant locks it, the poll still answers at
// once (it would wait for that transaction if it wrote).
func testFairPollTakesNoRowLock(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	b := db.backend(t)
	mustAcquire(t, b, fair(writeReq("k", "h", time.Minute)))
	w := waiting(fair(writeReq("k", "w", time.Minute)), time.Minute)
	if res := refused(t, b, w); !res.Queued || res.Position != 1 {
		t.Fatalf("fair request behind a holder = %+v, want queued first", res)
	}

	tx, err := db.open(t).BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	lockRow := "UPDATE dlock_locks SET name = name WHERE name = ?"
	if db.dialect == sqllock.PostgreSQL {
		lockRow = strings.ReplaceAll(lockRow, "?", "$1")
	}
	if _, err := tx.ExecContext(t.Context(), lockRow, "k"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	res, err := b.Acquire(ctx, w)
	if err != nil || !res.Queued || res.Position != 1 || res.Holder != "h" {
		t.Fatalf("the waiter's poll with the row locked = %+v, %v; want queued first behind h, answered without waiting", res, err)
	}
}

// testFairQueue: Fair requests with Wait queue in arrival order and keep
// their place; a Fair request without Wait yields to the queue and records
// nothing; only the head is granted when the lock frees; a grant or a
// Release removes the entry; a lapsed entry goes to the tail; a re-entry
// joins its grant whatever the queue.
func testFairQueue(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	b := db.backend(t)
	const qttl = 5 * time.Second
	h := fair(writeReq("k", "h", time.Minute))
	h.Reentrant = true
	first := mustAcquire(t, b, h)

	a := waiting(fair(writeReq("k", "a", time.Minute)), qttl)
	c := waiting(fair(writeReq("k", "c", time.Minute)), qttl)
	d := waiting(fair(writeReq("k", "d", time.Minute)), qttl)
	for i, req := range []driver.AcquireRequest{a, c, d, a, c} {
		res := refused(t, b, req)
		want := []int{1, 2, 3, 1, 2}[i]
		if !res.Queued || res.Position != want || res.Holder != "h" || !near(res.HolderTTL, time.Minute, 2*time.Second) {
			t.Errorf("attempt %d of %s = %+v, want Queued at %d, naming h", i, req.Owner, res, want)
		}
	}
	if info, _ := inspect(t, b, "k"); info.Queued != 3 || info.Owner != "h" {
		t.Errorf("Inspect = %+v, want h holding with 3 queued", info)
	}
	// The holder re-enters past the queue.
	if res := mustAcquire(t, b, h); res.Fence != first.Fence || res.Holds != 2 {
		t.Errorf("fair re-entry = %+v, want fence %d, 2 holds", res, first.Fence)
	}
	release(t, b, "k", h.Token)
	release(t, b, "k", h.Token)

	// Free, with a queue: a TryLock yields, records nothing, takes no place.
	try := fair(writeReq("k", "try", time.Minute))
	if res := refused(t, b, try); res.Queued || res.Position != 0 || res.Holder != "" {
		t.Errorf("fair TryLock on a free lock with a queue = %+v, want refused, nothing recorded", res)
	}
	for _, req := range []driver.AcquireRequest{c, d} {
		if res := refused(t, b, req); res.Acquired || res.Position < 2 {
			t.Errorf("%s behind the head = %+v", req.Owner, res)
		}
	}
	ga := mustAcquire(t, b, a)
	if ga.Fence != first.Fence+1 {
		t.Errorf("head's grant fence %d, want %d", ga.Fence, first.Fence+1)
	}
	if res := refused(t, b, c); res.Position != 1 {
		t.Errorf("c after a's grant = %+v, want position 1 (a's entry went with its grant)", res)
	}
	// c gives up: d becomes the head.
	if got := release(t, b, "k", c.Token); got.Held {
		t.Errorf("Release of a queued waiter = %+v, want not held", got)
	}
	if res := refused(t, b, d); res.Position != 1 {
		t.Errorf("d after c left = %+v, want position 1", res)
	}
	release(t, b, "k", a.Token)

	// A lapsed entry goes to the tail.
	e := waiting(fair(writeReq("k", "e", time.Minute)), 150*time.Millisecond)
	f := waiting(fair(writeReq("k", "f", time.Minute)), qttl)
	holder := fair(writeReq("k", "holder", time.Minute))
	if res := acquire(t, b, holder); res.Acquired {
		t.Fatal("a newcomer passed d, the head")
	}
	mustAcquire(t, b, d)
	refused(t, b, e)
	refused(t, b, f)
	time.Sleep(300 * time.Millisecond)
	if res := refused(t, b, e); res.Position != 2 {
		t.Errorf("e after its entry lapsed = %+v, want position 2 (behind f)", res)
	}
	release(t, b, "k", d.Token)
	mustAcquire(t, b, f)
	release(t, b, "k", f.Token)
	mustAcquire(t, b, e)
	release(t, b, "k", e.Token)
	noRows(t, db, "k")

	// A plain request ignores the queue.
	g := waiting(fair(writeReq("k", "g", time.Minute)), qttl)
	mustAcquire(t, b, g)
	q := waiting(fair(writeReq("k", "q", time.Minute)), qttl)
	refused(t, b, q)
	release(t, b, "k", g.Token)
	p := writeReq("k", "plain", time.Minute)
	mustAcquire(t, b, p)
	release(t, b, "k", p.Token)
	release(t, b, "k", q.Token)
	noRows(t, db, "k")
}

// testFairBehindReaders: a fair writer blocked by readers queues and
// records its intent, and gets in when they leave.
func testFairBehindReaders(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	b := db.backend(t)
	r := readReq("k", "r", time.Minute, 0)
	mustAcquire(t, b, r)
	w := waiting(fair(writeReq("k", "w", time.Minute)), 5*time.Second)
	if res := refused(t, b, w); !res.Queued || res.Position != 1 || res.Shared != 1 || res.Holder != "r" {
		t.Errorf("fair writer beside a reader = %+v, want queued first, naming r", res)
	}
	if res := refused(t, b, readReq("k", "r2", time.Minute, 0)); !res.WriterWaiting {
		t.Errorf("reader behind a fair writer = %+v, want WriterWaiting", res)
	}
	release(t, b, "k", r.Token)
	mustAcquire(t, b, w)
	release(t, b, "k", w.Token)
	noRows(t, db, "k")
}

// testSharedRenew: a shared hold's renewal extends it (never shortens it)
// and keeps writers out past its first expiry; RenewBatch renews exclusive
// and shared leases together.
func testSharedRenew(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	b := db.backend(t)
	r := readReq("k", "r", 300*time.Millisecond, 0)
	mustAcquire(t, b, r)
	if !renew(t, b, "k", r.Token, 10*time.Second) {
		t.Fatal("Renew of a shared hold refused")
	}
	if !renew(t, b, "k", r.Token, time.Second) {
		t.Error("a shorter Renew of a shared hold refused")
	}
	time.Sleep(500 * time.Millisecond)
	if res := refused(t, b, writeReq("k", "w", time.Minute)); !near(res.HolderTTL, 10*time.Second, 2*time.Second) {
		t.Errorf("writer after the first TTL = %+v, want refused for about 10s more", res)
	}
	if renew(t, b, "k", newToken(), time.Minute) {
		t.Error("Renew by a stranger accepted")
	}

	// A batch of every kind.
	x := writeReq("x", "x", time.Second)
	mustAcquire(t, b, x)
	p := readReq("sem", "p", time.Second, 2)
	mustAcquire(t, b, p)
	reqs := []driver.RenewRequest{
		{Key: "k", Token: r.Token, TTL: 30 * time.Second},
		{Key: "x", Token: x.Token, TTL: 30 * time.Second},
		{Key: "sem", Token: p.Token, TTL: 30 * time.Second},
		{Key: "sem", Token: newToken(), TTL: 30 * time.Second},
		{Key: "none", Token: newToken(), TTL: 30 * time.Second},
	}
	got := b.RenewBatch(t.Context(), reqs)
	for i, want := range []bool{true, true, true, false, false} {
		if got[i].Held != want || got[i].Err != nil {
			t.Errorf("batch result %d (%s) = %+v, want held %v", i, reqs[i].Key, got[i], want)
		}
	}
	for _, key := range []string{"k", "x", "sem"} {
		info, _ := inspect(t, b, key)
		ttl := info.TTL
		if len(info.Shared) > 0 {
			ttl = info.Shared[0].TTL
		}
		if !near(ttl, 30*time.Second, 2*time.Second) {
			t.Errorf("%s after the batch: %+v, want about 30s left", key, info)
		}
	}
	res := refused(t, b, writeReq("sem", "w", time.Minute))
	if !near(res.HolderTTL, 30*time.Second, 2*time.Second) {
		t.Errorf("writer on sem = %+v, want refused for about 30s (shared_until raised by the batch)", res)
	}
	release(t, b, "k", r.Token)
	release(t, b, "x", x.Token)
	release(t, b, "sem", p.Token)
	for _, key := range []string{"k", "x", "sem"} {
		noRows(t, db, key)
	}
}

// testSharedInspect: Inspect and List describe shared holds, oldest grant
// first, list names with only shared holds, and ForceRelease removes every
// hold (the queue stays).
func testSharedInspect(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	b := db.backend(t)
	r1 := readReq("app/r", "r1", time.Minute, 0)
	r2 := readReq("app/r", "r2", 2*time.Minute, 0)
	g1 := mustAcquire(t, b, r1)
	g2 := mustAcquire(t, b, r2)
	w := writeReq("app/w", "w", time.Minute)
	mustAcquire(t, b, w)
	wait := waiting(fair(writeReq("app/w", "waiter", time.Minute)), 5*time.Second)
	refused(t, b, wait)
	free := readReq("app/free", "f", time.Minute, 0)
	mustAcquire(t, b, free)
	release(t, b, "app/free", free.Token)

	info, ok := inspect(t, b, "app/r")
	want := []driver.SharedHold{{Owner: "r1", Fence: g1.Fence}, {Owner: "r2", Fence: g2.Fence}}
	if !ok || info.Key != "app/r" || info.Owner != "" || info.Fence != 0 || info.Holds != 0 || len(info.Shared) != 2 {
		t.Fatalf("Inspect = %+v, %v", info, ok)
	}
	for i, s := range info.Shared {
		if s.Owner != want[i].Owner || s.Fence != want[i].Fence {
			t.Errorf("shared hold %d = %+v, want %+v", i, s, want[i])
		}
	}
	if !near(info.Shared[0].TTL, time.Minute, 2*time.Second) || !near(info.Shared[1].TTL, 2*time.Minute, 2*time.Second) {
		t.Errorf("shared TTLs %v, %v", info.Shared[0].TTL, info.Shared[1].TTL)
	}
	if info, _ := inspect(t, b, "app/w"); info.Owner != "w" || info.Queued != 1 || len(info.Shared) != 0 {
		t.Errorf("Inspect(app/w) = %+v, want w with 1 queued", info)
	}

	infos, err := b.List(t.Context(), "app/")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, i := range infos {
		keys = append(keys, fmt.Sprintf("%s:%d", i.Key, len(i.Shared)))
	}
	if got := strings.Join(keys, " "); got != "app/r:2 app/w:0" {
		t.Errorf("List = %q, want \"app/r:2 app/w:0\"", got)
	}

	forced, ok, err := b.ForceRelease(t.Context(), "app/r")
	if err != nil || !ok || len(forced.Shared) != 2 {
		t.Fatalf("ForceRelease = %+v, %v, %v", forced, ok, err)
	}
	if renew(t, b, "app/r", r1.Token, time.Minute) {
		t.Error("a shared hold renewed after ForceRelease")
	}
	if got := release(t, b, "app/r", r2.Token); got.Held {
		t.Errorf("a shared hold released after ForceRelease: %+v", got)
	}
	ww := writeReq("app/r", "ww", time.Minute)
	if res := mustAcquire(t, b, ww); res.Fence != g2.Fence+1 {
		t.Errorf("writer after ForceRelease: fence %d, want %d", res.Fence, g2.Fence+1)
	}
	release(t, b, "app/r", ww.Token)

	// ForceRelease of the writer keeps the queue.
	if _, ok, err := b.ForceRelease(t.Context(), "app/w"); err != nil || !ok {
		t.Fatalf("ForceRelease(app/w) = %v, %v", ok, err)
	}
	if info, ok := inspect(t, b, "app/w"); ok {
		t.Errorf("Inspect after ForceRelease = %+v, want not held", info)
	}
	if res := refused(t, b, fair(writeReq("app/w", "newcomer", time.Minute))); res.Queued {
		t.Errorf("fair newcomer = %+v", res)
	}
	mustAcquire(t, b, wait)
	release(t, b, "app/w", wait.Token)
	for _, key := range []string{"app/r", "app/w", "app/free"} {
		noRows(t, db, key)
	}
}

// testFencesAcrossKinds: exclusive, shared and fair grants of a name draw
// strictly increasing fences from its one counter.
func testFencesAcrossKinds(t *testing.T, newDB newDatabase) {
	b := newDB(t).backend(t)
	var last uint64
	for i := range 12 {
		var req driver.AcquireRequest
		switch i % 4 {
		case 0:
			req = writeReq("k", "w", time.Minute)
		case 1:
			req = readReq("k", "r", time.Minute, 0)
		case 2:
			req = readReq("k", "p", time.Minute, 2)
		case 3:
			req = fair(writeReq("k", "f", time.Minute))
		}
		res := mustAcquire(t, b, req)
		if res.Fence <= last {
			t.Fatalf("grant %d (%s, fair %v): fence %d after %d", i, req.Mode, req.Fair, res.Fence, last)
		}
		last = res.Fence
		release(t, b, "k", req.Token)
	}
}

// testSharedRequestsChecked: requests the contract does not allow are
// errors, and the backend has every capability.
func testSharedRequestsChecked(t *testing.T, newDB newDatabase) {
	b := newDB(t).backend(t)
	for _, c := range []driver.Capability{driver.CapShared, driver.CapSemaphore, driver.CapFair} {
		if !b.Supports(c) {
			t.Errorf("Supports(%v) = false", c)
		}
	}
	bad := []driver.AcquireRequest{
		{Key: "k", Token: newToken(), TTL: time.Second, Mode: driver.Mode(7)},
		{Key: "k", Token: newToken(), TTL: time.Second, Mode: driver.Shared, Limit: -1},
		{Key: "k", Token: newToken(), TTL: time.Second, Wait: true},
	}
	for _, req := range bad {
		if _, err := b.Acquire(t.Context(), req); err == nil {
			t.Errorf("Acquire(%+v) succeeded", req)
		}
	}
}

// testUpgrade makes the lock table of the earlier version by hand, with a
// held lock in it, and uses it with this version: the columns are added,
// the lock and its fence survive, and the new kinds work.
func testUpgrade(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	ddl := map[sqllock.Dialect]string{
		sqllock.MySQL: `CREATE TABLE dlock_locks (
  name VARBINARY(255) NOT NULL PRIMARY KEY, token VARBINARY(255) NULL,
  owner VARCHAR(2048) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  fence BIGINT NOT NULL, holds INT NOT NULL, acquired_at DATETIME(6) NOT NULL, expires_at DATETIME(6) NOT NULL
) ENGINE=InnoDB`,
		sqllock.PostgreSQL: `CREATE TABLE dlock_locks (
  name text COLLATE "C" NOT NULL PRIMARY KEY, token text, owner text NOT NULL, fence bigint NOT NULL,
  holds integer NOT NULL, acquired_at timestamptz NOT NULL, expires_at timestamptz NOT NULL)`,
		sqllock.SQLite: `CREATE TABLE dlock_locks (
  name TEXT NOT NULL PRIMARY KEY, token TEXT, owner TEXT NOT NULL, fence INTEGER NOT NULL,
  holds INTEGER NOT NULL, acquired_at INTEGER NOT NULL, expires_at INTEGER NOT NULL) WITHOUT ROWID`,
	}[db.dialect]
	insert := map[sqllock.Dialect]string{
		sqllock.MySQL:      `INSERT INTO dlock_locks VALUES ('held', 'tok', 'old', 7, 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 60 SECOND), ('free', NULL, 'old', 4, 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))`,
		sqllock.PostgreSQL: `INSERT INTO dlock_locks VALUES ('held', 'tok', 'old', 7, 1, now(), now() + interval '60 seconds'), ('free', NULL, 'old', 4, 0, now(), now())`,
		sqllock.SQLite: `INSERT INTO dlock_locks VALUES ('held', 'tok', 'old', 7, 1, unixepoch() * 1000, unixepoch() * 1000 + 60000),
  ('free', NULL, 'old', 4, 0, unixepoch() * 1000, unixepoch() * 1000)`,
	}[db.dialect]
	db.exec(t, ddl)
	db.exec(t, insert)

	// Without table creation, the old table is not enough.
	bare := db.backend(t, sqllock.WithoutCreateTable())
	if _, err := bare.Acquire(t.Context(), readReq("free", "r", time.Minute, 0)); err == nil {
		t.Error("a shared acquire on the old table without the new columns succeeded")
	}

	// Several Backends upgrade it at once.
	backends := make([]*sqllock.Backend, 3)
	errs := make(chan error, len(backends))
	for i := range backends {
		backends[i] = db.backend(t)
		go func() { errs <- backends[i].CreateTable(t.Context()) }()
	}
	for range backends {
		if err := <-errs; err != nil {
			t.Fatalf("CreateTable on the old table: %v", err)
		}
	}
	b := backends[0]
	if info, ok := inspect(t, b, "held"); !ok || info.Owner != "old" || info.Fence != 7 {
		t.Errorf("the old lock after the upgrade: %+v, %v", info, ok)
	}
	refused(t, b, readReq("held", "r", time.Minute, 0))
	if !renew(t, b, "held", "tok", time.Minute) {
		t.Error("the old holder's Renew refused after the upgrade")
	}
	if got := release(t, b, "held", "tok"); !got.Held {
		t.Errorf("the old holder's Release = %+v", got)
	}
	r := readReq("free", "r", time.Minute, 0)
	if res := mustAcquire(t, b, r); res.Fence != 5 {
		t.Errorf("shared grant on the old free row: fence %d, want 5", res.Fence)
	}
	refused(t, b, writeReq("free", "w", time.Minute))
	release(t, b, "free", r.Token)
	if res := mustAcquire(t, b, writeReq("held", "w", time.Minute)); res.Fence != 8 {
		t.Errorf("grant on the old held row: fence %d, want 8", res.Fence)
	}
	// A second CreateTable changes nothing.
	if err := b.CreateTable(t.Context()); err != nil {
		t.Errorf("CreateTable again: %v", err)
	}
	// The statements for DBAs say the same.
	up, err := sqllock.UpgradeDDL(db.dialect, "t2")
	if err != nil || strings.Count(up, "ALTER TABLE") != 9 {
		t.Errorf("UpgradeDDL = %q, %v", up, err)
	}
}

// testSideTableNames: the side tables of a long table name stay distinct
// identifiers within the limit, and work.
func testSideTableNames(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	long := strings.Repeat("x", 63)
	ddl, err := sqllock.DDL(db.dialect, long)
	if err != nil {
		t.Fatal(err)
	}
	stmts := strings.Split(ddl, ";\n\n")
	if len(stmts) != 4 {
		t.Fatalf("DDL = %d statements, want 4", len(stmts))
	}
	var names []string
	for _, s := range stmts {
		name := strings.Fields(s)[5] // CREATE TABLE IF NOT EXISTS name (
		names = append(names, strings.Trim(name, "`\""))
		if n := len(names[len(names)-1]); n > 63 {
			t.Errorf("table name %q is %d bytes", name, n)
		}
	}
	if len(slices.Compact(slices.Sorted(slices.Values(names)))) != 4 {
		t.Errorf("table names %q are not distinct", names)
	}
	b := db.backend(t, sqllock.WithTable(long))
	r := readReq("k", "r", time.Minute, 2)
	mustAcquire(t, b, r)
	release(t, b, "k", r.Token)
}
