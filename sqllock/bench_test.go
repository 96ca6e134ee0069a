package sqllock_test

// Benchmarks of an uncontended Lock+Unlock cycle per engine, each next to a
// raw baseline on the same database in the same run:
//
//	go test -run XXX -bench . -benchtime 2s ./sqllock/
//
//	dlock    Mutex.Lock + Lease.Unlock through a dlock Client (renewal
//	         scheduling, lease bookkeeping, the backend's statements)
//	backend  Backend.Acquire + Backend.Release, the statements alone
//	raw      an INSERT and a DELETE of a row in a table of the same shape:
//	         the least any SQL lock can cost
//
// Every call gets a cancellable context, as in an application (drivers do
// extra work to watch one). "mariadb" uses the driver's defaults, where a statement with parameters
// is prepared, executed and closed (two round trips); "mariadb-interpolate"
// sets interpolateParams=true, one round trip per statement.

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/sqllock"
)

// benchDB is one engine's database for the benchmarks.
type benchDB struct {
	dialect sqllock.Dialect
	open    func(b *testing.B) *sql.DB
}

func BenchmarkCycle(b *testing.B) {
	engines := []struct {
		name  string
		start func(b *testing.B) benchDB
	}{
		{"sqlite", func(b *testing.B) benchDB {
			path := filepath.Join(b.TempDir(), "bench.db")
			return benchDB{sqllock.SQLite, func(b *testing.B) *sql.DB {
				db := openBench(b, "sqlite", sqliteDSN(path))
				db.SetMaxOpenConns(1)
				return db
			}}
		}},
		{"mariadb", func(b *testing.B) benchDB {
			srv := testserver.StartMariaDB(b)
			srv.CreateDatabase(b, "bench")
			return benchDB{sqllock.MySQL, func(b *testing.B) *sql.DB { return openBench(b, "mysql", srv.DSN("bench")) }}
		}},
		{"mariadb-interpolate", func(b *testing.B) benchDB {
			srv := testserver.StartMariaDB(b)
			srv.CreateDatabase(b, "bench")
			dsn := srv.DSN("bench") + "&interpolateParams=true"
			return benchDB{sqllock.MySQL, func(b *testing.B) *sql.DB { return openBench(b, "mysql", dsn) }}
		}},
		{"postgres", func(b *testing.B) benchDB {
			srv := testserver.StartPostgres(b)
			srv.CreateDatabase(b, "bench")
			return benchDB{sqllock.PostgreSQL, func(b *testing.B) *sql.DB { return openBench(b, "pgx", srv.URL("bench")) }}
		}},
	}
	for _, e := range engines {
		b.Run(e.name, func(b *testing.B) {
			db := e.start(b)
			b.Run("dlock", func(b *testing.B) { benchDlock(b, db) })
			b.Run("backend", func(b *testing.B) { benchBackend(b, db) })
			b.Run("raw", func(b *testing.B) { benchRaw(b, db) })
		})
	}
}

func openBench(b *testing.B, driverName, dsn string) *sql.DB {
	db, err := sql.Open(driverName, dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = db.Close() })
	return db
}

func benchDlock(b *testing.B, db benchDB) {
	c := dlock.New(sqllock.New(db.open(b), db.dialect))
	defer c.Close()
	ctx := benchContext(b)
	m := c.Mutex("bench/dlock")
	warm(b, func() error {
		l, err := m.Lock(ctx)
		if err == nil {
			err = l.Unlock(ctx)
		}
		return err
	})
	b.ReportAllocs()
	for b.Loop() {
		l, err := m.Lock(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func benchBackend(b *testing.B, db benchDB) {
	be := sqllock.New(db.open(b), db.dialect)
	ctx := benchContext(b)
	req := driver.AcquireRequest{Key: "bench/backend", Token: newToken(), Owner: "bench", TTL: 10 * time.Second}
	cycle := func() error {
		res, err := be.Acquire(ctx, req)
		if err == nil && !res.Acquired {
			b.Fatalf("Acquire = %+v", res)
		}
		if err == nil {
			_, err = be.Release(ctx, req.Key, req.Token)
		}
		return err
	}
	warm(b, cycle)
	b.ReportAllocs()
	for b.Loop() {
		if err := cycle(); err != nil {
			b.Fatal(err)
		}
	}
}

// benchRaw inserts and deletes one row per cycle, in a table made with the
// lock table's DDL under another name, with the same clock expressions, and
// the statements handled as the backend handles its own: prepared once on
// SQLite, sent as they are to MySQL and PostgreSQL (where pgx caches them).
func benchRaw(b *testing.B, db benchDB) {
	pool := db.open(b)
	ctx := benchContext(b)
	ddl, err := sqllock.DDL(db.dialect, "raw_locks")
	if err != nil {
		b.Fatal(err)
	}
	main, _, _ := strings.Cut(ddl, ";\n\n") // the lock table; not its side tables
	if _, err := pool.ExecContext(ctx, main); err != nil {
		b.Fatal(err)
	}
	insertSQL, deleteSQL := rawStatements(db.dialect)
	exec := func(query string) func(args ...any) error {
		if db.dialect != sqllock.SQLite {
			return func(args ...any) error { _, err := pool.ExecContext(ctx, query, args...); return err }
		}
		st, err := pool.PrepareContext(ctx, query)
		if err != nil {
			b.Fatal(err)
		}
		return func(args ...any) error { _, err := st.ExecContext(ctx, args...); return err }
	}
	insert, del := exec(insertSQL), exec(deleteSQL)
	token := newToken()
	cycle := func() error {
		if err := insert("bench/raw", token, "bench", int64(10*time.Second/time.Microsecond)); err != nil {
			return err
		}
		return del("bench/raw", token)
	}
	warm(b, cycle)
	b.ReportAllocs()
	for b.Loop() {
		if err := cycle(); err != nil {
			b.Fatal(err)
		}
	}
}

// rawStatements returns the baseline's INSERT (name, token, owner, TTL in
// µs) and DELETE (name, token) for a dialect.
func rawStatements(d sqllock.Dialect) (insert, del string) {
	switch d {
	case sqllock.MySQL:
		return `INSERT INTO raw_locks (name, token, owner, fence, holds, acquired_at, expires_at)
VALUES (?, ?, ?, 1, 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)`,
			`DELETE FROM raw_locks WHERE name = ? AND token = ?`
	case sqllock.PostgreSQL:
		return `INSERT INTO raw_locks (name, token, owner, fence, holds, acquired_at, expires_at)
VALUES ($1, $2, $3, 1, 1, now(), now() + $4::bigint * interval '1 microsecond')`,
			`DELETE FROM raw_locks WHERE name = $1 AND token = $2`
	}
	now := `CAST(round(unixepoch('subsec') * 1000) AS INTEGER)`
	return strings.ReplaceAll(`INSERT INTO raw_locks (name, token, owner, fence, holds, acquired_at, expires_at)
VALUES (?1, ?2, ?3, 1, 1, NOW, NOW + ?4 / 1000)`, "NOW", now),
		`DELETE FROM raw_locks WHERE name = ?1 AND token = ?2`
}

// benchContext returns a cancellable context, cancelled when b ends.
func benchContext(b *testing.B) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	return ctx
}

// warm runs a few cycles before the timer starts: table creation, the first
// connections and statement caches are not what is measured.
func warm(b *testing.B, cycle func() error) {
	b.Helper()
	for range 20 {
		if err := cycle(); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
}
