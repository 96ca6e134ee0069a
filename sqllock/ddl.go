// The lock tables' schema: DDL, UpgradeDDL and CreateTable, and the checking
// and quoting of table names.

package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
)

// maxIdentifier is the longest part of a table name, in bytes: PostgreSQL
// keeps 63 (MySQL allows 64).
const maxIdentifier = 63

// DDL returns the statements that create the lock tables for the dialect,
// for DBAs who create them by hand (see WithoutCreateTable): the lock table
// (one row per name), and next to it, with "_shared", "_queue" and "_gone"
// added to its name (a name too long for that keeps its start and gets a
// hash of all of it), the table of shared holds (readers, semaphore
// permits), the table of fair queues and the table of tokens that a
// clean-up released or withdrew. The four CREATE TABLE IF NOT EXISTS statements are
// separated by ";\n\n"; run them one by one where the driver takes one
// statement at a time. The Backend runs the same statements when it creates
// the tables itself. A lock table made by an earlier version, without the
// columns shared_until, intent_token, intent_owner, intent_until,
// claim_token, claim_owner, claim_until, shared_lim and proclaimed, needs
// the statements of UpgradeDDL too. DDL returns an error for an unknown
// dialect or a table name that WithTable would refuse.
func DDL(d Dialect, table string) (string, error) {
	stmts, err := ddlStatements(d, table)
	if err != nil {
		return "", err
	}
	return strings.Join(stmts, ";\n\n"), nil
}

// UpgradeDDL returns the statements that add the columns of this version
// to a lock table made by an earlier one (shared_until, intent_token,
// intent_owner, intent_until, claim_token, claim_owner, claim_until,
// shared_lim, proclaimed; all NULL, so no row changes meaning), one ALTER TABLE per column, separated
// by ";\n\n". Run them once, then the statements of DDL for the new
// tables. On PostgreSQL each skips a column that exists already (ADD COLUMN
// IF NOT EXISTS); MySQL and SQLite have no such clause: run each statement
// on its own and pass over its "duplicate column" error (a table of the
// previous version has the first four). A Backend that creates its tables
// (the default) adds missing columns itself.
func UpgradeDDL(d Dialect, table string) (string, error) {
	names, err := quoteTables(d, table)
	if err != nil {
		return "", err
	}
	var stmts []string
	add := " ADD COLUMN "
	if d == PostgreSQL {
		add = " ADD COLUMN IF NOT EXISTS "
	}
	for _, c := range newColumns(d) {
		stmts = append(stmts, "ALTER TABLE "+names.main+add+c.name+" "+c.def)
	}
	return strings.Join(stmts, ";\n\n"), nil
}

// ddlStatements returns the CREATE TABLE statements of the three tables.
func ddlStatements(d Dialect, table string) ([]string, error) {
	names, err := quoteTables(d, table)
	if err != nil {
		return nil, err
	}
	var ddl [4]string
	switch d {
	case MySQL:
		ddl = [4]string{mysqlDDL, mysqlSharedDDL, mysqlQueueDDL, mysqlGoneDDL}
	case PostgreSQL:
		ddl = [4]string{postgresDDL, postgresSharedDDL, postgresQueueDDL, postgresGoneDDL}
	case SQLite:
		ddl = [4]string{sqliteDDL, sqliteSharedDDL, sqliteQueueDDL, sqliteGoneDDL}
	}
	fill := strings.NewReplacer("{t}", names.main, "{s}", names.shared, "{q}", names.queue, "{g}", names.gone)
	return []string{fill.Replace(ddl[0]), fill.Replace(ddl[1]), fill.Replace(ddl[2]), fill.Replace(ddl[3])}, nil
}

// The lock table: one row per lock name ever used. A row whose token is
// NULL, or whose expires_at has passed by the database's clock, has no
// exclusive holder; its fence stays, so the name's next grant draws a larger
// one. shared_until is the latest expiry of the name's shared holds (NULL
// when it has none): an exclusive grant needs it NULL or past, which it can
// check on the row alone. intent_token, intent_owner and intent_until are a
// waiting writer's intent, live while intent_token is set and intent_until
// is in the future, which keeps new shared holds out. claim_token,
// claim_owner and claim_until are a starving plain waiter's claim on the
// next grant (driver.AcquireRequest.Claim), live likewise, which keeps the
// plain exclusive requests of every other token out. shared_lim is the
// Limit of the name's shared holds (0: readers; NULL: not known, on a row
// of an earlier version), set by every shared grant and binding while
// shared_until is ahead: a shared request of another Limit is refused
// (driver.AcquireResult.Conflict), which a reader's single upsert checks on
// the row it locks. proclaimed is the grant's fence and the sequence number
// of the last proclaim applied to it (driver.Proclaimer), 20 digits each,
// so that a later proclaim of the grant, or any proclaim of a later grant,
// compares greater as text.
//
// The shared-hold table has one row per shared hold (its own token, owner,
// fence, expiry and the limit it was granted under); the queue table one
// row per waiter of a fair lock, in the order of seq; the gone table one
// row per token that a clean-up released while it held nothing (grants 1)
// or withdrew (grants 0), until expires_at: a request of that token still
// on its way then grants nothing (grants 1) and queues nothing (see
// goneTTL).
const (
	mysqlDDL = `CREATE TABLE IF NOT EXISTS {t} (
  name         VARBINARY(255) NOT NULL PRIMARY KEY,
  token        VARBINARY(255) NULL,
  owner        VARCHAR(2048) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  fence        BIGINT NOT NULL,
  holds        INT NOT NULL,
  acquired_at  DATETIME(6) NOT NULL,
  expires_at   DATETIME(6) NOT NULL,
  shared_until DATETIME(6) NULL,
  intent_token VARBINARY(255) NULL,
  intent_owner VARCHAR(2048) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
  intent_until DATETIME(6) NULL,
  claim_token  VARBINARY(255) NULL,
  claim_owner  VARCHAR(2048) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
  claim_until  DATETIME(6) NULL,
  shared_lim   INT NULL,
  proclaimed   VARBINARY(40) NULL
) ENGINE=InnoDB`

	mysqlSharedDDL = `CREATE TABLE IF NOT EXISTS {s} (
  name        VARBINARY(255) NOT NULL,
  token       VARBINARY(255) NOT NULL,
  owner       VARCHAR(2048) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  fence       BIGINT NOT NULL,
  lim         INT NOT NULL,
  acquired_at DATETIME(6) NOT NULL,
  expires_at  DATETIME(6) NOT NULL,
  PRIMARY KEY (name, token)
) ENGINE=InnoDB`

	mysqlQueueDDL = `CREATE TABLE IF NOT EXISTS {q} (
  name       VARBINARY(255) NOT NULL,
  token      VARBINARY(255) NOT NULL,
  seq        BIGINT NOT NULL,
  expires_at DATETIME(6) NOT NULL,
  PRIMARY KEY (name, token)
) ENGINE=InnoDB`

	mysqlGoneDDL = `CREATE TABLE IF NOT EXISTS {g} (
  name       VARBINARY(255) NOT NULL,
  token      VARBINARY(255) NOT NULL,
  grants     INT NOT NULL,
  expires_at DATETIME(6) NOT NULL,
  PRIMARY KEY (name, token)
) ENGINE=InnoDB`

	postgresDDL = `CREATE TABLE IF NOT EXISTS {t} (
  name         text COLLATE "C" NOT NULL PRIMARY KEY,
  token        text,
  owner        text NOT NULL,
  fence        bigint NOT NULL,
  holds        integer NOT NULL,
  acquired_at  timestamptz NOT NULL,
  expires_at   timestamptz NOT NULL,
  shared_until timestamptz,
  intent_token text,
  intent_owner text,
  intent_until timestamptz,
  claim_token  text,
  claim_owner  text,
  claim_until  timestamptz,
  shared_lim   integer,
  proclaimed   text
)`

	postgresSharedDDL = `CREATE TABLE IF NOT EXISTS {s} (
  name        text COLLATE "C" NOT NULL,
  token       text COLLATE "C" NOT NULL,
  owner       text NOT NULL,
  fence       bigint NOT NULL,
  lim         integer NOT NULL,
  acquired_at timestamptz NOT NULL,
  expires_at  timestamptz NOT NULL,
  PRIMARY KEY (name, token)
)`

	postgresQueueDDL = `CREATE TABLE IF NOT EXISTS {q} (
  name       text COLLATE "C" NOT NULL,
  token      text COLLATE "C" NOT NULL,
  seq        bigint NOT NULL,
  expires_at timestamptz NOT NULL,
  PRIMARY KEY (name, token)
)`

	postgresGoneDDL = `CREATE TABLE IF NOT EXISTS {g} (
  name       text COLLATE "C" NOT NULL,
  token      text COLLATE "C" NOT NULL,
  grants     integer NOT NULL,
  expires_at timestamptz NOT NULL,
  PRIMARY KEY (name, token)
)`

	sqliteDDL = `CREATE TABLE IF NOT EXISTS {t} (
  name         TEXT NOT NULL PRIMARY KEY,
  token        TEXT,
  owner        TEXT NOT NULL,
  fence        INTEGER NOT NULL,
  holds        INTEGER NOT NULL,
  acquired_at  INTEGER NOT NULL,
  expires_at   INTEGER NOT NULL,
  shared_until INTEGER,
  intent_token TEXT,
  intent_owner TEXT,
  intent_until INTEGER,
  claim_token  TEXT,
  claim_owner  TEXT,
  claim_until  INTEGER,
  shared_lim   INTEGER,
  proclaimed   TEXT
) WITHOUT ROWID`

	sqliteSharedDDL = `CREATE TABLE IF NOT EXISTS {s} (
  name        TEXT NOT NULL,
  token       TEXT NOT NULL,
  owner       TEXT NOT NULL,
  fence       INTEGER NOT NULL,
  lim         INTEGER NOT NULL,
  acquired_at INTEGER NOT NULL,
  expires_at  INTEGER NOT NULL,
  PRIMARY KEY (name, token)
) WITHOUT ROWID`

	sqliteQueueDDL = `CREATE TABLE IF NOT EXISTS {q} (
  name       TEXT NOT NULL,
  token      TEXT NOT NULL,
  seq        INTEGER NOT NULL,
  expires_at INTEGER NOT NULL,
  PRIMARY KEY (name, token)
) WITHOUT ROWID`

	sqliteGoneDDL = `CREATE TABLE IF NOT EXISTS {g} (
  name       TEXT NOT NULL,
  token      TEXT NOT NULL,
  grants     INTEGER NOT NULL,
  expires_at INTEGER NOT NULL,
  PRIMARY KEY (name, token)
) WITHOUT ROWID`
)

// column is a column of the lock table added by this version.
type column struct{ name, def string }

// newColumns returns the lock table's columns that earlier versions did not
// have, with their definitions for d.
func newColumns(d Dialect) []column {
	switch d {
	case MySQL:
		return []column{
			{"shared_until", "DATETIME(6) NULL"},
			{"intent_token", "VARBINARY(255) NULL"},
			{"intent_owner", "VARCHAR(2048) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL"},
			{"intent_until", "DATETIME(6) NULL"},
			{"claim_token", "VARBINARY(255) NULL"},
			{"claim_owner", "VARCHAR(2048) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL"},
			{"claim_until", "DATETIME(6) NULL"},
			{"shared_lim", "INT NULL"},
			{"proclaimed", "VARBINARY(40) NULL"},
		}
	case PostgreSQL:
		return []column{{"shared_until", "timestamptz"}, {"intent_token", "text"}, {"intent_owner", "text"}, {"intent_until", "timestamptz"},
			{"claim_token", "text"}, {"claim_owner", "text"}, {"claim_until", "timestamptz"}, {"shared_lim", "integer"},
			{"proclaimed", "text"}}
	}
	return []column{{"shared_until", "INTEGER"}, {"intent_token", "TEXT"}, {"intent_owner", "TEXT"}, {"intent_until", "INTEGER"},
		{"claim_token", "TEXT"}, {"claim_owner", "TEXT"}, {"claim_until", "INTEGER"}, {"shared_lim", "INTEGER"},
		{"proclaimed", "TEXT"}}
}

// CreateTable creates the lock tables if they do not exist, with the
// statements DDL returns, and adds the columns of this version to a lock
// table made by an earlier one (see UpgradeDDL). A Backend calls it before
// its first operation unless WithoutCreateTable was given; call it yourself
// to fail early. When a statement fails but its table (or column) exists
// anyway (another process created it at the same moment), it goes on.
//
// On SQLite it first switches the file to write-ahead logging (PRAGMA
// journal_mode=WAL, a lasting property of the file; a no-op once done, and
// for an in-memory database), and it runs each statement again while the
// file is locked, within ctx: several processes may make a fresh file ready
// at once.
func (b *Backend) CreateTable(ctx context.Context) error {
	if err := b.createTable(ctx); err != nil {
		return fmt.Errorf("sqllock: %w", err)
	}
	return nil
}

// createTable is CreateTable, its errors named by the caller.
func (b *Backend) createTable(ctx context.Context) error {
	if b.err != nil {
		return fmt.Errorf("create table: %w", b.err)
	}
	stmts, err := ddlStatements(b.dialect, b.table)
	if err != nil {
		return fmt.Errorf("create table: %w", err)
	}
	exec := func(q string) error {
		_, err := retryBusy(ctx, b.dialect, func() (sql.Result, error) { return b.db.ExecContext(ctx, q) })
		return err
	}
	if b.dialect == SQLite {
		if err := exec(sqliteWAL); err != nil {
			return fmt.Errorf("create table %s: set journal_mode=WAL: %w", b.table, err)
		}
	}
	tables := []string{b.names.main, b.names.shared, b.names.queue, b.names.gone}
	for i, ddl := range stmts {
		if err := exec(ddl); err != nil {
			if perr := exec("SELECT 1 FROM " + tables[i] + " WHERE 1 = 0"); perr != nil {
				return fmt.Errorf("create table %s: %w", tables[i], err)
			}
		}
		if i == 0 {
			if err := b.addColumns(ctx, exec); err != nil {
				return fmt.Errorf("create table %s: %w", b.table, err)
			}
		}
	}
	b.created.Store(true)
	return nil
}

// addColumns adds the columns of newColumns that the lock table lacks (it
// was made by an earlier version). Another process may add them at the same
// moment: a failed ALTER TABLE is an error only when the column is still
// missing afterwards.
func (b *Backend) addColumns(ctx context.Context, exec func(string) error) error {
	for _, c := range newColumns(b.dialect) {
		if b.hasColumn(ctx, c.name) {
			continue
		}
		if err := exec("ALTER TABLE " + b.names.main + " ADD COLUMN " + c.name + " " + c.def); err != nil && !b.hasColumn(ctx, c.name) {
			return fmt.Errorf("add column %s: %w", c.name, err)
		}
	}
	return nil
}

// hasColumn reports whether the lock table has the column: whether a query
// of it works. (Not SELECT *, whose result changes with the table: pgx
// would answer from a plan cached before another process added a column.)
func (b *Backend) hasColumn(ctx context.Context, name string) bool {
	_, err := retryBusy(ctx, b.dialect, func() (bool, error) {
		rows, err := b.db.QueryContext(ctx, "SELECT "+name+" FROM "+b.names.main+" WHERE 1 = 0")
		if err != nil {
			return false, err
		}
		return true, rows.Close()
	})
	return err == nil
}

// sqliteWAL switches a SQLite file to write-ahead logging, under which
// readers do not block the writer and a commit needs no exclusive lock on
// the file. It is run once per Backend, not on every new connection as a
// "_pragma=journal_mode(WAL)" in the DSN is: on a fresh file, processes that
// switch it at the same moment get SQLITE_BUSY without waiting for
// busy_timeout, which here is retried but in a DSN fails the connection.
const sqliteWAL = `PRAGMA journal_mode=WAL`

// ready creates the table on first use, once; a failure is returned and the
// next call tries again.
func (b *Backend) ready(ctx context.Context) error {
	if b.err != nil {
		return b.err
	}
	if !b.create || b.created.Load() {
		return nil
	}
	b.createMu.Lock()
	defer b.createMu.Unlock()
	if b.created.Load() {
		return nil
	}
	return b.createTable(ctx)
}

// tableNames are the quoted names of a Backend's four tables.
type tableNames struct {
	main, shared, queue, gone string
}

// quoteTables validates a table name and returns the names of the lock
// table and its two side tables, each part quoted for d.
func quoteTables(d Dialect, table string) (tableNames, error) {
	open, end := `"`, `"`
	switch d {
	case MySQL:
		open, end = "`", "`"
	case PostgreSQL, SQLite:
	default:
		return tableNames{}, fmt.Errorf("unknown dialect %v", d)
	}
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		return tableNames{}, fmt.Errorf("table name %q: more than one dot", table)
	}
	for _, p := range parts {
		if err := checkIdentifier(p); err != nil {
			return tableNames{}, fmt.Errorf("table name %q: %w", table, err)
		}
	}
	quote := func(last string) string {
		q := make([]string, len(parts))
		for i, p := range parts {
			if i == len(parts)-1 {
				p = last
			}
			q[i] = open + p + end
		}
		return strings.Join(q, ".")
	}
	last := parts[len(parts)-1]
	return tableNames{
		main:   quote(last),
		shared: quote(sideName(last, "_shared")),
		queue:  quote(sideName(last, "_queue")),
		gone:   quote(sideName(last, "_gone")),
	}, nil
}

// sideName returns the name of a side table of the lock table called name:
// name+suffix, or, when that would be longer than an identifier may be (and
// PostgreSQL would cut it short, perhaps to the lock table's own name), the
// start of name, a hash of all of it, and the suffix.
func sideName(name, suffix string) string {
	if len(name)+len(suffix) <= maxIdentifier {
		return name + suffix
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	tag := fmt.Sprintf("_%08x", h.Sum32())
	return name[:maxIdentifier-len(suffix)-len(tag)] + tag + suffix
}

func checkIdentifier(s string) error {
	if s == "" {
		return errors.New("empty identifier")
	}
	if len(s) > maxIdentifier {
		return fmt.Errorf("identifier %q over %d bytes", s, maxIdentifier)
	}
	for i, c := range []byte(s) {
		letter := c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
		if !letter && (i == 0 || c < '0' || c > '9') {
			return fmt.Errorf("identifier %q: want letters, digits and underscores, not starting with a digit", s)
		}
	}
	return nil
}
