// stmtCache, which prepares statements once per pool (used on SQLite).

package sqllock

import (
	"context"
	"database/sql"
	"sync"
)

// stmtCache prepares statements once per pool. SQLite parses a statement
// every time it is not prepared, which for the acquire upsert costs more
// than running it; a *sql.Stmt is prepared again on each new connection by
// database/sql and closed with the connection. (MySQL and PostgreSQL do not
// use it: pgx caches prepared statements itself, and server-side prepared
// statements on MySQL would outlive a dropped Backend on every pooled
// connection; interpolateParams=true gives MySQL one round trip instead.)
type stmtCache struct {
	db *sql.DB

	mu    sync.Mutex
	stmts map[string]*sql.Stmt
}

// get returns the prepared form of query. A failure is not cached: the
// table may not exist yet.
func (c *stmtCache) get(ctx context.Context, query string) (*sql.Stmt, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st := c.stmts[query]; st != nil {
		return st, nil
	}
	st, err := c.db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	if c.stmts == nil {
		c.stmts = make(map[string]*sql.Stmt)
	}
	c.stmts[query] = st
	return st, nil
}

// queryRow runs a prepared query that returns at most one row.
func (c *stmtCache) queryRow(ctx context.Context, query string, args ...any) rowScanner {
	st, err := c.get(ctx, query)
	if err != nil {
		return errRow{err}
	}
	return st.QueryRowContext(ctx, args...)
}

// exec runs a prepared statement.
func (c *stmtCache) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	st, err := c.get(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(ctx, args...)
}

// rowScanner is a *sql.Row, or the error that kept one from being made.
type rowScanner interface{ Scan(dest ...any) error }

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
