package sqllock_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/sqllock"
)

// testRoundTrips counts the statements (BEGIN, COMMIT and ROLLBACK
// included) that each operation sends, logs them, and holds the common
// exclusive operations to one statement. On MySQL these are round trips
// with interpolateParams=true; without it, each statement with parameters
// takes two more (prepare, close).
func testRoundTrips(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	other := db.backend(t) // sets up the state each operation meets
	pool, n := db.counting(t)
	b := sqllock.New(pool, db.dialect)
	if err := b.CreateTable(t.Context()); err != nil {
		t.Fatal(err)
	}
	var lines []string
	count := func(what string, want int64, op func()) int64 {
		t.Helper()
		n.Store(0)
		op()
		got := n.Load()
		lines = append(lines, fmt.Sprintf("%-58s %d", what, got))
		if want > 0 && got != want {
			t.Errorf("%s: %d statements, want %d", what, got, want)
		}
		return got
	}
	key := func() string { return "rt/" + newToken()[:8] }

	// Exclusive.
	k := key()
	w := writeReq(k, "w", time.Minute)
	first := int64(1)
	if db.dialect == sqllock.MySQL {
		first = 3 // UPDATE, SELECT, INSERT: the first grant of a name ever
	}
	count("exclusive acquire, a new name", first, func() { mustAcquire(t, b, w) })
	count("exclusive renew", 1, func() { renew(t, b, k, w.Token, time.Minute) })
	count("exclusive release", 1, func() { release(t, b, k, w.Token) })
	count("exclusive acquire, a free name", 1, func() { mustAcquire(t, b, w) })
	count("exclusive acquire, refused (held)", 0, func() { refused(t, b, writeReq(k, "x", time.Minute)) })
	release(t, b, k, w.Token)
	count("release of nothing", 0, func() { release(t, b, k, newToken()) })

	// Shared.
	k = key()
	r := readReq(k, "r", time.Minute, 0)
	count("reader acquire, a new name", 0, func() { mustAcquire(t, b, r) })
	r2 := readReq(k, "r2", time.Minute, 0)
	count("reader acquire, beside a reader", 0, func() { mustAcquire(t, b, r2) })
	count("reader renew", 0, func() { renew(t, b, k, r.Token, time.Minute) })
	count("exclusive acquire, refused (readers)", 0, func() { refused(t, b, writeReq(k, "x", time.Minute)) })
	ww := waiting(writeReq(k, "ww", time.Minute), 5*time.Second)
	count("exclusive acquire with Wait, refused (readers): intent", 0, func() { refused(t, b, ww) })
	count("reader acquire, refused (intent)", 0, func() { refused(t, b, readReq(k, "r3", time.Minute, 0)) })
	count("release of a writer's intent", 0, func() { release(t, b, k, ww.Token) })
	count("reader release", 0, func() { release(t, b, k, r.Token) })
	release(t, b, k, r2.Token)
	x := writeReq(k, "x", time.Minute)
	mustAcquire(t, other, x)
	count("reader acquire, refused (writer)", 0, func() { refused(t, b, readReq(k, "r4", time.Minute, 0)) })
	release(t, other, k, x.Token)

	// Semaphore.
	k = key()
	p := readReq(k, "p", time.Minute, 2)
	count("permit acquire, a new name", 0, func() { mustAcquire(t, b, p) })
	mustAcquire(t, other, readReq(k, "p2", time.Minute, 2))
	count("permit acquire, refused (limit)", 0, func() { refused(t, b, readReq(k, "p3", time.Minute, 2)) })
	count("permit release", 0, func() { release(t, b, k, p.Token) })

	// Fair.
	k = key()
	f := fair(writeReq(k, "f", time.Minute))
	count("fair acquire, a new name", 0, func() { mustAcquire(t, b, f) })
	q := waiting(fair(writeReq(k, "q", time.Minute)), 5*time.Second)
	count("fair acquire with Wait, refused: enqueue", 0, func() { refused(t, b, q) })
	// A poll of a waiter whose entry has more than half its time left is
	// one read; past that, the transaction refreshes the entry.
	count("fair acquire with Wait, refused: keep the place (a read)", 1, func() { refused(t, b, q) })
	qs := waiting(fair(writeReq(k, "qs", time.Minute)), 600*time.Millisecond)
	refused(t, b, qs)
	time.Sleep(400 * time.Millisecond)
	if got := count("fair acquire with Wait, refused: refresh the place", 0, func() { refused(t, b, qs) }); got < 3 {
		t.Errorf("a poll past half the entry's time took %d statements: it did not refresh the entry", got)
	}
	release(t, b, k, qs.Token)
	count("fair release (exclusive)", 1, func() { release(t, b, k, f.Token) })
	// On MySQL the head, whose poll finds the lock free, takes it with an
	// UPDATE and the deletion of its entry after that read, not the
	// transaction's six statements.
	head := int64(0)
	if db.dialect == sqllock.MySQL {
		head = 3
	}
	count("fair acquire, the head", head, func() { mustAcquire(t, b, q) })
	q2 := waiting(fair(writeReq(k, "q2", time.Minute)), 5*time.Second)
	refused(t, b, q2)
	count("release of a queued waiter", 0, func() { release(t, b, k, q2.Token) })
	release(t, b, k, q.Token)
	// On MySQL and PostgreSQL a first fair request on a free name that
	// this Backend has queued nobody on takes it with one UPDATE.
	k = key()
	made := writeReq(k, "made", time.Minute)
	mustAcquire(t, other, made) // the name's row exists
	release(t, other, k, made.Token)
	free := int64(0)
	if db.dialect == sqllock.MySQL || db.dialect == sqllock.PostgreSQL {
		free = 1
	}
	fw := waiting(fair(writeReq(k, "fw", time.Minute)), 5*time.Second)
	count("fair acquire with Wait, a free name nobody waits for", free, func() { mustAcquire(t, b, fw) })
	release(t, b, k, fw.Token)
	ft := fair(writeReq(k, "ft", time.Minute))
	count("fair acquire without Wait (TryLock), a free name nobody waits for", free, func() { mustAcquire(t, b, ft) })
	release(t, b, k, ft.Token)

	// Batches, inspection.
	ex, sh := writeReq(key(), "e", time.Minute), readReq(key(), "s", time.Minute, 0)
	mustAcquire(t, other, ex)
	mustAcquire(t, other, sh)
	count("RenewBatch, 1 exclusive", 1, func() {
		b.RenewBatch(t.Context(), []driver.RenewRequest{{Key: ex.Key, Token: ex.Token, TTL: 2 * time.Minute}})
	})
	count("RenewBatch, 1 exclusive + 1 shared", 0, func() {
		b.RenewBatch(t.Context(), []driver.RenewRequest{
			{Key: ex.Key, Token: ex.Token, TTL: 3 * time.Minute}, {Key: sh.Key, Token: sh.Token, TTL: 3 * time.Minute}})
	})
	count("Inspect", 1, func() { inspect(t, b, sh.Key) })
	count("List", 1, func() {
		if _, err := b.List(t.Context(), "rt/"); err != nil {
			t.Fatal(err)
		}
	})
	count("ForceRelease", 0, func() {
		if _, ok, err := b.ForceRelease(t.Context(), sh.Key); err != nil || !ok {
			t.Fatalf("ForceRelease = %v, %v", ok, err)
		}
	})
	t.Logf("%v, statements per operation:\n%s", db.dialect, strings.Join(lines, "\n"))
}
