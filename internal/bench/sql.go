package bench

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// SQLRTT returns the percentiles of n "SELECT 1" queries, one after the
// other: the round trip floor of every lock on that database.
func SQLRTT(ctx context.Context, db *sql.DB, n int) (Percentiles, error) {
	return timeCalls(n, "SELECT 1", func() error {
		var one int
		return db.QueryRowContext(ctx, "SELECT 1").Scan(&one)
	})
}

// rawTable is the table of the raw SQL baseline.
const rawTable = "dlock_bench_raw"

// RawSQL is the floor a SQL lock is measured against: one INSERT that does
// nothing when the name is taken, retried at once while it is (a busy spin),
// and one DELETE of the name and token to release. dialect is "mysql",
// "postgres" or "sqlite". It has no expiry, no fencing and no waking; it is
// a baseline, not a lock to use.
func RawSQL(name, dialect string, newDB func() (*sql.DB, error)) (Subject, error) {
	var insert, del string
	switch dialect {
	case "mysql":
		insert = "INSERT IGNORE INTO " + rawTable + " (name, token) VALUES (?, ?)"
		del = "DELETE FROM " + rawTable + " WHERE name = ? AND token = ?"
	case "postgres":
		insert = "INSERT INTO " + rawTable + " (name, token) VALUES ($1, $2) ON CONFLICT DO NOTHING"
		del = "DELETE FROM " + rawTable + " WHERE name = $1 AND token = $2"
	case "sqlite":
		insert = "INSERT OR IGNORE INTO " + rawTable + " (name, token) VALUES (?, ?)"
		del = "DELETE FROM " + rawTable + " WHERE name = ? AND token = ?"
	default:
		return Subject{}, fmt.Errorf("bench: raw SQL baseline: unknown dialect %q", dialect)
	}
	var once sync.Once
	var createErr error
	return Subject{
		Name: name,
		NewWorker: func(ctx context.Context, id int) (Worker, error) {
			db, err := newDB()
			if err != nil {
				return nil, err
			}
			once.Do(func() {
				_, createErr = db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+rawTable+
					" (name VARCHAR(255) NOT NULL PRIMARY KEY, token VARCHAR(64) NOT NULL)")
			})
			if createErr != nil {
				_ = db.Close()
				return nil, fmt.Errorf("bench: create %s: %w", rawTable, createErr)
			}
			return &rawSQLWorker{db: db, insert: insert, del: del, token: fmt.Sprintf("raw-%d-%d", id, time.Now().UnixNano())}, nil
		},
	}, nil
}

type rawSQLWorker struct {
	db          *sql.DB
	insert, del string
	token       string
}

type rawSQLHeld struct {
	w    *rawSQLWorker
	name string
}

func (w *rawSQLWorker) Lock(ctx context.Context, name string) (Held, error) {
	for {
		r, err := w.db.ExecContext(ctx, w.insert, name, w.token)
		if err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			// Under a spinning crowd, SQLite's "database is locked" and
			// InnoDB's deadlock on the unique index are contention, not
			// failure: spin on.
			if contention(err) {
				continue
			}
			return nil, err
		}
		if n, err := r.RowsAffected(); err != nil {
			return nil, err
		} else if n == 1 {
			return rawSQLHeld{w, name}, nil
		}
	}
}

func (h rawSQLHeld) Unlock(ctx context.Context) error {
	for {
		r, err := h.w.db.ExecContext(ctx, h.w.del, h.name, h.w.token)
		if err != nil {
			if ctx.Err() == nil && contention(err) {
				continue
			}
			return err
		}
		if n, err := r.RowsAffected(); err != nil {
			return err
		} else if n != 1 {
			return fmt.Errorf("raw release of %q: not held", h.name)
		}
		return nil
	}
}

func (w *rawSQLWorker) Close() error { return w.db.Close() }

// contention reports whether err is a statement the store refused only
// because others were at the same rows: SQLite's busy and locked, MySQL's
// deadlock (1213) and lock wait timeout (1205), PostgreSQL's serialization
// failure and deadlock (40001, 40P01).
func contention(err error) bool {
	msg := err.Error()
	for _, s := range []string{"database is locked", "SQLITE_BUSY", "busy", "Error 1213", "Error 1205", "40001", "40P01"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// StatementCounter counts the statements database handles send, by their
// first word (SELECT, INSERT, ...), plus BEGIN, COMMIT, ROLLBACK and
// PREPARE. It counts on the client, so other clients of the database do not
// disturb it. Use OpenCounted or Connector to make the handles.
type StatementCounter struct {
	mu sync.Mutex
	m  map[string]uint64
}

// Count implements Counter.
func (c *StatementCounter) Count(context.Context) (map[string]uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]uint64, len(c.m))
	for k, v := range c.m {
		out[k] = v
	}
	return out, nil
}

func (c *StatementCounter) add(kind string) {
	c.mu.Lock()
	if c.m == nil {
		c.m = map[string]uint64{}
	}
	c.m[kind]++
	c.mu.Unlock()
}

func (c *StatementCounter) addQuery(query string) {
	q := strings.TrimLeft(query, " \t\r\n(")
	word, _, _ := strings.Cut(q, " ")
	word, _, _ = strings.Cut(word, "\n")
	c.add(strings.ToUpper(word))
}

// OpenCounted opens a database handle like sql.Open whose statements c
// counts.
func (c *StatementCounter) OpenCounted(driverName, dsn string) (*sql.DB, error) {
	db, err := sql.Open(driverName, dsn)
	if err != nil {
		return nil, err
	}
	drv := db.Driver()
	_ = db.Close()
	var conn driver.Connector
	if dc, ok := drv.(driver.DriverContext); ok {
		if conn, err = dc.OpenConnector(dsn); err != nil {
			return nil, err
		}
	} else {
		conn = dsnConnector{dsn, drv}
	}
	return sql.OpenDB(c.Connector(conn)), nil
}

// Connector wraps inner so that c counts the statements of its connections.
func (c *StatementCounter) Connector(inner driver.Connector) driver.Connector {
	return countingConnector{inner, c}
}

type dsnConnector struct {
	dsn string
	drv driver.Driver
}

func (d dsnConnector) Connect(context.Context) (driver.Conn, error) { return d.drv.Open(d.dsn) }
func (d dsnConnector) Driver() driver.Driver                        { return d.drv }

type countingConnector struct {
	inner driver.Connector
	c     *StatementCounter
}

func (cc countingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := cc.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &countingConn{conn, cc.c}, nil
}

func (cc countingConnector) Driver() driver.Driver { return cc.inner.Driver() }

// countingConn forwards every optional interface of the driver's connection
// that database/sql looks for, so that wrapping changes nothing but counts.
type countingConn struct {
	inner driver.Conn
	c     *StatementCounter
}

func (cn *countingConn) Prepare(query string) (driver.Stmt, error) {
	return cn.PrepareContext(context.Background(), query)
}

func (cn *countingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	cn.c.add("PREPARE")
	var st driver.Stmt
	var err error
	if p, ok := cn.inner.(driver.ConnPrepareContext); ok {
		st, err = p.PrepareContext(ctx, query)
	} else {
		st, err = cn.inner.Prepare(query)
	}
	if err != nil {
		return nil, err
	}
	return &countingStmt{st, query, cn.c}, nil
}

func (cn *countingConn) Close() error { return cn.inner.Close() }

// Unwrap returns the driver's own connection, for code that needs it (the
// PostgreSQL notification listener of sqllock waits on pgx's connection).
func (cn *countingConn) Unwrap() driver.Conn { return cn.inner }

func (cn *countingConn) Begin() (driver.Tx, error) {
	return cn.BeginTx(context.Background(), driver.TxOptions{})
}

func (cn *countingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	cn.c.add("BEGIN")
	var tx driver.Tx
	var err error
	if b, ok := cn.inner.(driver.ConnBeginTx); ok {
		tx, err = b.BeginTx(ctx, opts)
	} else {
		//lint:ignore SA1019 the driver has nothing newer
		tx, err = cn.inner.Begin()
	}
	if err != nil {
		return nil, err
	}
	return countingTx{tx, cn.c}, nil
}

func (cn *countingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	e, ok := cn.inner.(driver.ExecerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	r, err := e.ExecContext(ctx, query, args)
	if !errors.Is(err, driver.ErrSkip) {
		cn.c.addQuery(query)
	}
	return r, err
}

func (cn *countingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	q, ok := cn.inner.(driver.QueryerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	r, err := q.QueryContext(ctx, query, args)
	if !errors.Is(err, driver.ErrSkip) {
		cn.c.addQuery(query)
	}
	return r, err
}

func (cn *countingConn) Ping(ctx context.Context) error {
	if p, ok := cn.inner.(driver.Pinger); ok {
		cn.c.add("PING")
		return p.Ping(ctx)
	}
	return nil
}

func (cn *countingConn) ResetSession(ctx context.Context) error {
	if r, ok := cn.inner.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (cn *countingConn) IsValid() bool {
	if v, ok := cn.inner.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

func (cn *countingConn) CheckNamedValue(nv *driver.NamedValue) error {
	if c, ok := cn.inner.(driver.NamedValueChecker); ok {
		return c.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

type countingTx struct {
	inner driver.Tx
	c     *StatementCounter
}

func (t countingTx) Commit() error   { t.c.add("COMMIT"); return t.inner.Commit() }
func (t countingTx) Rollback() error { t.c.add("ROLLBACK"); return t.inner.Rollback() }

type countingStmt struct {
	inner driver.Stmt
	query string
	c     *StatementCounter
}

func (s *countingStmt) Close() error  { return s.inner.Close() }
func (s *countingStmt) NumInput() int { return s.inner.NumInput() }

func (s *countingStmt) Exec(args []driver.Value) (driver.Result, error) {
	return s.ExecContext(context.Background(), named(args))
}

func (s *countingStmt) Query(args []driver.Value) (driver.Rows, error) {
	return s.QueryContext(context.Background(), named(args))
}

func (s *countingStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	s.c.addQuery(s.query)
	if e, ok := s.inner.(driver.StmtExecContext); ok {
		return e.ExecContext(ctx, args)
	}
	v, err := values(args)
	if err != nil {
		return nil, err
	}
	//lint:ignore SA1019 the driver has nothing newer
	return s.inner.Exec(v)
}

func (s *countingStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	s.c.addQuery(s.query)
	if q, ok := s.inner.(driver.StmtQueryContext); ok {
		return q.QueryContext(ctx, args)
	}
	v, err := values(args)
	if err != nil {
		return nil, err
	}
	//lint:ignore SA1019 the driver has nothing newer
	return s.inner.Query(v)
}

func (s *countingStmt) CheckNamedValue(nv *driver.NamedValue) error {
	if c, ok := s.inner.(driver.NamedValueChecker); ok {
		return c.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

func values(named []driver.NamedValue) ([]driver.Value, error) {
	v := make([]driver.Value, len(named))
	for i, nv := range named {
		if nv.Name != "" {
			return nil, fmt.Errorf("bench: the driver does not support named parameters")
		}
		v[i] = nv.Value
	}
	return v, nil
}

func named(v []driver.Value) []driver.NamedValue {
	n := make([]driver.NamedValue, len(v))
	for i, x := range v {
		n[i] = driver.NamedValue{Ordinal: i + 1, Value: x}
	}
	return n
}
