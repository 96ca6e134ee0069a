package sqllock_test

import (
	"context"
	"database/sql"
	dsqldriver "database/sql/driver"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/sqllock"
)

// Shared holds, writer intents and fair queues: cases that each failed
// before their fix.

func sharedAndQueueCases(t *testing.T, newDB newDatabase) {
	t.Run("ReaderHoldWithinSharedUntil", func(t *testing.T) { testReaderHoldWithinSharedUntil(t, newDB) })
	t.Run("SharedRenewBesideWriter", func(t *testing.T) { testSharedRenewBesideWriter(t, newDB) })
	t.Run("TokenHoldsOnce", func(t *testing.T) { testTokenHoldsOnce(t, newDB) })
	t.Run("IntentKeptBehindWriter", func(t *testing.T) { testIntentKeptBehindWriter(t, newDB) })
	t.Run("FairIntentKeptBehindWriter", func(t *testing.T) { testFairIntentKeptBehindWriter(t, newDB) })
	t.Run("ReleasePrunes", func(t *testing.T) { testReleasePrunes(t, newDB) })
	t.Run("ForceReleasePrunes", func(t *testing.T) { testForceReleasePrunes(t, newDB) })
}

func TestSharedAndQueueCasesSQLite(t *testing.T) {
	sharedAndQueueCases(t, sqliteDatabases)
	t.Run("StalledReader", func(t *testing.T) { testStalledReader(t, sqliteDatabases) })
}

func TestSharedAndQueueCasesMariaDB(t *testing.T) {
	srv := testserver.StartMariaDB(t)
	newDB := mariadbDatabases(srv)
	sharedAndQueueCases(t, newDB)
	t.Run("StalledReader", func(t *testing.T) { testStalledReader(t, newDB) })
}

func TestSharedAndQueueCasesPostgres(t *testing.T) {
	srv := testserver.StartPostgres(t)
	newDB := postgresDatabases(srv)
	sharedAndQueueCases(t, newDB)
	t.Run("SharedReleaseNext", func(t *testing.T) { testSharedReleaseNext(t, newDB) })
}

// testReaderHoldWithinSharedUntil: an exclusive grant needs no live shared
// hold, and the exclusive upsert trusts shared_until, so shared_until must
// be at or after the expiry of every hold, however the statements of a
// reader's grant are timed.
func testReaderHoldWithinSharedUntil(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	b := db.backend(t)
	var q string
	switch db.dialect {
	case sqllock.MySQL:
		q = "SELECT TIMESTAMPDIFF(MICROSECOND, m.shared_until, s.expires_at) FROM dlock_locks m JOIN dlock_locks_shared s ON s.name = m.name WHERE s.token = ?"
	case sqllock.SQLite:
		q = "SELECT (s.expires_at - m.shared_until) * 1000 FROM dlock_locks m JOIN dlock_locks_shared s ON s.name = m.name WHERE s.token = ?"
	default:
		q = "SELECT (extract(epoch FROM s.expires_at - m.shared_until) * 1000000)::bigint FROM dlock_locks m JOIN dlock_locks_shared s ON s.name = m.name WHERE s.token = $1"
	}
	admin := db.admin(t)
	bad := 0
	for range 20 {
		r := readReq("k", "r", time.Minute, 0)
		mustAcquire(t, b, r)
		var over int64
		if err := admin.QueryRowContext(t.Context(), q, r.Token).Scan(&over); err != nil {
			t.Fatal(err)
		}
		if over > 0 {
			bad++
			if bad == 1 {
				t.Errorf("a reader's hold expires %dµs after shared_until", over)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of 20 reader grants left shared_until before the hold's expiry", bad)
	}
}

// testStalledReader (MySQL, SQLite: a reader's grant is a transaction of
// several statements): a reader whose client stalls between the upsert and
// the hold's insert (a GC pause, a slow network) must not keep a hold past
// shared_until, where a writer gets in beside it and the reader's Renew
// succeeds beside the writer.
func testStalledReader(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	probe, err := sql.Open(db.driverName, db.dsn)
	if err != nil {
		t.Fatal(err)
	}
	drv := probe.Driver()
	_ = probe.Close()
	var stall atomic.Bool
	pool := sql.OpenDB(&stallConnector{countingConnector{drv: drv, dsn: db.dsn, n: new(atomic.Int64)}, &stall})
	db.track(t, pool)
	b := sqllock.New(pool, db.dialect)
	other := db.backend(t)
	if err := b.CreateTable(t.Context()); err != nil {
		t.Fatal(err)
	}
	r := readReq("k", "r", 1500*time.Millisecond, 0)
	stall.Store(true)
	mustAcquire(t, b, r) // the upsert at T0 sets shared_until to T0+1.5s; the INSERT comes at T0+1s
	stall.Store(false)
	time.Sleep(700 * time.Millisecond)
	w := writeReq("k", "w", time.Minute)
	res := acquire(t, other, w)
	info, _ := inspect(t, other, "k")
	if res.Acquired && len(info.Shared) > 0 {
		t.Errorf("writer granted (fence %d) while the reader's hold is live: %+v", res.Fence, info.Shared)
	}
	if !res.Acquired && len(info.Shared) == 0 {
		t.Errorf("writer refused (%+v) with no live shared hold", res)
	}
	if res.Acquired && renew(t, other, "k", r.Token, time.Minute) {
		t.Errorf("the reader's Renew succeeded beside the writer")
	}
}

type stallConnector struct {
	countingConnector
	stall *atomic.Bool
}

func (c *stallConnector) Connect(ctx context.Context) (dsqldriver.Conn, error) {
	conn, err := c.countingConnector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &stallConn{countingConn: conn.(*countingConn), stall: c.stall}, nil
}

// stallConn pauses for a second before it sends the INSERT of a shared hold.
type stallConn struct {
	*countingConn
	stall *atomic.Bool
}

func (c *stallConn) pause(query string) {
	if c.stall.Load() && strings.HasPrefix(query, "INSERT INTO") && strings.Contains(query, "dlock_locks_shared") {
		time.Sleep(time.Second)
	}
}

func (c *stallConn) ExecContext(ctx context.Context, query string, args []dsqldriver.NamedValue) (dsqldriver.Result, error) {
	c.pause(query)
	return c.countingConn.ExecContext(ctx, query, args)
}

func (c *stallConn) QueryContext(ctx context.Context, query string, args []dsqldriver.NamedValue) (dsqldriver.Rows, error) {
	c.pause(query)
	return c.countingConn.QueryContext(ctx, query, args)
}

func (c *stallConn) PrepareContext(ctx context.Context, query string) (dsqldriver.Stmt, error) {
	c.pause(query)
	return c.countingConn.PrepareContext(ctx, query)
}

// testSharedRenewBesideWriter: a shared hold is not renewed while an
// exclusive holder is live, which happens only when shared_until fell
// behind a hold (made here by hand), by Renew and RenewBatch alike.
func testSharedRenewBesideWriter(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	b := db.backend(t)
	r := readReq("k", "r", time.Minute, 0)
	mustAcquire(t, b, r)
	db.exec(t, "UPDATE "+sqllock.DefaultTable+" SET shared_until = NULL WHERE name = "+placeholder(db.dialect), "k")
	w := writeReq("k", "w", time.Minute)
	mustAcquire(t, b, w)
	if renew(t, b, "k", r.Token, time.Minute) {
		t.Error("Renew of a shared hold beside a live writer succeeded")
	}
	got := b.RenewBatch(t.Context(), []driver.RenewRequest{
		{Key: "k", Token: w.Token, TTL: time.Minute},
		{Key: "k", Token: r.Token, TTL: time.Minute},
	})
	if got[0].Err != nil || got[1].Err != nil || !got[0].Held || got[1].Held {
		t.Errorf("RenewBatch(writer, reader beside it) = %+v, want the writer's held and the reader's not", got)
	}
	got = b.RenewBatch(t.Context(), []driver.RenewRequest{{Key: "k", Token: r.Token, TTL: time.Minute}})
	if got[0].Err != nil || got[0].Held {
		t.Errorf("RenewBatch(reader beside a writer) = %+v, want not held", got)
	}
}

// testTokenHoldsOnce: a token that has a shared hold already is refused,
// draws no fence, and leaves its hold as it was (memlock and redislock
// agree).
func testTokenHoldsOnce(t *testing.T, newDB newDatabase) {
	b := newDB(t).backend(t)
	for _, limit := range []int{0, 3} {
		r := readReq("k", "r", time.Minute, limit)
		first := mustAcquire(t, b, r)
		again := r
		again.TTL = 2 * time.Minute
		res := acquire(t, b, again)
		if res.Acquired {
			t.Errorf("limit %d: second shared Acquire with the same token granted (fence %d, first %d)", limit, res.Fence, first.Fence)
		} else if res.Holder != "r" || !near(res.HolderTTL, time.Minute, 5*time.Second) || res.Shared != 1 || res.WriterWaiting || res.Queued {
			t.Errorf("limit %d: second shared Acquire with the same token = %+v, want refused naming its own hold", limit, res)
		}
		info, ok := inspect(t, b, "k")
		if !ok || len(info.Shared) != 1 || info.Shared[0].Fence != first.Fence || !near(info.Shared[0].TTL, time.Minute, 5*time.Second) {
			t.Errorf("limit %d: Inspect = %+v, %v; want the first hold unchanged (fence %d)", limit, info, ok, first.Fence)
		}
		other := readReq("k", "o", time.Minute, limit)
		if g := mustAcquire(t, b, other); g.Fence != first.Fence+1 {
			t.Errorf("limit %d: next grant's fence %d, want %d: the refusal drew one", limit, g.Fence, first.Fence+1)
		}
		release(t, b, "k", r.Token)
		release(t, b, "k", other.Token)
	}
}

// testIntentKeptBehindWriter (redislock's testWriterIntentKeptBehindWriter):
// a waiting writer keeps its intent while another writer holds the lock,
// so that readers stay out until it is in.
func testIntentKeptBehindWriter(t *testing.T, newDB newDatabase) {
	b := newDB(t).backend(t)
	r := readReq("rw", "reader", time.Minute, 0)
	mustAcquire(t, b, r)
	// The intent lives 2 s from each request: room for a loaded machine
	// between the requests below, which keep it for twice that.
	w1 := waiting(writeReq("rw", "w1", time.Minute), 2*time.Second)
	if res := refused(t, b, w1); !res.Queued {
		t.Fatalf("no intent: %+v", res)
	}
	release(t, b, "rw", r.Token)
	w2 := writeReq("rw", "w2", time.Minute)
	mustAcquire(t, b, w2) // another writer overtakes
	for i := range 10 {   // 4s: twice the intent's TTL
		time.Sleep(400 * time.Millisecond)
		if res := refused(t, b, w1); !res.Queued || res.Holder != "w2" {
			t.Fatalf("retry %d: the waiting writer lost its intent behind another writer: %+v", i, res)
		}
	}
	// Without Wait nothing is kept or reported.
	try := w1
	try.Wait, try.QueueTTL = false, 0
	if res := refused(t, b, try); res.Queued {
		t.Errorf("a TryLock reports its intent: %+v", res)
	}
	release(t, b, "rw", w2.Token)
	if res := refused(t, b, readReq("rw", "late reader", time.Minute, 0)); !res.WriterWaiting || res.Holder != "w1" {
		t.Fatalf("a new reader was refused, but not for the waiting writer: %+v", res)
	}
	release(t, b, "rw", w1.Token)
}

// testFairIntentKeptBehindWriter: the same for a fair waiter. f1's intent,
// recorded behind a reader, is kept while f0, ahead of it in the queue,
// holds the lock; when f0 leaves, readers stay out for f1.
func testFairIntentKeptBehindWriter(t *testing.T, newDB newDatabase) {
	b := newDB(t).backend(t)
	h := fair(writeReq("f", "h", time.Minute))
	mustAcquire(t, b, h)
	f0 := waiting(fair(writeReq("f", "f0", time.Minute)), 5*time.Second)
	refused(t, b, f0) // queued behind a writer: no intent
	release(t, b, "f", h.Token)
	r := readReq("f", "reader", time.Minute, 0)
	mustAcquire(t, b, r) // readers ignore the queue
	// f1's entry and intent live 2 s from each of its requests: room for a
	// loaded machine between the requests below, which keep them for
	// twice that.
	f1 := waiting(fair(writeReq("f", "f1", time.Minute)), 2*time.Second)
	if res := refused(t, b, f1); !res.Queued || res.Position != 2 {
		t.Fatalf("f1 behind the reader = %+v, want queued second", res)
	}
	if info, _ := inspect(t, b, "f"); !info.WriterWaiting {
		t.Fatalf("f1 recorded no intent: %+v", info)
	}
	release(t, b, "f", r.Token)
	mustAcquire(t, b, f0)
	for i := range 10 { // 4s: twice f1's QueueTTL
		time.Sleep(400 * time.Millisecond)
		if res := refused(t, b, f1); !res.Queued || res.Position != 1 || res.Holder != "f0" {
			t.Fatalf("retry %d: f1 behind f0 = %+v, want queued first", i, res)
		}
	}
	release(t, b, "f", f0.Token)
	if res := refused(t, b, readReq("f", "late reader", time.Minute, 0)); !res.WriterWaiting || res.Holder != "f1" {
		t.Fatalf("a new reader was refused, but not for f1's intent: %+v", res)
	}
	release(t, b, "f", f1.Token)
}

// testReleasePrunes: a release transaction deletes the name's expired
// shared holds and queue entries (and a lapsed intent), whatever the
// releasing token had.
func testReleasePrunes(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	b := db.backend(t)
	gone := readReq("k", "gone", 100*time.Millisecond, 0)
	mustAcquire(t, b, gone)
	r := readReq("k", "r", time.Minute, 0)
	mustAcquire(t, b, r)
	lapsed := waiting(fair(writeReq("k", "lapsed", time.Minute)), 100*time.Millisecond)
	if res := refused(t, b, lapsed); !res.Queued {
		t.Fatalf("fair waiter behind readers = %+v, want queued", res)
	}
	time.Sleep(300 * time.Millisecond) // gone's hold and lapsed's entry and intent expire
	if got := release(t, b, "k", r.Token); !got.Held {
		t.Errorf("Release of a live reader = %+v, want held", got)
	}
	noRows(t, db, "k")
}

// testForceReleasePrunes: ForceRelease keeps the live queue entries and
// deletes the expired ones.
func testForceReleasePrunes(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	b := db.backend(t)
	h := fair(writeReq("k", "h", time.Minute))
	mustAcquire(t, b, h)
	lapsed := waiting(fair(writeReq("k", "lapsed", time.Minute)), 100*time.Millisecond)
	refused(t, b, lapsed)
	live := waiting(fair(writeReq("k", "live", time.Minute)), time.Minute)
	refused(t, b, live)
	time.Sleep(300 * time.Millisecond)
	if _, ok, err := b.ForceRelease(t.Context(), "k"); err != nil || !ok {
		t.Fatalf("ForceRelease = %v, %v", ok, err)
	}
	left := heldRows(t, db, "k")
	if len(left) != 1 || !strings.Contains(left[0], live.Token) {
		t.Errorf("after ForceRelease: %v, want the live waiter's queue entry only", left)
	}
	mustAcquire(t, b, live) // the head of the queue left
	release(t, b, "k", live.Token)
	noRows(t, db, "k")
}

// testSharedReleaseNext (PostgreSQL): Listen's contract. The removal of a
// writer intent and the release of a shared hold are announced with next
// "": readers held back may enter. The head of a fair queue is named when
// it is the one to go next: it left the queue head of a lock without an
// exclusive holder.
func testSharedReleaseNext(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	pb := sqllock.NewPostgres(db.open(t))
	got := make(notes, 16)
	l, err := pb.Listen(t.Context(), got.fn)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Subscribe(t.Context(), "k"); err != nil {
		t.Fatal(err)
	}
	r := readReq("k", "r", time.Minute, 0)
	mustAcquire(t, pb, r)
	f1 := waiting(fair(writeReq("k", "f1", time.Minute)), 5*time.Second)
	f2 := waiting(fair(writeReq("k", "f2", time.Minute)), 5*time.Second)
	f3 := waiting(fair(writeReq("k", "f3", time.Minute)), 5*time.Second)
	for _, f := range []driver.AcquireRequest{f1, f2, f3} {
		refused(t, pb, f)
	}
	if res := refused(t, pb, readReq("k", "r2", time.Minute, 0)); !res.WriterWaiting {
		t.Fatalf("reader not held back by f1's intent: %+v", res)
	}
	release(t, pb, "k", f1.Token) // f1 gives up: its intent goes, readers may enter
	got.want(t, "intent removed (f1 left, head)", "k", "")
	release(t, pb, "k", r.Token)
	got.want(t, "shared hold released before a fair queue", "k", "")
	release(t, pb, "k", f2.Token) // the head leaves a free lock: f3 is next
	got.want(t, "head left a free lock", "k", f3.Token)
	release(t, pb, "k", f3.Token)
	got.want(t, "last waiter left a free lock", "k", "")
	noRows(t, db, "k")
}
