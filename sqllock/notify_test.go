package sqllock_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/bench"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/sqllock"
)

// events collects a listener's callbacks.
type events chan string

func (e events) fn(key, _ string) {
	select {
	case e <- key:
	default: // a test that stopped reading
	}
}

// next returns the next callback within 5s.
func (e events) next(t *testing.T) string {
	t.Helper()
	select {
	case key := <-e:
		return key
	case <-time.After(5 * time.Second):
		t.Fatal("no notification within 5s")
		return ""
	}
}

// none checks that no callback comes within d.
func (e events) none(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case key := <-e:
		t.Fatalf("unexpected notification %q", key)
	case <-time.After(d):
	}
}

func testNotify(t *testing.T, newDB newDatabase, srv *testserver.Postgres) {
	db := newDB(t)
	pb := sqllock.NewPostgres(db.open(t))
	other := db.backend(t)
	if _, ok := driver.Backend(other).(driver.Notifier); ok {
		t.Error("New(db, PostgreSQL) is a Notifier; only NewPostgres should be")
	}

	got := make(events, 16)
	l, err := pb.Listen(t.Context(), got.fn)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Subscribe(t.Context(), "k"); err != nil {
		t.Fatal(err)
	}

	// Release of the last hold notifies; a release that leaves a hold, or a
	// key nobody here waits on, does not reach fn.
	tok := newToken()
	req := driver.AcquireRequest{Key: "k", Token: tok, Owner: "o", TTL: time.Minute, Reentrant: true}
	mustAcquire(t, other, req)
	mustAcquire(t, other, req)
	release(t, other, "k", tok)
	mustAcquire(t, other, driver.AcquireRequest{Key: "unwatched", Token: tok, Owner: "o", TTL: time.Minute})
	release(t, other, "unwatched", tok)
	got.none(t, 200*time.Millisecond)
	release(t, other, "k", tok)
	if key := got.next(t); key != "k" {
		t.Fatalf("notification %q, want k", key)
	}

	// ForceRelease notifies too.
	mustAcquire(t, other, driver.AcquireRequest{Key: "k", Token: newToken(), Owner: "o", TTL: time.Minute})
	if _, ok, err := other.ForceRelease(t.Context(), "k"); err != nil || !ok {
		t.Fatalf("ForceRelease = %v, %v", ok, err)
	}
	if key := got.next(t); key != "k" {
		t.Fatalf("notification %q, want k", key)
	}

	// Unsubscribed: silence.
	if err := l.Unsubscribe(t.Context(), "k"); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, other, driver.AcquireRequest{Key: "k", Token: tok, Owner: "o", TTL: time.Minute})
	release(t, other, "k", tok)
	got.none(t, 200*time.Millisecond)

	// The server goes away: fn("") at once, and again once the listener is
	// back, after which releases arrive again.
	if err := l.Subscribe(t.Context(), "k"); err != nil {
		t.Fatal(err)
	}
	srv.Stop(t)
	if key := got.next(t); key != "" {
		t.Fatalf("after the server stopped: notification %q, want \"\"", key)
	}
	srv.Start(t)
	if key := got.next(t); key != "" {
		t.Fatalf("after the server came back: notification %q, want \"\"", key)
	}
	other = db.backend(t) // the old pool's idle connections died with the server
	mustAcquire(t, other, driver.AcquireRequest{Key: "k", Token: tok, Owner: "o", TTL: time.Minute})
	release(t, other, "k", tok)
	if key := got.next(t); key != "k" {
		t.Fatalf("after the reconnect: notification %q, want k", key)
	}

	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Subscribe(t.Context(), "k"); err == nil {
		t.Error("Subscribe after Close succeeded")
	}
}

// testListenHeartbeat lets a listener sit quiet through several heartbeats:
// each check must find the connection alive (no fn("")), and notifications
// must still arrive afterwards.
func testListenHeartbeat(t *testing.T, newDB newDatabase) {
	defer sqllock.SetHeartbeat(50 * time.Millisecond)()
	db := newDB(t)
	got := make(events, 16)
	l, err := sqllock.NewPostgres(db.open(t)).Listen(t.Context(), got.fn)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Subscribe(t.Context(), "k"); err != nil {
		t.Fatal(err)
	}
	got.none(t, 300*time.Millisecond)
	b, tok := db.backend(t), newToken()
	mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: tok, Owner: "o", TTL: time.Minute})
	release(t, b, "k", tok)
	if key := got.next(t); key != "k" {
		t.Fatalf("notification %q, want k", key)
	}
}

// testListenThroughWrapper: a pool whose connections instrumentation wraps
// (here dlock bench's statement counter) still listens, when the wrapper
// can be unwrapped to pgx's connection.
func testListenThroughWrapper(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	var counter bench.StatementCounter
	pool, err := counter.OpenCounted(db.driverName, db.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	got := make(events, 16)
	l, err := sqllock.NewPostgres(pool).Listen(t.Context(), got.fn)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Subscribe(t.Context(), "k"); err != nil {
		t.Fatal(err)
	}
	b, tok := db.backend(t), newToken()
	mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: tok, Owner: "o", TTL: time.Minute})
	release(t, b, "k", tok)
	if key := got.next(t); key != "k" {
		t.Fatalf("notification %q, want k", key)
	}
}

func testListenNeedsPgx(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	pool, _ := db.counting(t) // its connections are not pgx's
	if _, err := sqllock.NewPostgres(pool).Listen(t.Context(), func(string, string) {}); err == nil {
		t.Fatal("Listen on a pool that is not pgx's succeeded")
	} else {
		t.Log(err)
	}
	if _, err := sqllock.NewPostgres(nil).Listen(t.Context(), func(string, string) {}); err == nil {
		t.Fatal("Listen on a nil pool succeeded")
	}
}

// TestListenNeedsSpareConnection checks, without a server, that Listen
// refuses a pool that cannot spare a connection before it takes one, and
// that a failed Listen gives its place back.
func TestListenNeedsSpareConnection(t *testing.T) {
	db, err := sql.Open("sqlite", sqliteDSN(filepath.Join(t.TempDir(), "locks.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	pb := sqllock.NewPostgres(db)

	db.SetMaxOpenConns(1)
	_, err = pb.Listen(t.Context(), func(string, string) {})
	if err == nil || !strings.Contains(err.Error(), "SetMaxOpenConns") {
		t.Fatalf("Listen on a pool of one connection: %v, want a refusal that names SetMaxOpenConns", err)
	}
	t.Log(err)

	// Two connections: room for one listener. This pool is not pgx's, so
	// Listen fails later, every time, without keeping its place.
	db.SetMaxOpenConns(2)
	for range 3 {
		_, err = pb.Listen(t.Context(), func(string, string) {})
		if err == nil || !strings.Contains(err.Error(), "not pgx's") {
			t.Fatalf("Listen on a pool of two sqlite connections: %v, want a complaint about the driver", err)
		}
	}
}

// testListenSmallPool checks that listening never takes the last connection
// of a pool, and that a pool with none free makes Listen fail soon.
func testListenSmallPool(t *testing.T, newDB newDatabase) {
	db := newDB(t)

	t.Run("OneConnection", func(t *testing.T) {
		// A waiter's Listen must not take the only connection: the holder's
		// Unlock and the waiter's next attempts need it.
		pool := db.open(t)
		pool.SetMaxOpenConns(1)
		c := dlock.New(sqllock.NewPostgres(pool))
		defer c.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		m := c.Mutex("small-pool", dlock.WithRetry(dlock.ExponentialBackoff(5*time.Millisecond, 50*time.Millisecond)))
		held, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			l, err := m.Lock(ctx)
			if err == nil {
				err = l.Unlock(ctx)
			}
			got <- err
		}()
		time.Sleep(300 * time.Millisecond) // the waiter tries, and tries to listen
		uctx, ucancel := context.WithTimeout(ctx, 3*time.Second)
		defer ucancel()
		if err := held.Unlock(uctx); err != nil {
			t.Fatalf("the holder's Unlock: %v", err)
		}
		if err := <-got; err != nil {
			t.Fatalf("the waiter: %v", err)
		}
	})

	t.Run("ListenersLeaveOne", func(t *testing.T) {
		pool := db.open(t)
		pool.SetMaxOpenConns(2)
		pb := sqllock.NewPostgres(pool)
		l1, err := pb.Listen(t.Context(), func(string, string) {})
		if err != nil {
			t.Fatal(err)
		}
		if l2, err := sqllock.NewPostgres(pool).Listen(t.Context(), func(string, string) {}); err == nil {
			l2.Close()
			l1.Close()
			t.Fatal("a second listener on a pool of two connections")
		}
		mustAcquire(t, sqllock.New(pool, sqllock.PostgreSQL), driver.AcquireRequest{Key: "k", Token: newToken(), Owner: "o", TTL: time.Minute})
		if err := l1.Close(); err != nil {
			t.Fatal(err)
		}
		l3, err := pb.Listen(t.Context(), func(string, string) {})
		if err != nil {
			t.Fatalf("Listen after the listener closed: %v", err)
		}
		l3.Close()
	})

	t.Run("NoneFree", func(t *testing.T) {
		pool := db.open(t)
		pool.SetMaxOpenConns(2)
		for range 2 {
			conn, err := pool.Conn(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
		}
		start := time.Now()
		l, err := sqllock.NewPostgres(pool).Listen(t.Context(), func(string, string) {})
		if err == nil {
			l.Close()
			t.Fatal("Listen on a pool whose connections are all in use succeeded")
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("Listen failed after %v, want about 1s", d)
		}
		t.Log(err)
	})
}

// TestPayload checks that a notification's payload gives back its key and
// next waiter whatever bytes they hold, and that a plain key (what earlier
// versions sent) reads as itself.
func TestPayload(t *testing.T) {
	keys := []string{"k", "orders:42", "", "\x1f", "\x1f3:abc", "3:abc", "a\x1fb", "é:ü", strings.Repeat("x", sqllock.MaxKeyLength)}
	nexts := []string{"", "tok", "\x1f", "12:x", strings.Repeat("t", sqllock.MaxTokenLength)}
	for _, key := range keys {
		for _, next := range nexts {
			p := sqllock.EncodePayload(key, next)
			if k, n := sqllock.DecodePayload(p); k != key || n != next {
				t.Errorf("DecodePayload(EncodePayload(%q, %q)) = %q, %q", key, next, k, n)
			}
		}
	}
	if p := sqllock.EncodePayload("orders:42", ""); p != "orders:42" {
		t.Errorf("payload of a release without a named waiter = %q, want the key", p)
	}
	for _, p := range []string{"plain", "\x1fx:y", "\x1f99:short", "\x1f-1:k", "\x1f01:k"} {
		if k, n := sqllock.DecodePayload(p); k != p || n != "" {
			t.Errorf("DecodePayload(%q) = %q, %q; want the payload as a key", p, k, n)
		}
	}
}

// note is one listener callback.
type note struct{ key, next string }

// notes collects a listener's callbacks with their next waiter.
type notes chan note

func (c notes) fn(key, next string) {
	select {
	case c <- note{key, next}:
	default:
	}
}

func (c notes) want(t *testing.T, what string, key, next string) {
	t.Helper()
	select {
	case n := <-c:
		if n.key != key || n.next != next {
			t.Errorf("%s: notification (%q, next %q), want (%q, next %q)", what, n.key, n.next, key, next)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: no notification within 5s", what)
	}
}

func (c notes) none(t *testing.T, what string, d time.Duration) {
	t.Helper()
	select {
	case n := <-c:
		t.Errorf("%s: unexpected notification %+v", what, n)
	case <-time.After(d):
	}
}

// testNotifyNext checks the notifications of shared holds, intents and fair
// queues: a release names the head of the fair queue when it frees the
// exclusive lock, or when the head leaves a lock without an exclusive
// holder; a shared hold's release and an intent's removal announce "", as
// do the others; a key with any bytes arrives whole.
func testNotifyNext(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	b := db.backend(t)
	got := make(notes, 16)
	l, err := sqllock.NewPostgres(db.open(t)).Listen(t.Context(), got.fn)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const key = "k\x1f3:x"
	if err := l.Subscribe(t.Context(), key); err != nil {
		t.Fatal(err)
	}

	// A reader's release, no queue: next "".
	r := readReq(key, "r", time.Minute, 0)
	mustAcquire(t, b, r)
	release(t, b, key, r.Token)
	got.want(t, "reader released", key, "")

	// A fair holder, two waiters: the release names the head.
	h := fair(writeReq(key, "h", time.Minute))
	mustAcquire(t, b, h)
	a := waiting(fair(writeReq(key, "a", time.Minute)), 5*time.Second)
	c := waiting(fair(writeReq(key, "c", time.Minute)), 5*time.Second)
	refused(t, b, a)
	refused(t, b, c)
	got.none(t, "waiters queued", 100*time.Millisecond)
	release(t, b, key, h.Token)
	got.want(t, "fair holder released", key, a.Token)
	// The head leaves while the lock is free: the next one is named.
	release(t, b, key, a.Token)
	got.want(t, "head left the queue", key, c.Token)
	// A waiter behind the head leaves: nobody to wake.
	d := waiting(fair(writeReq(key, "d", time.Minute)), 5*time.Second)
	refused(t, b, d)
	release(t, b, key, d.Token)
	got.none(t, "a waiter behind the head left", 100*time.Millisecond)

	// c, the last waiter, is granted; its release leaves no queue: next "".
	mustAcquire(t, b, c)
	release(t, b, key, c.Token)
	got.want(t, "last fair holder released", key, "")

	// A reader and a fair writer queued behind it: the reader's release
	// names nobody (Listen's contract: other readers may wait too).
	mustAcquire(t, b, r)
	w := waiting(fair(writeReq(key, "w", time.Minute)), 5*time.Second)
	refused(t, b, w)
	release(t, b, key, r.Token)
	got.want(t, "reader released before a queued writer", key, "")
	mustAcquire(t, b, w)
	release(t, b, key, w.Token)
	got.want(t, "writer released", key, "")

	// A writer's intent removed: next "".
	mustAcquire(t, b, r)
	wi := waiting(writeReq(key, "wi", time.Minute), 5*time.Second)
	if res := refused(t, b, wi); !res.Queued {
		t.Fatalf("writer beside a reader = %+v, want an intent", res)
	}
	release(t, b, key, wi.Token)
	got.want(t, "intent removed", key, "")

	// ForceRelease: next "".
	if _, ok, err := b.ForceRelease(t.Context(), key); err != nil || !ok {
		t.Fatalf("ForceRelease = %v, %v", ok, err)
	}
	got.want(t, "ForceRelease", key, "")
	noRows(t, db, key)
}
