// Package sqllock is a dlock backend on a SQL database: MySQL or MariaDB,
// PostgreSQL, or a SQLite file. It keeps its locks in one table and runs
// every operation as a single statement on a pooled *sql.DB: no explicit
// transaction, no GET_LOCK or advisory lock, no session state. A lock is a
// row, not a connection, so a pool can never leak one.
//
//	db, _ := sql.Open("mysql", "app:secret@tcp(db:3306)/app?interpolateParams=true")
//	client := dlock.New(sqllock.New(db, sqllock.MySQL))
//
//	db, _ := sql.Open("pgx", "postgres://app:secret@db:5432/app")
//	client := dlock.New(sqllock.NewPostgres(db)) // with LISTEN/NOTIFY wake-ups
//
// The drivers are github.com/go-sql-driver/mysql, github.com/jackc/pgx/v5
// (stdlib) and modernc.org/sqlite (pure Go); the application imports the one
// it uses. docs/SQL.md in the repository says more, for application authors
// and DBAs.
//
// # The table
//
// One row per lock name ever used (WithTable names the table, "dlock_locks"
// by default; DDL returns its CREATE TABLE statement): name (compared byte
// for byte), token (NULL when free), owner, fence, holds, acquired_at and
// expires_at. A row is held while its token is set and expires_at is in the
// future by the database's own clock (UTC_TIMESTAMP(6), now(), or
// unixepoch('subsec') in milliseconds); clients never send a time. Release
// sets the token to NULL and keeps the row, so the name's next grant draws
// fence+1: fences never go back, even across a restart of the database. The
// table is created if missing before the first operation, unless
// WithoutCreateTable is given.
//
// # Round trips
//
// Acquire, renew and release are one statement each when a grant is made,
// with these exceptions: a refused acquire on SQLite and MySQL adds a SELECT
// for the holder; on MySQL, which has no UPDATE ... RETURNING, the first
// grant of a name ever takes three statements (UPDATE, SELECT, INSERT), a
// reentrant acquire adds a SELECT for the hold count, and ForceRelease takes
// two. RenewBatch renews up to 500 leases per statement (on MySQL plus one
// statement per lease when not all were held). A refused acquire that finds
// no holder (the row was released or changed hands while it ran) tries once
// more, as does MySQL's up to three times. On MySQL use
// interpolateParams=true: without it the driver prepares and closes every
// statement, two round trips each.
//
// # SQLite
//
// Open the file so that several processes can share it:
//
//	db, err := sql.Open("sqlite", "file:/path/locks.db"+
//		"?_pragma=busy_timeout(5000)&_pragma=synchronous(NORMAL)")
//	db.SetMaxOpenConns(1)
//
// busy_timeout makes a writer wait for another process instead of failing;
// one connection per process queues this process's statements in Go rather
// than in SQLite's coarse busy handler. synchronous(NORMAL) spares an fsync
// per operation: a crashed process loses nothing, a crashed machine may lose
// its last grants (and every holder with them); use FULL for fences that
// survive power loss. The file must be on a local file system, and every
// process on the same host. A refused acquire reads the holder with a second
// statement, which on a local file costs microseconds.
//
// The Backend switches the file to write-ahead logging (journal_mode=WAL,
// which lets readers run beside the writer) when it creates the table; with
// WithoutCreateTable, run PRAGMA journal_mode=WAL once yourself. Leave
// journal_mode out of the DSN: there it runs on every new connection, and
// processes that open a fresh file at once may fail to connect with
// SQLITE_BUSY. SQLite answers SQLITE_BUSY without waiting for busy_timeout
// when waiting could deadlock (as when processes switch a fresh file to WAL
// together) or a write's snapshot is stale, so every statement of the
// Backend, table creation included, is run again after a short, jittered
// pause while it fails with SQLITE_BUSY or SQLITE_LOCKED, until its context
// ends.
//
// # Waiting
//
// The dlock client polls for a lock that is held, with backoff capped by the
// holder's remaining TTL. A PostgresBackend (NewPostgres) also implements
// driver.Notifier: release notifies on the channel "dlock_release" in the
// same statement, and each dlock Client keeps one pooled connection
// listening, so waiters wake at once. The pool must allow at least one more
// connection than there are listening Clients on it (at least 2 for one
// Client): Listen refuses to take the last one, and waits at most a second
// for a free one, and the Client then polls. LISTEN does not work through
// pgbouncer in transaction pooling mode (the notifications never arrive and
// waiters only poll): connect directly or with session pooling, or use
// New(db, PostgreSQL).
//
// # Errors
//
// "Held by another owner" and "not the holder" are answers, not errors.
// Errors come from the database (wrapped with the operation and the key) or
// from a key, token or owner over MaxKeyLength, MaxTokenLength or
// MaxOwnerLength, which the dlock client never sends.
package sqllock
