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
// The lock table has one row per lock name ever used (WithTable names the
// table, "dlock_locks" by default; DDL returns the CREATE TABLE
// statements): name (compared byte for byte), token (NULL when free),
// owner, fence, holds, acquired_at and expires_at for the exclusive holder;
// shared_until, the latest expiry of the name's shared holds;
// intent_token, intent_owner and intent_until, a waiting writer's intent;
// claim_token, claim_owner and claim_until, a starving plain waiter's
// claim on the next grant (see Waiting); and shared_lim, the Limit of the
// shared holds, which binds the name's kind while they live (a reader or
// permit of another limit is refused as a conflict). A row is held while its token is set and expires_at is in the future by the
// database's own clock (UTC_TIMESTAMP(6), now(), or unixepoch('subsec') in
// milliseconds); clients never send a time. Release sets the token to NULL
// and keeps the row, so the name's next grant draws fence+1: fences never go
// back, even across a restart of the database, and shared grants draw
// theirs from the same column.
//
// Two more tables sit beside it, named after it with "_shared" and
// "_queue": one row per shared hold (a reader of a read-write lock, a
// semaphore permit: its token, owner, fence, expiry and the limit it was
// granted under), and one row per waiter of a fair lock, in arrival order.
// The tables are created if missing before the first operation, unless
// WithoutCreateTable is given; a lock table made by an earlier version gets
// the new columns then (see UpgradeDDL).
//
// # Shared holds, writer intents and fair queues
//
// An exclusive grant needs the row free and shared_until NULL or past: the
// upsert checks its own row, which it locks, and nothing else, so that row
// locking alone keeps it exact (a subquery on the shared-hold table would
// not see a hold committed by a transaction it waited for). Every change to
// a name's shared holds, queue entries or intent locks the name's row first
// and reads those tables only after that, in one transaction (PostgreSQL:
// READ COMMITTED, where each statement reads what was committed when it
// began; MySQL: the first consistent read comes after the lock; SQLite: the
// write lock). Releasing a shared hold recomputes shared_until from the
// holds left, so a writer gets in the moment the last reader leaves; every
// grant and renewal of a shared hold raises shared_until to at least the
// hold's expiry (a reader's hold on MySQL and SQLite, inserted after the
// upsert that raised it, is capped by it), so shared_until is never behind a
// live hold, and a shared hold is not renewed while an exclusive holder is
// live. A token holds one shared hold: a second shared request with it is
// refused. A refused exclusive request with Wait records the writer's intent
// on the row, which keeps new readers out until the writer is in or gives
// up; a later refused request with Wait keeps the token's intent whatever
// refuses it (another writer, too).
//
// Expired shared holds, queue entries and intents (a process that died, a
// waiter that stopped asking) never keep anyone out: every check compares
// their expiry with the database's clock. Their rows are deleted by the
// name's next transaction (a reader's or a permit's acquire, a fair
// acquire, the release of a shared hold, queue entry or intent, and
// ForceRelease); the plain exclusive statements leave them, so the rows of
// a name that only plain mutexes use afterwards, or that nobody uses again,
// stay until such a transaction comes.
//
// # Round trips
//
// Statements per operation (BEGIN and COMMIT count as one each; MySQL with
// interpolateParams=true, without which every statement with parameters
// costs two more round trips):
//
//	                                          PostgreSQL  MySQL  SQLite
//	exclusive acquire (granted)                        1      1       1
//	  refused by a writer                              1      2       2
//	  refused by a writer, Wait, token's own intent    2      3       3
//	  refused by readers                               2      2       2
//	  refused by readers, with Wait (intent)           3      3       3
//	  refused, claiming (a starving plain waiter)      2    1-2     1-2
//	exclusive renew, release                           1      1       1
//	reader acquire (RLock)                             1      4     4-5
//	reader renew                                       1      7       8
//	reader release                                     6      8       8
//	semaphore permit acquire                         4-5    4-6     4-6
//	semaphore permit release                           6      8       8
//	fair acquire                                       5    5-6     5-6
//	release of a waiter's queue entry or intent        6      7       7
//	release of nothing                                 1      2       2
//	RenewBatch (per 500 leases), exclusive only        1      1       1
//	  with shared holds                                1      8       8
//	Inspect, List                                      1      1       1
//	ForceRelease                                       5      8       7
//
// On MySQL the first grant of a name ever takes three statements (UPDATE,
// SELECT, INSERT), a reentrant acquire adds a SELECT for the hold count, a
// batch renewal that did not renew every lease with its UPDATE adds a
// SELECT to tell which, and a transaction that deletes a name's expired
// rows from one table adds a SELECT and a DELETE (one DELETE elsewhere, in
// the same statement as the other writes on PostgreSQL). A refused
// exclusive acquire that finds no holder (the row was released or changed
// hands while it ran) tries once more, as does MySQL's up to three times. A transaction that the database rolls
// back for a deadlock or a serialization failure is run again, up to five
// times.
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
// holder's remaining TTL, unless the Backend wakes its waiters: it then
// polls only as a safety net.
//
// A PostgresBackend (NewPostgres) implements driver.Notifier: release
// notifies on the channel "dlock_release" in the same statement (or
// transaction), naming the head of the lock's fair queue when there is one
// to wake, and each dlock Client keeps one pooled connection listening, so
// waiters wake at once. The pool must allow at least one more connection
// than there are listening Clients on it (at least 2 for one Client):
// Listen refuses to take the last one, and waits at most a second for a
// free one, and the Client then polls. LISTEN does not work through
// pgbouncer in transaction pooling mode (the notifications never arrive and
// waiters only poll): connect directly or with session pooling, or use
// New(db, PostgreSQL).
//
// A SQLiteBackend (NewSQLite) implements it between the processes of the
// host: each listening Client binds a Unix datagram socket in the directory
// beside the file (its path with "-wake" added), and a committed release
// that may let a waiter in sends every socket there a datagram with the
// lock's name and the head of its fair queue, if any; a socket whose
// process died is removed by the first release that finds nobody bound to
// it. A datagram that a full socket buffer drops costs the waiter a poll.
// With New(db, SQLite), or where the directory cannot be used, waiters
// poll.
//
// A SQLiteBackend also paces the operations a wait hangs on (fair
// requests, releases, withdrawals, renewals, BreakIf) through a write gate:
// each holds an exclusive flock on a file in that directory while it runs,
// so that a process waiting for SQLite's write lock is woken when it frees
// rather than sleeping in SQLite's busy handler (1 to 100 ms a step). The
// gate is never needed for safety, which SQLite's own locking provides: a
// wait for it gives up after 200 ms (or half the call's time left) and the
// call goes on without it.
//
// On MySQL and MariaDB waiters poll. The server has one wake-up that
// outlives a statement, GET_LOCK: a holder would keep a user-level lock
// named after the lock on a connection of its own while it holds, and a
// waiter would block in GET_LOCK on another until RELEASE_LOCK. That ties
// a connection to every held lock and every waiting Client (the session
// state this package avoids), and costs four more statements per grant
// (GET_LOCK and RELEASE_LOCK on each side) where a polling claimer (below)
// costs one read per millisecond of the holder's critical section: it is
// not built.
//
// A plain Mutex (not Fair) lets an owner take a free lock before the
// waiters, until they starve: a waiter that has waited a millisecond (100
// ms where it is not woken by releases: a claimed handoff there costs the
// claimer's polling pace) claims the next grant
// (driver.AcquireRequest.Claim), which the row records in claim_token,
// claim_owner and claim_until. One claim per lock at a time: the plain
// acquire of every other owner respects it, the owner that just released
// included, which would otherwise take the lock straight back every time,
// and the claimer's next attempt takes the lock. The claimer is woken by the
// release where releases are announced, and elsewhere polls every
// millisecond while the lock is held; the other starving waiters try again
// every 5 ms, to claim next. On MySQL and SQLite a claiming request reads
// the row first and writes only to take a free lock or to record or renew
// its claim, so that these polls do not take SQLite's write lock. A claim
// lapses 500 ms after the claimer's last request, and a wait that ends
// removes it, so a claimer that died keeps a free lock from the others for
// half a second at most. A name nobody waits
// on for long is never claimed: an uncontended acquire costs what it did.
// Fair locks keep their queue table and ignore claims.
//
// # Errors
//
// "Held by another owner" and "not the holder" are answers, not errors.
// Errors come from the database (wrapped with the operation and the key) or
// from a key, token or owner over MaxKeyLength, MaxTokenLength or
// MaxOwnerLength, which the dlock client never sends.
package sqllock
