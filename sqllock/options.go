// Dialect and the options of a Backend: WithTable and WithoutCreateTable.

package sqllock

import "fmt"

// Dialect names the SQL engine behind a *sql.DB.
type Dialect int

const (
	// MySQL is MySQL or MariaDB through github.com/go-sql-driver/mysql
	// (tested with MariaDB 10.11).
	MySQL Dialect = iota + 1
	// PostgreSQL is PostgreSQL 11 and later through
	// github.com/jackc/pgx/v5/stdlib (tested with 15).
	PostgreSQL
	// SQLite is SQLite 3.42 and later through modernc.org/sqlite.
	SQLite
)

// String returns the dialect's name.
func (d Dialect) String() string {
	switch d {
	case MySQL:
		return "MySQL"
	case PostgreSQL:
		return "PostgreSQL"
	case SQLite:
		return "SQLite"
	}
	return fmt.Sprintf("Dialect(%d)", int(d))
}

// DefaultTable is the lock table's name when WithTable is not given.
const DefaultTable = "dlock_locks"

// Option configures a Backend.
type Option interface {
	apply(*options)
}

type options struct {
	table  string
	create bool
}

type optionFunc func(*options)

func (f optionFunc) apply(o *options) { f(o) }

// WithTable sets the name of the lock table, optionally qualified by a
// schema or database ("locks.dlock"); its two side tables are named after
// it, with "_shared" and "_queue" added (see DDL). Each part is a plain SQL
// identifier: a letter or underscore, then letters, digits and underscores,
// at most 63 bytes; it is quoted in every statement, so on PostgreSQL its
// case counts. A name that breaks these rules makes every call of the
// Backend fail. The default is DefaultTable ("dlock_locks").
func WithTable(name string) Option {
	return optionFunc(func(o *options) { o.table = name })
}

// WithoutCreateTable stops the Backend from creating its tables: use it
// when the application's database user may not run DDL, and create them
// beforehand with the statements from DDL (and, for a lock table made by an
// earlier version, UpgradeDDL). By default the tables are created if
// missing, and a lock table of an earlier version gets the columns it
// lacks, once, before the first operation.
func WithoutCreateTable() Option {
	return optionFunc(func(o *options) { o.create = false })
}
