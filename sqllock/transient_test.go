package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/sqllock"
)

// The errors that may heal are marked with driver.Transient, the others are
// not: each checked with the error a real server gives.

// wantTransient checks that err is an error and is (or is not) marked
// transient.
func wantTransient(t *testing.T, what string, err error, want bool) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error", what)
		return
	}
	if got := driver.IsTransient(err); got != want {
		t.Errorf("%s: IsTransient(%v) = %v, want %v", what, err, got, want)
	}
}

// acquireErr sends one plain acquire of a new token on key.
func acquireErr(ctx context.Context, b driver.Backend, key string) error {
	_, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Token: newToken(), Owner: "o", TTL: 10 * time.Second})
	return err
}

// deadlock runs two transactions on db that update rows 1 and 2 of table in
// opposite orders and returns the error of the one the database chose as
// the victim. q turns $n placeholders into the dialect's.
func deadlock(t *testing.T, db *sql.DB, table string, q func(string) string) error {
	t.Helper()
	ctx := t.Context()
	for _, s := range []string{"CREATE TABLE " + table + " (id INT PRIMARY KEY, v INT)", "INSERT INTO " + table + " VALUES (1, 0), (2, 0)"} {
		if _, err := db.ExecContext(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	upd := q("UPDATE " + table + " SET v = v + 1 WHERE id = $1")
	tx1, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx1.Rollback() }()
	tx2, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx2.Rollback() }()
	if _, err := tx1.ExecContext(ctx, upd, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := tx2.ExecContext(ctx, upd, 2); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		_, err := tx1.ExecContext(ctx, upd, 2)
		if err != nil {
			_ = tx1.Rollback()
		}
		errs <- err
	}()
	go func() {
		defer wg.Done()
		time.Sleep(100 * time.Millisecond) // tx1 waits for row 2 first
		_, err := tx2.ExecContext(ctx, upd, 1)
		if err != nil {
			_ = tx2.Rollback()
		}
		errs <- err
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	t.Fatal("no transaction was chosen as a deadlock's victim")
	return nil
}

func TestTransientErrorsMariaDB(t *testing.T) {
	srv := testserver.StartMariaDB(t)
	srv.CreateDatabase(t, "app")
	ctx := t.Context()

	t.Run("wrong credentials", func(t *testing.T) {
		cfg, _ := mysql.ParseDSN(srv.DSN("app"))
		cfg.User, cfg.Passwd = "nobody", "wrong"
		db, err := sql.Open("mysql", cfg.FormatDSN())
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		wantTransient(t, "acquire as an unknown user (1045)", acquireErr(ctx, sqllock.New(db, sqllock.MySQL), "k"), false)
	})
	t.Run("missing table", func(t *testing.T) {
		b := sqllock.New(srv.DB(t, "app"), sqllock.MySQL, sqllock.WithoutCreateTable(), sqllock.WithTable("absent"))
		wantTransient(t, "acquire without the table (1146)", acquireErr(ctx, b, "k"), false)
	})
	t.Run("invalid request", func(t *testing.T) {
		b := sqllock.New(srv.DB(t, "app"), sqllock.MySQL)
		wantTransient(t, "acquire of a key too long", acquireErr(ctx, b, strings.Repeat("k", 300)), false)
	})
	t.Run("cancelled caller", func(t *testing.T) {
		b := sqllock.New(srv.DB(t, "app"), sqllock.MySQL)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		wantTransient(t, "acquire with a cancelled context", acquireErr(cctx, b, "k"), false)
	})
	t.Run("deadlock", func(t *testing.T) {
		err := deadlock(t, srv.DB(t, "app"), "dl", func(s string) string { return strings.ReplaceAll(s, "$1", "?") })
		if !strings.Contains(err.Error(), "1213") {
			t.Fatalf("deadlock victim's error %v, want 1213", err)
		}
		if !sqllock.IsTransientError(err) {
			t.Errorf("deadlock (1213) %v: not transient", err)
		}
	})
	t.Run("lock wait timeout", func(t *testing.T) {
		db := srv.DB(t, "app")
		if _, err := db.ExecContext(ctx, "CREATE TABLE lw (id INT PRIMARY KEY)"); err != nil {
			t.Fatal(err)
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback() }()
		if _, err := tx.ExecContext(ctx, "INSERT INTO lw VALUES (1)"); err != nil {
			t.Fatal(err)
		}
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = 1"); err != nil {
			t.Fatal(err)
		}
		_, err = conn.ExecContext(ctx, "INSERT INTO lw VALUES (1)")
		if err == nil || !strings.Contains(err.Error(), "1205") {
			t.Fatalf("insert of a locked key: %v, want 1205", err)
		}
		if !sqllock.IsTransientError(err) {
			t.Errorf("lock wait timeout (1205) %v: not transient", err)
		}
	})
	t.Run("paused server", func(t *testing.T) {
		// A read timeout of the driver: one call that timed out while
		// the caller's context had time left.
		cfg, _ := mysql.ParseDSN(srv.DSN("app"))
		cfg.ReadTimeout, cfg.WriteTimeout = 500*time.Millisecond, 500*time.Millisecond
		db, err := sql.Open("mysql", cfg.FormatDSN())
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		b := sqllock.New(db, sqllock.MySQL)
		if err := acquireErr(ctx, b, "warm"); err != nil {
			t.Fatal(err)
		}
		srv.Pause(t)
		defer srv.Resume(t)
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		wantTransient(t, "acquire on a paused server", acquireErr(cctx, b, "k"), true)
	})
	t.Run("killed server", func(t *testing.T) {
		b := sqllock.New(srv.DB(t, "app"), sqllock.MySQL)
		if err := acquireErr(ctx, b, "warm"); err != nil {
			t.Fatal(err)
		}
		srv.Kill(t)
		defer srv.Start(t)
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		wantTransient(t, "acquire on a killed server", acquireErr(cctx, b, "k"), true)
	})
}

func TestTransientErrorsPostgres(t *testing.T) {
	srv := testserver.StartPostgres(t)
	srv.CreateDatabase(t, "app")
	srv.AddPasswordUser(t, "app", "secret")
	ctx := t.Context()

	t.Run("wrong password", func(t *testing.T) {
		db, err := sql.Open("pgx", "postgres://app:wrong@"+srv.Addr()+"/app?sslmode=disable&connect_timeout=2")
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		wantTransient(t, "acquire with a wrong password (28P01)", acquireErr(ctx, sqllock.New(db, sqllock.PostgreSQL), "k"), false)
	})
	t.Run("missing table", func(t *testing.T) {
		b := sqllock.New(srv.DB(t, "app"), sqllock.PostgreSQL, sqllock.WithoutCreateTable(), sqllock.WithTable("absent"))
		wantTransient(t, "acquire without the table (42P01)", acquireErr(ctx, b, "k"), false)
	})
	t.Run("permission denied", func(t *testing.T) {
		// A table of the superuser's that app was granted nothing on.
		admin := srv.DB(t, "app")
		if _, err := admin.ExecContext(ctx, `CREATE TABLE locked_out (name text PRIMARY KEY)`); err != nil {
			t.Fatal(err)
		}
		db, err := sql.Open("pgx", "postgres://app:secret@"+srv.Addr()+"/app?sslmode=disable&connect_timeout=2")
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		b := sqllock.New(db, sqllock.PostgreSQL, sqllock.WithoutCreateTable(), sqllock.WithTable("locked_out"))
		wantTransient(t, "acquire on a table without rights (42501)", acquireErr(ctx, b, "k"), false)
	})
	t.Run("deadlock", func(t *testing.T) {
		err := deadlock(t, srv.DB(t, "app"), "dl", func(s string) string { return s })
		if !strings.Contains(err.Error(), "40P01") {
			t.Fatalf("deadlock victim's error %v, want 40P01", err)
		}
		if !sqllock.IsTransientError(err) {
			t.Errorf("deadlock (40P01) %v: not transient", err)
		}
	})
	t.Run("terminated sessions", func(t *testing.T) {
		db := srv.DB(t, "app")
		b := sqllock.New(db, sqllock.PostgreSQL)
		if err := acquireErr(ctx, b, "warm"); err != nil {
			t.Fatal(err)
		}
		srv.KillSessions(t, "app")
		// The pooled connection fails on its next use (57P01 or the
		// closed connection behind it).
		wantTransient(t, "acquire on a terminated session", acquireErr(ctx, b, "k"), true)
	})
	t.Run("killed server", func(t *testing.T) {
		b := sqllock.New(srv.DB(t, "app"), sqllock.PostgreSQL)
		if err := acquireErr(ctx, b, "warm"); err != nil {
			t.Fatal(err)
		}
		srv.Kill(t)
		defer srv.Start(t)
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		wantTransient(t, "acquire on a killed server", acquireErr(cctx, b, "k"), true)
	})
}

func TestTransientErrorsSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "locks.db")
	ctx := t.Context()
	holder, err := sql.Open("sqlite", sqliteDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if _, err := holder.ExecContext(ctx, "CREATE TABLE t (id INTEGER PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	conn, err := holder.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}

	other, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(100)")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	_, err = other.ExecContext(ctx, "INSERT INTO t VALUES (1)")
	if err == nil || !strings.Contains(err.Error(), "SQLITE_BUSY") {
		t.Fatalf("write beside a held write transaction: %v, want SQLITE_BUSY", err)
	}
	if !sqllock.IsTransientError(err) {
		t.Errorf("SQLITE_BUSY after the busy timeout, %v: not transient", err)
	}
	if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}

	// A caller that gave up while the file was locked: not transient.
	b := sqllock.New(other, sqllock.SQLite)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := acquireErr(cctx, b, "k"); err == nil || driver.IsTransient(err) || !errors.Is(err, context.Canceled) {
		t.Errorf("acquire with a cancelled context: %v, want an unmarked error with context.Canceled", err)
	}
}

// A host name that does not resolve is a configuration error, not one that
// heals: a waiting Lock reports it at once instead of retrying it until its
// wait ends. The resolver's answer is injected (a test machine's DNS may
// not answer at all), through each driver's own dial hook.
func TestUnknownHostIsNotTransient(t *testing.T) {
	notFound := &net.DNSError{Err: "no such host", Name: "db.example", IsNotFound: true}
	mysql.RegisterDialContext("nodns", func(ctx context.Context, addr string) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: notFound}
	})
	my, err := sql.Open("mysql", "u:p@nodns(db.example:3306)/db")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgx.ParseConfig("postgres://u:p@db.example:5432/db")
	if err != nil {
		t.Fatal(err)
	}
	cfg.LookupFunc = func(context.Context, string) ([]string, error) { return nil, notFound }
	pg := stdlib.OpenDB(*cfg)
	for name, db := range map[string]*sql.DB{"mysql": my, "pgx": pg} {
		err := db.PingContext(t.Context())
		db.Close()
		if err == nil {
			t.Fatalf("%s: ping of an unknown host succeeded", name)
		}
		if sqllock.IsTransientError(err) {
			t.Errorf("%s: an unknown host (%v) is transient", name, err)
		}
	}
}
