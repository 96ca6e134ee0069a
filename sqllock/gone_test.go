package sqllock_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/dlock-go/dlock"
	dldriver "github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/testserver"
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
	return &holder{match: []byte(match), held: make(chan struct{}), let: make(chan struct{}), ran: make(chan struct{})}
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

// later sends the held bytes once let, and reads the answer.
func (c *holdConn) later() {
	defer close(c.h.ran)
	<-c.h.let
	c.mu.Lock()
	pending := c.pending
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
