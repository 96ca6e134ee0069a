package sqllock_test

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/sqllock"
)

// events collects a listener's callbacks.
type events chan string

func (e events) fn(key string) {
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
	if _, err := sqllock.NewPostgres(pool).Listen(t.Context(), func(string) {}); err == nil {
		t.Fatal("Listen on a pool that is not pgx's succeeded")
	} else {
		t.Log(err)
	}
	if _, err := sqllock.NewPostgres(nil).Listen(t.Context(), func(string) {}); err == nil {
		t.Fatal("Listen on a nil pool succeeded")
	}
}
