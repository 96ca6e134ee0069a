package testserver_test

import (
	"os"
	"syscall"
	"testing"

	"github.com/dlock-go/dlock/internal/test/testserver"
)

func TestPostgresKeepsDataAcrossRestarts(t *testing.T) {
	srv := testserver.StartPostgres(t)
	srv.CreateDatabase(t, "app")
	db := srv.DB(t, "app")
	db.SetMaxIdleConns(0) // every statement on a fresh connection: no stale ones after a restart
	mustExec(t, db, "CREATE TABLE counter (n int NOT NULL)")
	mustExec(t, db, "INSERT INTO counter VALUES (1)")

	srv.Stop(t)
	srv.Stop(t) // idempotent
	if err := db.PingContext(t.Context()); err == nil {
		t.Fatal("ping answered after Stop")
	}
	srv.Start(t)
	mustExec(t, db, "UPDATE counter SET n = n + 1")

	// A session open during the crash: its backend process must be gone
	// too, or the restarted server finds its shared memory still in use.
	session, err := srv.DB(t, "app").Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer session.Close()
	srv.Kill(t)
	srv.Kill(t) // idempotent
	srv.Start(t)
	if n := queryInt(t, db, "SELECT n FROM counter"); n != 2 {
		t.Errorf("after a clean stop and a crash: n = %d, want 2", n)
	}
}

func TestPostgresDataBelongsToTheServerUser(t *testing.T) {
	srv := testserver.StartPostgres(t)
	var dir string
	if err := srv.DB(t, "").QueryRowContext(t.Context(), "SHOW data_directory").Scan(&dir); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	owner := fi.Sys().(*syscall.Stat_t).Uid
	if want := os.Geteuid(); want != 0 && int(owner) != want {
		t.Errorf("data directory owned by uid %d, want %d (the test's user)", owner, want)
	} else if want == 0 && owner == 0 {
		t.Error("data directory owned by root: the server ran as root")
	}
}
