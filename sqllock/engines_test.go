package sqllock_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	dldriver "github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/sqllock"
)

// database is one empty database on one engine, for one test.
type database struct {
	dialect    sqllock.Dialect
	driverName string
	dsn        string
	// down makes the database stop answering until the test ends.
	down func(t *testing.T)
	// prepare, when set, readies each pool that clientBackend opens.
	prepare func(t testing.TB, db *sql.DB)

	mu    sync.Mutex
	pools []*sql.DB // every pool opened, for SQLite's down
}

// newDatabase makes a fresh database for one test.
type newDatabase func(t *testing.T) *database

// open returns a new pool on the database, closed when the test ends.
func (d *database) open(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open(d.driverName, d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	d.track(t, db)
	return db
}

func (d *database) track(t testing.TB, db *sql.DB) {
	d.mu.Lock()
	d.pools = append(d.pools, db)
	d.mu.Unlock()
	t.Cleanup(func() { _ = db.Close() })
}

// backend returns a Backend on a new pool.
func (d *database) backend(t testing.TB, opts ...sqllock.Option) *sqllock.Backend {
	t.Helper()
	return sqllock.New(d.open(t), d.dialect, opts...)
}

// clientBackend returns what an application would hand to dlock.New: on
// PostgreSQL the Backend with LISTEN/NOTIFY, on SQLite the one with wake-ups
// between processes.
func (d *database) clientBackend(t testing.TB) dldriver.Backend {
	t.Helper()
	db := d.open(t)
	if d.prepare != nil {
		d.prepare(t, db)
	}
	switch d.dialect {
	case sqllock.PostgreSQL:
		return sqllock.NewPostgres(db)
	case sqllock.SQLite:
		return sqllock.NewSQLite(db)
	}
	return sqllock.New(db, d.dialect)
}

// exec runs a statement on a pool of its own and returns the rows affected.
func (d *database) exec(t testing.TB, query string, args ...any) int64 {
	t.Helper()
	res, err := d.admin(t).ExecContext(context.Background(), query, args...)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// admin returns a new pool for looking behind the backends' backs.
func (d *database) admin(t testing.TB) *sql.DB {
	t.Helper()
	return d.open(t)
}

// counting returns a pool on the database that counts the statements it
// runs, and the counter.
func (d *database) counting(t testing.TB) (*sql.DB, *atomic.Int64) {
	t.Helper()
	probe, err := sql.Open(d.driverName, d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	drv := probe.Driver()
	_ = probe.Close()
	n := new(atomic.Int64)
	db := sql.OpenDB(&countingConnector{drv: drv, dsn: d.dsn, n: n})
	d.track(t, db)
	return db, n
}

// sqliteDSN is the package documentation's recipe for a lock file. The
// Backend switches the file to WAL itself.
func sqliteDSN(path string) string {
	return "file:" + path + "?_pragma=busy_timeout(5000)&_pragma=synchronous(NORMAL)"
}

// sqliteWALDSN is the recipe of earlier versions, which set the journal
// mode on every new connection: still supported.
func sqliteWALDSN(path string) string {
	return "file:" + path + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)"
}

// sqliteDatabases makes each database a new file in the test's temporary
// directory, opened as the package documentation recommends. Taking it down
// closes every pool opened on it.
func sqliteDatabases(t *testing.T) *database {
	path := filepath.Join(t.TempDir(), "locks.db")
	d := &database{
		dialect:    sqllock.SQLite,
		driverName: "sqlite",
		dsn:        sqliteDSN(path),
		prepare:    func(_ testing.TB, db *sql.DB) { db.SetMaxOpenConns(1) },
	}
	d.down = func(t *testing.T) {
		d.mu.Lock()
		defer d.mu.Unlock()
		for _, db := range d.pools {
			_ = db.Close()
		}
	}
	return d
}

// mariadbDatabases returns a maker of fresh databases on srv. Taking one
// down stops the server until the test ends.
func mariadbDatabases(srv *testserver.MariaDB) newDatabase {
	var n atomic.Int64
	return func(t *testing.T) *database {
		name := fmt.Sprintf("t%d", n.Add(1))
		srv.CreateDatabase(t, name)
		return &database{
			dialect:    sqllock.MySQL,
			driverName: "mysql",
			dsn:        srv.DSN(name),
			down: func(t *testing.T) {
				srv.Stop(t)
				t.Cleanup(func() { srv.Start(t) })
			},
			prepare: openAllConns,
		}
	}
}

// poolSize is the size of the pools that openAllConns fills.
const poolSize = 6

// openAllConns opens every connection a pool may have, up front. The MySQL
// driver runs a goroutine per open connection, and locktest's
// CloseStopsEverything counts every goroutine that appears after it made
// its backend as the client's own: a pool that grew during the case would
// look like a leak.
func openAllConns(t testing.TB, db *sql.DB) {
	t.Helper()
	db.SetMaxOpenConns(poolSize)
	db.SetMaxIdleConns(poolSize)
	conns := make([]*sql.Conn, poolSize)
	for i := range conns {
		c, err := db.Conn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	for _, c := range conns {
		_ = c.Close()
	}
}

// postgresDatabases returns a maker of fresh databases on srv. Taking one
// down stops the server until the test ends.
func postgresDatabases(srv *testserver.Postgres) newDatabase {
	var n atomic.Int64
	return func(t *testing.T) *database {
		name := fmt.Sprintf("t%d", n.Add(1))
		srv.CreateDatabase(t, name)
		return &database{
			dialect:    sqllock.PostgreSQL,
			driverName: "pgx",
			dsn:        srv.URL(name),
			down: func(t *testing.T) {
				srv.Stop(t)
				t.Cleanup(func() { srv.Start(t) })
			},
		}
	}
}

// countingConnector opens connections with drv and counts the statements
// they execute (a prepared statement counts when it runs, not when it is
// prepared), and the BEGIN and COMMIT or ROLLBACK of each transaction.
type countingConnector struct {
	drv driver.Driver
	dsn string
	n   *atomic.Int64
}

func (c *countingConnector) Connect(context.Context) (driver.Conn, error) {
	conn, err := c.drv.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: conn, n: c.n}, nil
}

func (c *countingConnector) Driver() driver.Driver { return c.drv }

type countingConn struct {
	driver.Conn
	n *atomic.Int64
}

func (c *countingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	e, ok := c.Conn.(driver.ExecerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	res, err := e.ExecContext(ctx, query, args)
	if err != driver.ErrSkip {
		c.n.Add(1)
	}
	return res, err
}

func (c *countingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	q, ok := c.Conn.(driver.QueryerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	rows, err := q.QueryContext(ctx, query, args)
	if err != driver.ErrSkip {
		c.n.Add(1)
	}
	return rows, err
}

func (c *countingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	var st driver.Stmt
	var err error
	if p, ok := c.Conn.(driver.ConnPrepareContext); ok {
		st, err = p.PrepareContext(ctx, query)
	} else {
		st, err = c.Conn.Prepare(query)
	}
	if err != nil {
		return nil, err
	}
	return &countingStmt{Stmt: st, n: c.n}, nil
}

// CheckNamedValue passes arguments through as the driver would take them
// (pgx takes slices for arrays).
func (c *countingConn) CheckNamedValue(nv *driver.NamedValue) error {
	if ch, ok := c.Conn.(driver.NamedValueChecker); ok {
		return ch.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

// BeginTx counts the BEGIN, and the transaction counts its COMMIT or
// ROLLBACK: each is a round trip.
func (c *countingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	b, ok := c.Conn.(driver.ConnBeginTx)
	if !ok {
		return nil, errors.New("the driver has no BeginTx")
	}
	tx, err := b.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	c.n.Add(1)
	return countingTx{Tx: tx, n: c.n}, nil
}

type countingTx struct {
	driver.Tx
	n *atomic.Int64
}

func (t countingTx) Commit() error {
	t.n.Add(1)
	return t.Tx.Commit()
}

func (t countingTx) Rollback() error {
	t.n.Add(1)
	return t.Tx.Rollback()
}

func (c *countingConn) ResetSession(ctx context.Context) error {
	if r, ok := c.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

type countingStmt struct {
	driver.Stmt
	n *atomic.Int64
}

func (s *countingStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	s.n.Add(1)
	return s.Stmt.(driver.StmtExecContext).ExecContext(ctx, args)
}

func (s *countingStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	s.n.Add(1)
	return s.Stmt.(driver.StmtQueryContext).QueryContext(ctx, args)
}

func (s *countingStmt) CheckNamedValue(nv *driver.NamedValue) error {
	if ch, ok := s.Stmt.(driver.NamedValueChecker); ok {
		return ch.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}
