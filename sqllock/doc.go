// Package sqllock is a dlock backend on a SQL database: MySQL or MariaDB,
// PostgreSQL, or a SQLite file. It keeps its locks in tables and runs the
// common operations on exclusive locks (acquire, renew, release) as single
// statements on a pooled *sql.DB; read-write locks, semaphores and fair
// locks take a short transaction where they must read other rows. No
// GET_LOCK or advisory lock, no session state: a lock is a row, not a
// connection, so a pool can never leak one.
//
//	db, _ := sql.Open("mysql", "app:secret@tcp(db:3306)/app?interpolateParams=true")
//	client := dlock.New(sqllock.New(db, sqllock.MySQL))
//
//	db, _ := sql.Open("pgx", "postgres://app:secret@db:5432/app")
//	client := dlock.New(sqllock.NewPostgres(db)) // with LISTEN/NOTIFY wake-ups
//
//	db, _ := sql.Open("sqlite", "file:/var/lib/app/locks.db?_pragma=busy_timeout(5000)")
//	client := dlock.New(sqllock.NewSQLite(db)) // with wake-ups between the host's processes
//
// The drivers are github.com/go-sql-driver/mysql, github.com/jackc/pgx/v5
// (stdlib) and modernc.org/sqlite (pure Go); the application imports the one
// it uses. docs/SQL.md in the repository says more, for application authors
// and DBAs.
//
// # The tables
//
// The lock table ("dlock_locks" by default, WithTable) has one row per name
// ever used, with the exclusive holder's token, owner, fence, hold count
// and expiry, a waiting writer's intent and a starving waiter's claim. Two
// tables beside it, with "_shared" and "_queue" added to the name, hold the
// shared holds (readers, semaphore permits) and the fair queue, and a third,
// "_gone", the records of clean-ups (see Late requests in docs/SQL.md).
// Expiry is decided by the database's own clock; clients never send a time.
// Release keeps the row, so fences never go back, across restarts too. The
// tables are created when missing (unless WithoutCreateTable; DDL returns
// the statements, UpgradeDDL those for a table of an earlier version).
//
// # SQLite
//
// Open the file so that several processes of the host can share it:
//
//	db, err := sql.Open("sqlite", "file:/path/locks.db"+
//		"?_pragma=busy_timeout(5000)&_pragma=synchronous(NORMAL)")
//	db.SetMaxOpenConns(1)
//
// The Backend switches the file to write-ahead logging when it creates the
// table; leave journal_mode out of the DSN. Use synchronous(FULL) for fences
// that survive power loss.
//
// # Waiting
//
// A PostgresBackend (NewPostgres) wakes waiters with LISTEN/NOTIFY: each
// Client keeps one pooled connection listening, so the pool must allow one
// more connection than there are Clients on it, and pgbouncer must be in
// session pooling mode. A SQLiteBackend (NewSQLite) wakes the waiters of
// the host's processes through Unix datagram sockets beside the file. On
// MySQL and MariaDB waiters poll. A plain Mutex's waiter that starves claims
// the next grant, so that an owner that releases and locks again cannot
// take the lock back every time.
//
// docs/SQL.md in the repository gives the statements per operation, the
// DDL, how shared holds, queues and claims are kept, and what each engine
// guarantees.
//
// # Errors
//
// "Held by another owner" and "not the holder" are answers, not errors.
// Errors come from the database (wrapped with the operation and the key) or
// from a key, token or owner over MaxKeyLength, MaxTokenLength or
// MaxOwnerLength, which the dlock client never sends. Errors that may heal
// (a lost connection, a deadlock, SQLITE_BUSY past the call's time) are
// marked transient (driver.IsTransient).
package sqllock
