// Making the sqllock backend for an open SQL database.

package cli

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/sqllock"
)

// newSQLBackend makes the dlock backend on db: sqllock in the dialect d, and
// on PostgreSQL the variant that wakes waiters with LISTEN/NOTIFY. A
// readOnly backend never creates dlock's tables (nor switches a SQLite file
// to WAL): a command that only reads must leave another program's database,
// or a mistyped path, as it found it.
func newSQLBackend(db *sql.DB, d sqlDialect, readOnly bool) (driver.Backend, error) {
	var opts []sqllock.Option
	if readOnly {
		opts = append(opts, sqllock.WithoutCreateTable())
	}
	switch d {
	case dialectSQLite:
		return sqllock.NewSQLite(db, opts...), nil
	case dialectMySQL:
		return sqllock.New(db, sqllock.MySQL, opts...), nil
	case dialectPostgres:
		return sqllock.NewPostgres(db, opts...), nil
	}
	return nil, fmt.Errorf("unknown SQL dialect %d", d)
}

// tablesOptional is the Inspector of a read-only SQL store: a database
// without dlock's tables holds no lock, so their absence lists nothing and
// finds nothing, where the driver reports an error. A table of an older
// dlock, without a column this one reads, is upgraded once (dlock's own
// table; the next lock would do the same) by full, and the call tried again.
type tablesOptional struct {
	ro   driver.Inspector
	full func() driver.Inspector // the backend that upgrades dlock's tables

	mu       sync.Mutex
	upgraded driver.Inspector
}

// inspector returns the Inspector to use now.
func (t *tablesOptional) inspector() driver.Inspector {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.upgraded != nil {
		return t.upgraded
	}
	return t.ro
}

// retry reports whether a call that failed with err should be made again
// on the upgrading Inspector, switching to it.
func (t *tablesOptional) retry(err error) bool {
	if !missingColumn(err) {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.upgraded != nil {
		return false
	}
	t.upgraded = t.full()
	return true
}

// Inspect implements driver.Inspector.
func (t *tablesOptional) Inspect(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	info, ok, err := t.inspector().Inspect(ctx, key)
	if t.retry(err) {
		info, ok, err = t.inspector().Inspect(ctx, key)
	}
	if missingTable(err) {
		return driver.LockInfo{}, false, nil
	}
	return info, ok, err
}

// List implements driver.Inspector.
func (t *tablesOptional) List(ctx context.Context, prefix string) ([]driver.LockInfo, error) {
	infos, err := t.inspector().List(ctx, prefix)
	if t.retry(err) {
		infos, err = t.inspector().List(ctx, prefix)
	}
	if missingTable(err) {
		return nil, nil
	}
	return infos, err
}

// ForceRelease implements driver.Inspector.
func (t *tablesOptional) ForceRelease(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	info, ok, err := t.inspector().ForceRelease(ctx, key)
	if t.retry(err) {
		info, ok, err = t.inspector().ForceRelease(ctx, key)
	}
	if missingTable(err) {
		return driver.LockInfo{}, false, nil
	}
	return info, ok, err
}

// missingTable reports whether err says that a table does not exist
// (SQLite "no such table", PostgreSQL 42P01, MySQL 1146).
func missingTable(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "42P01"
	}
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) {
		return myErr.Number == 1146
	}
	return strings.Contains(err.Error(), "no such table")
}

// missingColumn reports whether err says that a column does not exist
// (SQLite "no such column", PostgreSQL 42703, MySQL 1054).
func missingColumn(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "42703"
	}
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) {
		return myErr.Number == 1054
	}
	return strings.Contains(err.Error(), "no such column")
}
