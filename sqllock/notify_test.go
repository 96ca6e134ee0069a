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
	"github.com/dlock-go/dlock/internal/testserver"
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
