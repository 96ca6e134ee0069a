package sqllock_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/dlock-go/dlock"
	dldriver "github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/sqllock"
)

// A statement whose caller gave up may reach the server after the client's
// clean-up: it must grant and queue nothing (see goneTTL). The delay is a
// connection that holds the write of one statement until the test lets it
// through.

// holder holds the next write that contains match, on any connection it
// dialled, until let is called; then it sends the write (and what the
// driver wrote after it, on that connection), waits for the server's
// answer, which says the statement ran, and closes the connection.
type holder struct {
	mu    sync.Mutex
	match []byte
	held  chan struct{} // closed when a write is held
	let   chan struct{} // closed to let it through
	ran   chan struct{} // closed when the server answered it
}

func newHolder(match string) *holder {
	h := &holder{held: make(chan struct{}), let: make(chan struct{}), ran: make(chan struct{})}
	if match != "" {
		h.match = []byte(match)
	}
	return h
}

// arm makes the holder hold the next write that contains match (a holder
// made with "" holds nothing until then).
func (h *holder) arm(match string) {
	h.mu.Lock()
	h.match = []byte(match)
	h.mu.Unlock()
}

func (h *holder) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &holdConn{Conn: c, h: h}, nil
}

// take reports whether p is the write to hold, and disarms the holder.
func (h *holder) take(p []byte) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.match == nil || !bytes.Contains(p, h.match) {
		return false
	}
	h.match = nil
	return true
}

type holdConn struct {
	net.Conn
	h       *holder
	mu      sync.Mutex
	holding bool
	pending []byte
	closed  bool
}

func (c *holdConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.holding {
		c.pending = append(c.pending, p...)
		return len(p), nil
	}
	if !c.h.take(p) {
		return c.Conn.Write(p)
	}
	c.holding = true
	c.pending = append([]byte(nil), p...)
	close(c.h.held)
	go c.later()
	return len(p), nil
}

// later sends the held bytes once let, and reads the answer; when the
// driver still waits for it, the driver reads it and the connection goes
// on as usual.
func (c *holdConn) later() {
	defer close(c.h.ran)
	<-c.h.let
	c.mu.Lock()
	pending := c.pending
	if !c.closed {
		defer c.mu.Unlock()
		c.holding = false
		_, _ = c.Conn.Write(pending)
		return
	}
	c.mu.Unlock()
	if _, err := c.Conn.Write(pending); err == nil {
		_ = c.Conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, _ = c.Conn.Read(make([]byte, 1))
	}
	_ = c.Conn.Close()
}

func (c *holdConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.holding {
		// The driver gave up: unblock its read, and leave the socket to
		// later.
		c.closed = true
		return c.Conn.SetReadDeadline(time.Now())
	}
	return c.Conn.Close()
}

func (c *holdConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	return c.Conn.SetReadDeadline(t)
}

func (c *holdConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	return c.Conn.SetDeadline(t)
}

// lateEngine opens pools on one engine: through a holder, or plain.
type lateEngine struct {
	dialect sqllock.Dialect
	open    func(t *testing.T, h *holder) *sql.DB
}

func mariadbLate(t *testing.T) lateEngine {
	srv := testserver.StartMariaDB(t)
	srv.CreateDatabase(t, "app")
	var n int
	return lateEngine{dialect: sqllock.MySQL, open: func(t *testing.T, h *holder) *sql.DB {
		cfg, _ := mysql.ParseDSN(srv.DSN("app"))
		cfg.InterpolateParams = true // one write per statement, with its text
		if h != nil {
			n++
			cfg.Net = "hold" + string(rune('a'+n))
			mysql.RegisterDialContext(cfg.Net, func(ctx context.Context, addr string) (net.Conn, error) {
				return h.dial(ctx, "tcp", addr)
			})
		}
		db, err := sql.Open("mysql", cfg.FormatDSN())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		return db
	}}
}

func postgresLate(t *testing.T) lateEngine {
	srv := testserver.StartPostgres(t)
	srv.CreateDatabase(t, "app")
	return lateEngine{dialect: sqllock.PostgreSQL, open: func(t *testing.T, h *holder) *sql.DB {
		// The simple protocol sends each statement, with its text, in
		// one write.
		cfg, err := pgx.ParseConfig(srv.URL("app") + "&default_query_exec_mode=simple_protocol")
		if err != nil {
			t.Fatal(err)
		}
		if h != nil {
			cfg.DialFunc = h.dial
		}
		db := stdlib.OpenDB(*cfg)
		t.Cleanup(func() { _ = db.Close() })
		return db
	}}
}

func newLateClient(t *testing.T, e lateEngine, db *sql.DB) *dlock.Client {
	t.Helper()
	var b dldriver.Backend = sqllock.New(db, e.dialect)
	if e.dialect == sqllock.PostgreSQL {
		b = sqllock.NewPostgres(db)
	}
	c := dlock.New(b)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestLateAcquireAfterCleanupGrantsNothing: a TryLock whose statement is
// held until its context ended and its clean-up ran, then let through,
// leaves the lock free.
func TestLateAcquireAfterCleanupGrantsNothing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(t *testing.T) lateEngine
		match string // a part of the plain acquire statement's text
	}{
		{"mariadb", mariadbLate, "intent_owner = IF(intent_token"},
		{"postgres", postgresLate, "SELECT 1, fence, holds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := tc.start(t)
			h := newHolder(tc.match)
			late := newLateClient(t, e, e.open(t, h))
			other := newLateClient(t, e, e.open(t, nil))

			// The name's row exists: its statement is the UPDATE (MySQL).
			first, err := other.Mutex("k").TryLock(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			_ = first.Unlock(t.Context())

			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				l, err := late.Mutex("k", dlock.WithTTL(10*time.Second)).TryLock(ctx)
				if l != nil {
					_ = l.Unlock(context.Background())
				}
				done <- err
			}()
			select {
			case <-h.held:
			case <-time.After(10 * time.Second):
				t.Fatal("the acquire statement was never written")
			}
			if err := <-done; err == nil {
				t.Fatal("TryLock with its statement held: granted")
			}
			close(h.let)
			select {
			case <-h.ran:
			case <-time.After(20 * time.Second):
				t.Fatal("the held statement was never answered")
			}
			l, err := other.Mutex("k", dlock.WithTTL(10*time.Second)).TryLock(t.Context())
			if err != nil {
				t.Fatalf("TryLock after the late statement landed: %v; want the lock free", err)
			}
			_ = l.Unlock(t.Context())
		})
	}
}

// TestLateFairEntryAfterCleanupQueuesNothing: a Fair Lock whose first
// request (a transaction that queues it) has its COMMIT held until its
// wait ended and its clean-up ran, then let through, leaves nothing in the
// queue: the holder's release lets the next comer in.
func TestLateFairEntryAfterCleanupQueuesNothing(t *testing.T) {
	e := postgresLate(t)
	h := newHolder("Q\x00\x00\x00\x0bcommit\x00") // the simple protocol's COMMIT
	late := newLateClient(t, e, e.open(t, h))
	other := newLateClient(t, e, e.open(t, nil))

	held, err := other.Mutex("f", dlock.Fair(), dlock.WithTTL(30*time.Second)).TryLock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		l, err := late.Mutex("f", dlock.Fair(), dlock.WithTTL(30*time.Second), dlock.WithWait(300*time.Millisecond)).Lock(t.Context())
		if l != nil {
			_ = l.Unlock(context.Background())
		}
		done <- err
	}()
	select {
	case <-h.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the fair request's COMMIT was never written")
	}
	if err := <-done; !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("Lock with its COMMIT held: %v, want not obtained", err)
	}
	close(h.let)
	select {
	case <-h.ran:
	case <-time.After(20 * time.Second):
		t.Fatal("the held COMMIT was never answered")
	}
	if err := held.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	// A fair TryLock yields to every live queue entry.
	l, err := other.Mutex("f", dlock.Fair(), dlock.WithTTL(10*time.Second)).TryLock(t.Context())
	if err != nil {
		t.Fatalf("fair TryLock after the release: %v; want the lock free (nobody waits)", err)
	}
	_ = l.Unlock(t.Context())
}

// TestQueuePassesOverEntryOfWaiterThatGaveUp: a fair waiter that gave up
// holds the queue up only until its clean-up has recorded it, however long
// the rest of that clean-up takes. The clean-up (a Release without a fence,
// as the Client sends it) has its transaction held, the record written
// before it through: once the holder releases, a fair TryLock is granted,
// and a live waiter still comes before later comers.
func TestQueuePassesOverEntryOfWaiterThatGaveUp(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(t *testing.T) lateEngine
		begin string // the text of the driver's BEGIN
	}{
		{"mariadb", mariadbLate, "START TRANSACTION"},
		{"postgres", postgresLate, "begin isolation level read committed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := tc.start(t)
			h := newHolder("")
			var letOnce sync.Once
			let := func() { letOnce.Do(func() { close(h.let) }) }
			late := sqllock.New(e.open(t, h), e.dialect)
			t.Cleanup(let) // run first: the pool's Close waits for the held connection
			other := newLateClient(t, e, e.open(t, nil))
			third := newLateClient(t, e, e.open(t, nil))
			ctx := t.Context()
			fair := func(opts ...dlock.Option) []dlock.Option {
				return append([]dlock.Option{dlock.Fair(), dlock.WithTTL(30 * time.Second)}, opts...)
			}

			held, err := other.Mutex("f", fair()...).TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// The waiter's entry lives longer than the test: only its
			// clean-up can take it out of the way.
			res, err := late.Acquire(ctx, dldriver.AcquireRequest{
				Key: "f", Token: "gave-up", Owner: "gave-up", TTL: time.Minute,
				Fair: true, Wait: true, QueueTTL: time.Minute,
			})
			if err != nil || !res.Queued || res.Position != 1 {
				t.Fatalf("fair request behind a holder = %+v, %v; want queued first", res, err)
			}
			h.arm(tc.begin)
			cleaned := make(chan error, 1)
			go func() {
				_, err := late.Release(context.WithoutCancel(ctx), "f", "gave-up")
				cleaned <- err
			}()
			select {
			case <-h.held:
			case err := <-cleaned:
				t.Fatalf("the clean-up ended (%v) without beginning a transaction", err)
			case <-time.After(10 * time.Second):
				t.Fatal("the clean-up's transaction never began")
			}
			if err := held.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			next, err := other.Mutex("f", fair()...).TryLock(ctx)
			if err != nil {
				t.Fatalf("fair TryLock after the release, the entry of a waiter that gave up still queued: %v; want granted", err)
			}

			// A live waiter behind that entry comes first.
			queued := make(chan struct{})
			var once sync.Once
			got := make(chan error, 1)
			checked := make(chan struct{})
			go func() {
				l, err := third.Mutex("f", fair(dlock.WithWait(30*time.Second),
					dlock.WithOnBusy(func(*dlock.NotObtainedError) { once.Do(func() { close(queued) }) }))...).Lock(ctx)
				if err == nil {
					// Held until the TryLock below has tried: queued or
					// holding, this waiter must make it fail.
					<-checked
					err = l.Unlock(context.Background())
				}
				got <- err
			}()
			select {
			case <-queued:
			case err := <-got:
				t.Fatalf("Lock behind a holder: %v before it queued", err)
			}
			if err := next.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			l, err := other.Mutex("f", fair()...).TryLock(ctx)
			close(checked)
			if err == nil {
				_ = l.Unlock(ctx)
				t.Fatal("fair TryLock with a live waiter queued: granted, want refused")
			}
			if err := <-got; err != nil {
				t.Fatalf("the queued waiter: %v, want granted", err)
			}
			let()
			select {
			case err := <-cleaned:
				if err != nil {
					t.Errorf("the clean-up, let through: %v", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("the held clean-up never returned")
			}
		})
	}
}

// TestLateHeadTakeAfterCleanupGrantsNothing: on MySQL a fair request takes
// a free lock with one UPDATE when nobody waits ahead of it: the head of a
// polled queue whose poll finds the lock free (it then deletes its entry),
// and a first request (or a TryLock) on a name this Backend has not queued
// on of late.
// That UPDATE, held until the request's context ended and the waiter's
// clean-up ran, then let through, grants nothing: the clean-up's record
// refuses it, and the lock is free for the next comer.
func TestLateHeadTakeAfterCleanupGrantsNothing(t *testing.T) {
	for _, tc := range []struct {
		name         string
		queued, wait bool
	}{
		{"queue's head", true, true},
		{"first request", false, true},
		{"TryLock", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFreeFairLock(t, tc.queued)
			f.req.Wait = tc.wait
			f.cutOff(t, "LAST_INSERT_ID(fence + 1)") // tplTakeHead's text
			f.cleanUpThenLand(t)
		})
	}
}

// TestLateFirstTakeAfterCleanupGrantsNothingPostgres: on PostgreSQL a fair
// first request (a Lock's first attempt, polled or woken, or a TryLock) on
// a free name nobody waits for is one UPDATE (tplTakeFirst with RETURNING
// fence). That UPDATE, held until the request's context ended and the
// waiter's clean-up ran, then let through, grants nothing: the clean-up's
// record refuses it, and the lock is free for the next comer.
func TestLateFirstTakeAfterCleanupGrantsNothingPostgres(t *testing.T) {
	e := postgresLate(t)
	for _, tc := range []struct {
		name        string
		woken, wait bool
	}{
		{"first request polled", false, true},
		{"first request woken", true, true},
		{"TryLock", false, false},
		{"TryLock woken", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFreeFairLockOn(t, e, tc.woken, false)
			f.req.Token = "late " + tc.name // one database: a token of its own
			f.req.Wait = tc.wait
			f.cutOff(t, "fence = fence + 1, holds = 1") // tplTakeFirst's text on PostgreSQL
			f.cleanUpThenLand(t)
		})
	}
}

// TestCleanupOfHeadTakeWithoutItsDeletionLeavesNoEntry: the head of a
// polled fair queue on MySQL takes a free lock with an UPDATE, then deletes
// its entry. When that deletion is held until the request's context ended,
// the caller's clean-up (a Release without a fence, which finds the hold)
// takes the entry out with the hold: a fair TryLock then finds nobody
// queued.
func TestCleanupOfHeadTakeWithoutItsDeletionLeavesNoEntry(t *testing.T) {
	f := newFreeFairLock(t, true)
	f.cutOff(t, "DELETE FROM `dlock_locks_queue` WHERE name = 'f' AND token = 'late'")
	if _, err := f.late.Release(t.Context(), "f", "late"); err != nil {
		t.Fatal(err)
	}
	// The held deletion has not reached the server: what the clean-up
	// left is all there is.
	f.wantFree(t, "after the clean-up")
	f.let()
}

// answer is what an Acquire that a test runs in a goroutine returned.
type answer struct {
	res dldriver.AcquireResult
	err error
}

// TestFairFirstRequestAfterWaitingForTheRowQueuesBehind: on PostgreSQL a
// fair request's first UPDATE reads the queue in its statement's snapshot.
// One that waited for the name's row while another request's transaction
// queued it behind a holder whose lease then ran out must not take the
// lock past that waiter, whose entry its snapshot does not show: the row
// it locked is not the version its snapshot read ({fresh}), so it goes on
// to the transaction, which queues it second.
func TestFairFirstRequestAfterWaitingForTheRowQueuesBehind(t *testing.T) {
	e := postgresLate(t)
	h := newHolder("")
	var letOnce sync.Once
	let := func() { letOnce.Do(func() { close(h.let) }) }
	queuer := sqllock.New(e.open(t, h), e.dialect)
	t.Cleanup(let) // run first: the pool's Close waits for the held connection
	first := sqllock.NewPostgres(e.open(t, nil))
	admin := e.open(t, nil)
	holder := sqllock.NewPostgres(e.open(t, nil))
	ctx := t.Context()

	const lease = time.Second
	granted := time.Now()
	if res, err := holder.Acquire(ctx, dldriver.AcquireRequest{Key: "f", Token: "holder", Owner: "holder", TTL: lease}); err != nil || !res.Acquired {
		t.Fatalf("the holder's acquire: %+v, %v", res, err)
	}
	req := func(token string) dldriver.AcquireRequest {
		return dldriver.AcquireRequest{Key: "f", Token: token, Owner: token, TTL: time.Minute,
			Fair: true, Wait: true, QueueTTL: time.Minute}
	}

	// The queuer's transaction holds the row, its entry written, its
	// COMMIT held.
	h.arm("Q\x00\x00\x00\x0bcommit\x00") // the simple protocol's COMMIT
	queued := make(chan answer, 1)
	go func() {
		res, err := queuer.Acquire(ctx, req("queuer"))
		queued <- answer{res, err}
	}()
	select {
	case <-h.held:
	case a := <-queued:
		t.Fatalf("the queuer answered %+v, %v before its COMMIT", a.res, a.err)
	case <-time.After(10 * time.Second):
		t.Fatal("the queuer's COMMIT was never written")
	}
	// The holder's lease runs out; then the first request waits for the
	// row (its statement's time, by which it takes the lock as free, is
	// when it starts).
	time.Sleep(time.Until(granted.Add(lease + 200*time.Millisecond)))
	got := make(chan answer, 1)
	go func() {
		res, err := first.Acquire(ctx, req("first"))
		got <- answer{res, err}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := admin.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first request never waited for the row")
		}
		time.Sleep(10 * time.Millisecond)
	}
	let()
	if a := <-queued; a.err != nil || !a.res.Queued || a.res.Position != 1 {
		t.Fatalf("the queuer: %+v, %v; want queued first", a.res, a.err)
	}
	a := <-got
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.res.Acquired || !a.res.Queued || a.res.Position != 2 {
		t.Fatalf("the first request behind the queued waiter: %+v; want queued second", a.res)
	}
}

// freeFairLock is a free fair lock "f" on MariaDB (or the engine given to
// newFreeFairLockOn), and the Backend of a waiter "late" whose writes a
// holder can hold: queued at the head before the lock was freed, or not yet
// asking.
type freeFairLock struct {
	h     *holder
	let   func()
	late  dldriver.Backend
	other *dlock.Client
	req   dldriver.AcquireRequest
}

func newFreeFairLock(t *testing.T, queued bool) *freeFairLock {
	t.Helper()
	return newFreeFairLockOn(t, mariadbLate(t), false, queued)
}

// newFreeFairLockOn is newFreeFairLock on engine e; with woken (PostgreSQL)
// the waiter's Backend is NewPostgres's, else New's (waiters poll).
func newFreeFairLockOn(t *testing.T, e lateEngine, woken, queued bool) *freeFairLock {
	t.Helper()
	f := &freeFairLock{h: newHolder("")}
	var letOnce sync.Once
	f.let = func() { letOnce.Do(func() { close(f.h.let) }) }
	if woken {
		f.late = sqllock.NewPostgres(e.open(t, f.h))
	} else {
		f.late = sqllock.New(e.open(t, f.h), e.dialect)
	}
	t.Cleanup(f.let) // run first: the pool's Close waits for the held connection
	f.other = newLateClient(t, e, e.open(t, nil))
	held, err := f.other.Mutex("f", dlock.Fair(), dlock.WithTTL(30*time.Second)).TryLock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	f.req = dldriver.AcquireRequest{Key: "f", Token: "late", Owner: "late", TTL: time.Minute,
		Fair: true, Wait: true, QueueTTL: time.Minute}
	if queued {
		if res, err := f.late.Acquire(t.Context(), f.req); err != nil || !res.Queued || res.Position != 1 {
			t.Fatalf("fair request behind a holder = %+v, %v; want queued first", res, err)
		}
	}
	if err := held.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	return f
}

// cutOff sends the waiter's request for the free lock with the write that
// contains match held, ends the request's context, and checks that the
// request answers with an error (an unknown outcome).
func (f *freeFairLock) cutOff(t *testing.T, match string) {
	t.Helper()
	f.h.arm(match)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	answered := make(chan error, 1)
	go func() {
		res, err := f.late.Acquire(ctx, f.req)
		if err == nil && res.Acquired {
			err = errors.New("granted")
		}
		answered <- err
	}()
	select {
	case <-f.h.held:
	case err := <-answered:
		t.Fatalf("the request for a free lock ended (%v) without writing %q", err, match)
	case <-time.After(10 * time.Second):
		t.Fatalf("the request never wrote %q", match)
	}
	cancel()
	select {
	case err := <-answered:
		if err == nil {
			t.Fatal("the request with a write held: answered without an error, want an unknown outcome")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the request did not return after its context ended")
	}
}

// cleanUpThenLand sends the clean-up a Client sends after an attempt of
// unknown outcome, then lets the held write land, and checks that the lock
// is free after it.
func (f *freeFairLock) cleanUpThenLand(t *testing.T) {
	t.Helper()
	if _, err := f.late.Release(t.Context(), "f", f.req.Token); err != nil {
		t.Fatal(err)
	}
	f.let()
	select {
	case <-f.h.ran:
	case <-time.After(20 * time.Second):
		t.Fatal("the held write was never answered")
	}
	f.wantFree(t, "after the late write landed")
}

// wantFree checks that a fair TryLock of another Client gets the lock.
func (f *freeFairLock) wantFree(t *testing.T, when string) {
	t.Helper()
	l, err := f.other.Mutex("f", dlock.Fair(), dlock.WithTTL(30*time.Second)).TryLock(t.Context())
	if err != nil {
		t.Fatalf("fair TryLock %s: %v; want the lock free with nobody queued", when, err)
	}
	_ = l.Unlock(t.Context())
}

// TestPruneOfExpiredRecordsSparesOneWrittenAgain: on MySQL a clean-up
// prunes the name's expired records by reading their tokens, then deleting
// them: a record that another clean-up wrote again in between is live, and
// must stay, so that a request of its token still on its way queues
// nothing. The delete is held until the record was written again.
func TestPruneOfExpiredRecordsSparesOneWrittenAgain(t *testing.T) {
	e := mariadbLate(t)
	h := newHolder("")
	var letOnce sync.Once
	let := func() { letOnce.Do(func() { close(h.let) }) }
	lateDB := e.open(t, h)
	late := sqllock.New(lateDB, e.dialect)
	t.Cleanup(let) // run first: the pool's Close waits for the held connection
	db := e.open(t, nil)
	other := sqllock.New(db, e.dialect)
	ctx := t.Context()

	// The lock is held, so that a fair request of "reused" would queue.
	if res, err := other.Acquire(ctx, dldriver.AcquireRequest{Key: "k", Token: "holder", Owner: "holder", TTL: time.Minute}); err != nil || !res.Acquired {
		t.Fatalf("acquire = %+v, %v", res, err)
	}
	// An expired record of "reused", as a clean-up long ago left it.
	if _, err := db.ExecContext(ctx, "INSERT INTO dlock_locks_gone (name, token, grants, expires_at) VALUES ('k', 'reused', 0, UTC_TIMESTAMP(6) - INTERVAL 1 SECOND)"); err != nil {
		t.Fatal(err)
	}

	// A clean-up of another token reads the expired records and is held
	// before it deletes them.
	h.arm("DELETE FROM `dlock_locks_gone`")
	cleaned := make(chan error, 1)
	go func() {
		_, err := late.Release(context.WithoutCancel(ctx), "k", "gave-up")
		cleaned <- err
	}()
	select {
	case <-h.held:
	case err := <-cleaned:
		t.Fatalf("the clean-up ended (%v) without deleting expired records", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the clean-up never deleted expired records")
	}
	// Meanwhile "reused" leaves the queue again: its record is live.
	if err := other.Withdraw(ctx, "k", "reused"); err != nil {
		t.Fatal(err)
	}
	let()
	select {
	case err := <-cleaned:
		if err != nil {
			t.Fatalf("the held clean-up: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the held clean-up never returned")
	}

	res, err := other.Acquire(ctx, dldriver.AcquireRequest{
		Key: "k", Token: "reused", Owner: "reused", TTL: time.Minute,
		Fair: true, Wait: true, QueueTTL: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Queued {
		t.Fatalf("fair request of a token withdrawn just before = %+v; want not queued (its record lives)", res)
	}
}

// TestHeadTakeWhoseDequeueIsLostLeavesNothing: on MySQL the head of a
// polled fair queue takes a free lock with an UPDATE and then deletes its
// entry; until then the entry stays queued, ahead of everyone. A fair Lock
// whose context ends with that DELETE held gives up with an unknown
// outcome, and the Client's clean-up must then leave the lock and the
// queue free at once: the next comer is not held up by the entry. A
// waiter whose process died there instead (no clean-up) holds the next
// comer up no longer than its lease's TTL and its entry's QueueTTL. Either
// way nothing is left.
func TestHeadTakeWhoseDequeueIsLostLeavesNothing(t *testing.T) {
	for _, cleanup := range []bool{true, false} {
		name := "process died"
		if cleanup {
			name = "client gave up"
		}
		t.Run(name, func(t *testing.T) {
			e := mariadbLate(t)
			h := newHolder("")
			var letOnce sync.Once
			let := func() { letOnce.Do(func() { close(h.let) }) }
			latePool := e.open(t, h)
			late := sqllock.New(latePool, e.dialect)
			t.Cleanup(let)
			plain := e.open(t, nil)
			other := newLateClient(t, e, plain)
			ctx := t.Context()
			const ttl = 2 * time.Second
			fair := []dlock.Option{dlock.Fair(), dlock.WithTTL(ttl)}

			held, err := other.Mutex("f", fair...).TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			reqCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			answered := make(chan error, 1)
			if cleanup {
				// A Client's fair Lock, queued behind the holder.
				lateClient := dlock.New(late)
				t.Cleanup(func() { _ = lateClient.Close() })
				go func() {
					l, err := lateClient.Mutex("f", fair...).Lock(reqCtx)
					if err == nil {
						err = fmt.Errorf("granted fence %d", l.Fence())
					}
					answered <- err
				}()
				waitFor(t, plain, "SELECT COUNT(*) FROM dlock_locks_queue WHERE name = 'f'")
			} else {
				req := dldriver.AcquireRequest{Key: "f", Token: "late", Owner: "late", TTL: ttl,
					Fair: true, Wait: true, QueueTTL: ttl}
				if res, err := late.Acquire(ctx, req); err != nil || !res.Queued || res.Position != 1 {
					t.Fatalf("fair request behind a holder = %+v, %v; want queued first", res, err)
				}
				go func() { // polls, as a waiting Client does
					for {
						res, err := late.Acquire(reqCtx, req)
						if err == nil && res.Acquired {
							err = fmt.Errorf("answered %+v", res)
						}
						if err != nil {
							answered <- err
							return
						}
						time.Sleep(20 * time.Millisecond)
					}
				}()
			}
			h.arm("DELETE FROM `dlock_locks_queue` WHERE name") // tplDequeue, after the take
			if err := held.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case <-h.held:
			case err := <-answered:
				t.Fatalf("the head's request ended (%v) without deleting its entry", err)
			case <-time.After(10 * time.Second):
				t.Fatal("the head's DELETE was never written")
			}
			var fence int64
			if err := plain.QueryRowContext(ctx, "SELECT fence FROM dlock_locks WHERE name = 'f' AND token IS NOT NULL").Scan(&fence); err != nil {
				t.Fatalf("holder with the DELETE held: %v; want the head's grant", err)
			}
			cancel()
			select {
			case err := <-answered:
				t.Logf("the head's request: %v", err)
			case <-time.After(10 * time.Second):
				t.Fatal("the request did not return after its context ended")
			}
			start := time.Now()
			if cleanup {
				var lockToken, entry sql.NullString
				if err := plain.QueryRowContext(ctx, `SELECT m.token, q.token FROM dlock_locks m
LEFT JOIN dlock_locks_queue q ON q.name = m.name AND q.expires_at > UTC_TIMESTAMP(6) WHERE m.name = 'f'`).Scan(&lockToken, &entry); err != nil {
					t.Fatal(err)
				}
				if lockToken.Valid || entry.Valid {
					t.Errorf("after the Client gave up: the lock's token %v, a live entry of %v; want neither", lockToken, entry)
				}
			}
			// The next comer: a fair Lock from another client.
			lctx, lcancel := context.WithTimeout(ctx, 10*time.Second)
			defer lcancel()
			l, err := other.Mutex("f", fair...).Lock(lctx)
			if err != nil {
				t.Fatalf("fair Lock after the head's DELETE was lost: %v after %v", err, time.Since(start))
			}
			waited := time.Since(start)
			bound := 500 * time.Millisecond
			if !cleanup {
				bound = ttl + time.Second // the stale lease and entry lapse
			}
			if waited > bound {
				t.Errorf("fair Lock after the head's DELETE was lost waited %v, want at most %v", waited, bound)
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			var n int
			if err := plain.QueryRowContext(ctx, `SELECT
  (SELECT COUNT(*) FROM dlock_locks WHERE token IS NOT NULL AND expires_at > UTC_TIMESTAMP(6)) +
  (SELECT COUNT(*) FROM dlock_locks_queue WHERE expires_at > UTC_TIMESTAMP(6))`).Scan(&n); err != nil || n != 0 {
				t.Errorf("left after the next comer's Unlock: %d live rows (%v), want none", n, err)
			}
		})
	}
}

// waitFor polls query, a count, until it is above 0.
func waitFor(t *testing.T, db *sql.DB, query string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var n int
		if err := db.QueryRowContext(t.Context(), query).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s stayed 0", query)
		}
	}
}

// TestFairTakeWaitingForTheRowSeesCleanupRecord: on MySQL a fair request's
// UPDATE (tplTakeHead, tplTakeFirst) that waits for the name's row, which
// another transaction holds, reads the queue and the clean-up records only
// once it has the row, as the fair transaction does: the token's clean-up
// record, written meanwhile, refuses it, and the record's INSERT does not
// wait for the UPDATE. Under READ COMMITTED too: the docs say the
// isolation level does not matter on MySQL.
func TestFairTakeWaitingForTheRowSeesCleanupRecord(t *testing.T) {
	srv := testserver.StartMariaDB(t)
	srv.CreateDatabase(t, "app")
	for _, iso := range []string{"REPEATABLE-READ", "READ-COMMITTED"} {
		for _, queued := range []bool{false, true} {
			key := "first request"
			if queued {
				key = "queue's head"
			}
			t.Run(iso+"/"+key, func(t *testing.T) {
				cfg, _ := mysql.ParseDSN(srv.DSN("app"))
				cfg.InterpolateParams = true
				cfg.Params = map[string]string{"tx_isolation": "'" + iso + "'"}
				db, err := sql.Open("mysql", cfg.FormatDSN())
				if err != nil {
					t.Fatal(err)
				}
				defer db.Close()
				ctx := t.Context()
				b := sqllock.New(db, sqllock.MySQL)
				fair := func(token string) dldriver.AcquireRequest {
					return dldriver.AcquireRequest{Key: key + iso, Token: token, Owner: token, TTL: time.Minute,
						Fair: true, Wait: true, QueueTTL: time.Minute}
				}
				if res, err := b.Acquire(ctx, fair("h")); err != nil || !res.Acquired {
					t.Fatalf("first fair request on a free name = %+v, %v", res, err)
				}
				late := sqllock.New(db, sqllock.MySQL)
				if queued {
					if res, err := late.Acquire(ctx, fair("late")); err != nil || !res.Queued {
						t.Fatalf("fair request behind a holder = %+v, %v; want queued", res, err)
					}
				}
				if _, err := b.Release(ctx, key+iso, "h"); err != nil {
					t.Fatal(err)
				}
				// Another transaction holds the free name's row.
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				var s string
				if err := tx.QueryRowContext(ctx, "SELECT name FROM dlock_locks WHERE name = ? FOR UPDATE", key+iso).Scan(&s); err != nil {
					t.Fatal(err)
				}
				answered := make(chan answer, 1)
				go func() {
					res, err := late.Acquire(ctx, fair("late"))
					answered <- answer{res, err}
				}()
				waitFor(t, db, `SELECT COUNT(*) FROM information_schema.processlist WHERE info LIKE '%LAST_INSERT_ID(fence + 1)%'`)
				time.Sleep(100 * time.Millisecond)
				// The clean-up's record (tplGone's row), as its first statement writes it.
				rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_, err = db.ExecContext(rctx, `INSERT INTO dlock_locks_gone (name, token, grants, expires_at)
VALUES (?, 'late', 1, UTC_TIMESTAMP(6) + INTERVAL 5 SECOND)`, key+iso)
				cancel()
				if err != nil {
					t.Errorf("the clean-up's record, with the request's UPDATE waiting for the row: %v", err)
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
				select {
				case a := <-answered:
					if a.err == nil && a.res.Acquired {
						t.Errorf("request whose clean-up record was written while its UPDATE waited for the row: granted fence %d, want nothing", a.res.Fence)
					}
				case <-time.After(time.Minute):
					t.Fatal("the request did not return")
				}
			})
		}
	}
}

// TestCleanupDropsFirstTakeThatMissedItsRecordPostgres: on PostgreSQL the
// one-UPDATE take of a fair first request reads the clean-up records in
// its statement's snapshot. When it waits for the name's row behind a
// transaction that only locks it (SELECT ... FOR UPDATE, as a release's
// transaction that finds nothing does), a clean-up of its token can write
// its record meanwhile: the row is the version the snapshot read, so the
// take may grant. The clean-up's transaction, which locks the row after
// it, must then find the grant and drop it: the name ends free.
func TestCleanupDropsFirstTakeThatMissedItsRecordPostgres(t *testing.T) {
	e := postgresLate(t)
	ctx := t.Context()
	late := sqllock.New(e.open(t, nil), e.dialect)
	cleaner := sqllock.New(e.open(t, nil), e.dialect)
	admin := e.open(t, nil)
	other := newLateClient(t, e, e.open(t, nil))

	// The name's row exists, free.
	l, err := other.Mutex("k", dlock.Fair()).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	waiting := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			var got int
			if err := admin.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()").Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d statements wait for a lock, want %d", got, n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	locker, err := admin.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = locker.Rollback() }()
	if _, err := locker.ExecContext(ctx, "SELECT name FROM dlock_locks WHERE name = 'k' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	took := make(chan answer, 1)
	go func() {
		res, err := late.Acquire(ctx, dldriver.AcquireRequest{Key: "k", Token: "late", Owner: "late", TTL: time.Minute, Fair: true})
		took <- answer{res, err}
	}()
	waiting(1) // the take, its snapshot taken
	type released struct {
		res dldriver.ReleaseResult
		err error
	}
	cleaned := make(chan released, 1)
	go func() {
		res, err := cleaner.Release(ctx, "k", "late")
		cleaned <- released{res, err}
	}()
	waiting(2) // the clean-up's transaction, its record written
	var records int
	if err := admin.QueryRowContext(ctx, "SELECT count(*) FROM dlock_locks_gone WHERE name = 'k' AND token = 'late'").Scan(&records); err != nil || records != 1 {
		t.Fatalf("the clean-up's record: %d, %v; want written before its transaction waits", records, err)
	}
	if err := locker.Rollback(); err != nil {
		t.Fatal(err)
	}
	a := <-took
	c := <-cleaned
	t.Logf("the take: %+v, %v; the clean-up: %+v, %v", a.res, a.err, c.res, c.err)
	if a.err != nil || c.err != nil {
		t.Fatal(a.err, c.err)
	}
	if a.res.Acquired && !c.res.Held {
		t.Errorf("the take granted (fence %d) and the clean-up after it found no hold", a.res.Fence)
	}
	l, err = other.Mutex("k", dlock.Fair(), dlock.WithTTL(10*time.Second)).TryLock(ctx)
	if err != nil {
		t.Fatalf("fair TryLock after the clean-up: %v; want the lock free", err)
	}
	_ = l.Unlock(ctx)
}
