// PostgresBackend, which wakes waiters by LISTEN/NOTIFY: NewPostgres, and the
// listener with its connection, payload encoding and reconnection.

package sqllock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	dldriver "github.com/dlock-go/dlock/driver"
)

var _ dldriver.Notifier = (*PostgresBackend)(nil)

// PostgresBackend is a Backend on PostgreSQL that also wakes waiters by
// LISTEN/NOTIFY: it implements driver.Notifier, which the dlock client finds
// by type assertion. It needs a *sql.DB opened through
// github.com/jackc/pgx/v5/stdlib (sql.Open("pgx", url) or stdlib.OpenDB).
//
// It is a type of its own because a Go value's methods cannot depend on the
// dialect: a Backend for MySQL or SQLite that had a Listen method would make
// the client expect notifications that never come.
type PostgresBackend struct {
	*Backend
}

// NewPostgres returns a Backend on PostgreSQL, as New(db, PostgreSQL,
// opts...) does, with release notifications for waiters.
func NewPostgres(db *sql.DB, opts ...Option) *PostgresBackend {
	b := New(db, PostgreSQL, opts...)
	// Woken by the release that names it, a fair waiter finds the lock
	// free: reading first would only add a statement.
	b.peekFair = false
	return &PostgresBackend{b}
}

// heartbeat is how long the listener waits for a notification before it
// checks that the connection still works (a variable for tests).
var heartbeat = 30 * time.Second

// Times of the notification connection.
const (
	// pingTimeout bounds the heartbeat's check.
	pingTimeout = 5 * time.Second
	// Backoff between attempts to reconnect.
	minReconnectDelay = 25 * time.Millisecond
	maxReconnectDelay = time.Second
	// connWait bounds the wait for a connection from the pool, so that a
	// pool whose every connection is busy makes Listen fail (and the client
	// poll) instead of holding the waiter up.
	connWait = time.Second
)

// listening counts, per pool, the listeners that hold one of its
// connections.
var (
	listeningMu sync.Mutex
	listening   = make(map[*sql.DB]int)
)

// reserveConn counts one more listener on db, unless that would leave its
// statements no connection: a listener keeps its connection for good, and
// with db.SetMaxOpenConns(1) every other statement would then wait forever.
func reserveConn(db *sql.DB) error {
	listeningMu.Lock()
	defer listeningMu.Unlock()
	n := listening[db]
	if limit := db.Stats().MaxOpenConnections; limit > 0 && n+1 >= limit {
		return fmt.Errorf("the pool allows %d open connections (SetMaxOpenConns) and %d listen already: "+
			"a listener keeps one for good and statements need at least one more, so allow at least %d; "+
			"waiters poll meanwhile", limit, n, n+2)
	}
	listening[db] = n + 1
	return nil
}

// unreserveConn undoes reserveConn.
func unreserveConn(db *sql.DB) {
	listeningMu.Lock()
	defer listeningMu.Unlock()
	if listening[db]--; listening[db] <= 0 {
		delete(listening, db)
	}
}

// Listen takes one connection out of the pool for as long as the stream
// lives, runs LISTEN on it before it returns, and starts one goroutine that
// waits for notifications and calls fn with the key of each release that is
// subscribed, and the token of the waiter it names (the head of the lock's
// fair queue), if any. Every release in the database reaches every
// listener; keys nobody here waits on are dropped. When the connection fails, fn("", "") says
// that releases may have been missed; the goroutine reconnects with backoff
// and calls fn("", "") again once it listens anew.
//
// ctx bounds only the call, which waits at most a second for a connection
// from the pool. Listen fails when the database cannot be reached, when db
// is not a pgx pool, when no connection frees up within that second, and
// when the pool could not spare the connection: with SetMaxOpenConns(n),
// at most n-1 listeners per pool, so that statements keep at least one. The
// client then falls back to polling.
//
// LISTEN needs a server session of its own: through pgbouncer in
// transaction pooling mode it lands on whichever server session ran it,
// which then serves other clients, and the notifications never arrive, so
// waiters wake only by polling, at the slower pace the client uses when it
// expects notifications. Connect directly or with session pooling, or use
// New(db, PostgreSQL) behind such a pooler.
func (b *PostgresBackend) Listen(ctx context.Context, fn func(key, next string)) (dldriver.Listener, error) {
	if fn == nil {
		return nil, errors.New("sqllock: listen: nil callback")
	}
	if b.err != nil {
		return nil, fmt.Errorf("sqllock: listen: %w", b.err)
	}
	if err := reserveConn(b.db); err != nil {
		return nil, fmt.Errorf("sqllock: listen: %w", err)
	}
	conn, err := listenConn(ctx, b.db)
	if err != nil {
		unreserveConn(b.db)
		return nil, fmt.Errorf("sqllock: listen: %w", err)
	}
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l := &listener{db: b.db, fn: fn, ctx: lctx, cancel: cancel, subs: make(map[string]int)}
	l.wg.Add(1)
	go l.run(conn)
	return l, nil
}

// listenConn takes a connection from db's pool, waiting at most connWait,
// and runs LISTEN on it.
func listenConn(ctx context.Context, db *sql.DB) (*sql.Conn, error) {
	wctx, cancel := context.WithTimeout(ctx, connWait)
	conn, err := db.Conn(wctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no connection free in the pool within %v: %w", connWait, err)
		}
		return nil, err
	}
	err = conn.Raw(func(dc any) error {
		if pgxConn(dc) == nil {
			return fmt.Errorf("the *sql.DB's driver connection is a %T, not pgx's (github.com/jackc/pgx/v5/stdlib)", dc)
		}
		return nil
	})
	if err == nil {
		_, err = conn.ExecContext(ctx, `LISTEN "`+releaseChannel+`"`)
	}
	if err != nil {
		discard(conn)
		return nil, err
	}
	return conn, nil
}

// pgxConn returns the pgx connection under dc, a driver connection of a
// *sql.DB, or nil. A connection wrapped by instrumentation (statement
// counters, tracing) is unwrapped when the wrapper has an
// Unwrap() driver.Conn method.
func pgxConn(dc any) *stdlib.Conn {
	for range 8 {
		switch c := dc.(type) {
		case *stdlib.Conn:
			return c
		case interface{ Unwrap() driver.Conn }:
			dc = c.Unwrap()
		default:
			return nil
		}
	}
	return nil
}

// discard closes conn without handing it back to the pool, where its
// LISTEN would linger.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}

// listener is the driver.Listener of a PostgresBackend.
type listener struct {
	db     *sql.DB
	fn     func(key, next string)
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // the run goroutine

	mu     sync.Mutex
	subs   map[string]int // key → Subscribe calls not yet undone
	closed bool
	once   sync.Once // gives the listening connection's place back
}

// Subscribe counts one more waiter on key. The connection has listened since
// Listen returned, so a release after Subscribe returns is never missed
// while the connection lasts (and fn("", "") covers a lost one). It fails only
// after Close.
func (l *listener) Subscribe(_ context.Context, key string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("sqllock: subscribe %q: listener closed", key)
	}
	l.subs[key]++
	return nil
}

// Unsubscribe drops one waiter on key. After Close it does nothing.
func (l *listener) Unsubscribe(_ context.Context, key string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.subs[key]--; l.subs[key] <= 0 {
		delete(l.subs, key)
	}
	return nil
}

// Close stops the goroutine, waits for it and closes its connection; fn is
// not called after Close returns. Closing twice is a no-op.
func (l *listener) Close() error {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.cancel()
	l.wg.Wait()
	l.once.Do(func() { unreserveConn(l.db) })
	return nil
}

// run waits for notifications until Close, reconnecting when the connection
// fails.
func (l *listener) run(conn *sql.Conn) {
	defer l.wg.Done()
	for {
		l.receive(conn) // returns when the connection fails or at Close
		discard(conn)
		if l.ctx.Err() != nil {
			return
		}
		l.fn("", "")
		if conn = l.reconnect(); conn == nil {
			return
		}
		l.fn("", "") // a release may have come between the failure and now
	}
}

// receive delivers notifications from conn until it fails or Close.
func (l *listener) receive(conn *sql.Conn) error {
	return conn.Raw(func(dc any) error {
		pc := pgxConn(dc).Conn()
		for {
			ctx, cancel := context.WithTimeout(l.ctx, heartbeat)
			n, err := pc.WaitForNotification(ctx)
			cancel()
			switch {
			case err == nil:
				l.deliver(n.Payload)
				continue
			case l.ctx.Err() != nil:
				return l.ctx.Err()
			case errors.Is(err, context.DeadlineExceeded) && !pc.IsClosed():
				// Quiet for a while: make sure the connection still works.
				ctx, cancel := context.WithTimeout(l.ctx, pingTimeout)
				err = pc.Ping(ctx)
				cancel()
				if err == nil {
					continue
				}
			}
			return err
		}
	})
}

// deliver calls fn with the payload's key and next waiter if someone waits
// on the key.
func (l *listener) deliver(payload string) {
	key, next := decodePayload(payload)
	l.mu.Lock()
	wanted := l.subs[key] > 0 && !l.closed
	l.mu.Unlock()
	if wanted {
		l.fn(key, next)
	}
}

// payloadMark starts a notification payload that carries more than a key.
// Keys from the dlock client never contain control characters, so a plain
// key (what earlier versions sent, and still the payload when no waiter is
// named) never starts with it; a key that does is sent in the long form.
const payloadMark = "\x1f"

// encodePayload is the payload of a notification about key that names the
// next waiter to wake ("" for all): the key itself when next is "" (and the
// key does not start with payloadMark), else payloadMark, the key's length
// in bytes in decimal, ':', the key and next. The length delimits the key
// whatever bytes it holds. pgRelease builds the same in SQL.
func encodePayload(key, next string) string {
	if next == "" && !strings.HasPrefix(key, payloadMark) {
		return key
	}
	return payloadMark + strconv.Itoa(len(key)) + ":" + key + next
}

// decodePayload undoes encodePayload. A payload that is not in the long
// form is a key.
func decodePayload(payload string) (key, next string) {
	rest, ok := strings.CutPrefix(payload, payloadMark)
	if !ok {
		return payload, ""
	}
	n, body, ok := strings.Cut(rest, ":")
	size, err := strconv.Atoi(n)
	if !ok || err != nil || size < 0 || size > len(body) || strconv.Itoa(size) != n {
		return payload, ""
	}
	return body[:size], body[size:]
}

// reconnect takes a new listening connection, retrying with backoff; nil
// means the listener was closed first.
func (l *listener) reconnect() *sql.Conn {
	delay := minReconnectDelay
	timer := time.NewTimer(delay)
	defer timer.Stop()
	for {
		select {
		case <-l.ctx.Done():
			return nil
		case <-timer.C:
		}
		if conn, err := listenConn(l.ctx, l.db); err == nil {
			return conn
		}
		delay = min(2*delay, maxReconnectDelay)
		timer.Reset(delay)
	}
}
