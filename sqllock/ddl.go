package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
)

// maxIdentifier is the longest part of a table name, in bytes: PostgreSQL
// keeps 63 (MySQL allows 64).
const maxIdentifier = 63

// DDL returns the CREATE TABLE statement of the lock table for the dialect,
// for DBAs who create it by hand (see WithoutCreateTable). The Backend runs
// the same statement when it creates the table itself. It returns an error
// for an unknown dialect or a table name that WithTable would refuse.
func DDL(d Dialect, table string) (string, error) {
	q, err := quoteTable(d, table)
	if err != nil {
		return "", err
	}
	var ddl string
	switch d {
	case MySQL:
		ddl = mysqlDDL
	case PostgreSQL:
		ddl = postgresDDL
	case SQLite:
		ddl = sqliteDDL
	}
	return strings.ReplaceAll(ddl, "{t}", q), nil
}

// The lock table: one row per lock name ever used. A row whose token is
// NULL, or whose expires_at has passed by the database's clock, is free;
// its fence stays, so the name's next grant draws a larger one.
const (
	mysqlDDL = `CREATE TABLE IF NOT EXISTS {t} (
  name        VARBINARY(255) NOT NULL PRIMARY KEY,
  token       VARBINARY(255) NULL,
  owner       VARCHAR(2048) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  fence       BIGINT NOT NULL,
  holds       INT NOT NULL,
  acquired_at DATETIME(6) NOT NULL,
  expires_at  DATETIME(6) NOT NULL
) ENGINE=InnoDB`

	postgresDDL = `CREATE TABLE IF NOT EXISTS {t} (
  name        text COLLATE "C" NOT NULL PRIMARY KEY,
  token       text,
  owner       text NOT NULL,
  fence       bigint NOT NULL,
  holds       integer NOT NULL,
  acquired_at timestamptz NOT NULL,
  expires_at  timestamptz NOT NULL
)`

	sqliteDDL = `CREATE TABLE IF NOT EXISTS {t} (
  name        TEXT NOT NULL PRIMARY KEY,
  token       TEXT,
  owner       TEXT NOT NULL,
  fence       INTEGER NOT NULL,
  holds       INTEGER NOT NULL,
  acquired_at INTEGER NOT NULL,
  expires_at  INTEGER NOT NULL
) WITHOUT ROWID`
)

// CreateTable creates the lock table if it does not exist, with the
// statement DDL returns. A Backend calls it before its first operation unless
// WithoutCreateTable was given; call it yourself to fail early. When the
// statement fails but the table exists anyway (another process created it at
// the same moment), it returns nil.
//
// On SQLite it first switches the file to write-ahead logging (PRAGMA
// journal_mode=WAL, a lasting property of the file; a no-op once done, and
// for an in-memory database), and it runs each statement again while the
// file is locked, within ctx: several processes may make a fresh file ready
// at once.
func (b *Backend) CreateTable(ctx context.Context) error {
	if b.err != nil {
		return fmt.Errorf("sqllock: create table: %w", b.err)
	}
	ddl, err := DDL(b.dialect, b.table)
	if err != nil {
		return fmt.Errorf("sqllock: create table: %w", err)
	}
	exec := func(q string) error {
		_, err := retryBusy(ctx, b.dialect, func() (sql.Result, error) { return b.db.ExecContext(ctx, q) })
		return err
	}
	if b.dialect == SQLite {
		if err := exec(sqliteWAL); err != nil {
			return fmt.Errorf("sqllock: create table %s: set journal_mode=WAL: %w", b.table, err)
		}
	}
	if err := exec(ddl); err != nil {
		if perr := exec("SELECT 1 FROM " + b.quoted + " WHERE 1 = 0"); perr != nil {
			return fmt.Errorf("sqllock: create table %s: %w", b.table, err)
		}
	}
	b.created.Store(true)
	return nil
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
	return b.CreateTable(ctx)
}

// quoteTable validates a table name and quotes each of its parts for d.
func quoteTable(d Dialect, table string) (string, error) {
	open, end := `"`, `"`
	switch d {
	case MySQL:
		open, end = "`", "`"
	case PostgreSQL, SQLite:
	default:
		return "", fmt.Errorf("unknown dialect %v", d)
	}
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		return "", fmt.Errorf("table name %q: more than one dot", table)
	}
	for i, p := range parts {
		if err := checkIdentifier(p); err != nil {
			return "", fmt.Errorf("table name %q: %w", table, err)
		}
		parts[i] = open + p + end
	}
	return strings.Join(parts, "."), nil
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
