package testserver_test

import (
	"database/sql"
	"testing"

	"github.com/dlock-go/dlock/internal/test/testserver"
)

func TestMariaDBKeepsDataAcrossRestarts(t *testing.T) {
	srv := testserver.StartMariaDB(t)
	srv.CreateDatabase(t, "app")
	db := srv.DB(t, "app")
	db.SetMaxIdleConns(0) // every statement on a fresh connection: no stale ones after a restart
	mustExec(t, db, "CREATE TABLE counter (n INT NOT NULL)")
	mustExec(t, db, "INSERT INTO counter VALUES (1)")

	srv.Stop(t)
	srv.Stop(t) // idempotent
	if err := db.PingContext(t.Context()); err == nil {
		t.Fatal("ping answered after Stop")
	}
	srv.Start(t)
	mustExec(t, db, "UPDATE counter SET n = n + 1")

	srv.Kill(t)
	srv.Kill(t) // idempotent
	srv.Start(t)
	if n := queryInt(t, db, "SELECT n FROM counter"); n != 2 {
		t.Errorf("after a clean stop and a crash: n = %d, want 2", n)
	}
}

func TestMariaDBDatabasesAreSeparate(t *testing.T) {
	srv := testserver.StartMariaDB(t)
	srv.CreateDatabase(t, "a")
	srv.CreateDatabase(t, "b")
	mustExec(t, srv.DB(t, "a"), "CREATE TABLE t (n INT)")
	mustExec(t, srv.DB(t, "b"), "CREATE TABLE t (n INT)") // no clash
	if got := queryInt(t, srv.DB(t, ""), "SELECT COUNT(*) FROM information_schema.tables WHERE table_name = 't'"); got != 2 {
		t.Errorf("%d tables named t, want 2", got)
	}
}

func mustExec(t *testing.T, db *sql.DB, query string) {
	t.Helper()
	if _, err := db.ExecContext(t.Context(), query); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

func queryInt(t *testing.T, db *sql.DB, query string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(t.Context(), query).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}
