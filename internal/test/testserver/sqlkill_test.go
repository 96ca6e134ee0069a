package testserver_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/test/testserver"
)

// sqlServer is what the KillSessions test needs of a server.
type sqlServer struct {
	createDatabase func(t testing.TB, name string)
	db             func(t testing.TB, database string) *sql.DB
	killSessions   func(t testing.TB, database string) int
	sleep          string // a statement that sleeps 30 seconds
	sessions       string // a query that counts the client sessions on database app
}

func TestSQLKillSessions(t *testing.T) {
	servers := map[string]func(t *testing.T) sqlServer{
		"mariadb": func(t *testing.T) sqlServer {
			srv := testserver.StartMariaDB(t)
			return sqlServer{srv.CreateDatabase, srv.DB, srv.KillSessions, "SELECT SLEEP(30)",
				"SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = 'app'"}
		},
		"postgres": func(t *testing.T) sqlServer {
			srv := testserver.StartPostgres(t)
			return sqlServer{srv.CreateDatabase, srv.DB, srv.KillSessions, "SELECT pg_sleep(30)",
				"SELECT COUNT(*) FROM pg_stat_activity WHERE datname = 'app' AND backend_type = 'client backend'"}
		},
	}
	for _, name := range []string{"mariadb", "postgres"} {
		t.Run(name, func(t *testing.T) {
			srv := servers[name](t)
			testKillSessions(t, srv)
		})
	}
}

func testKillSessions(t *testing.T, srv sqlServer) {
	ctx := t.Context()
	srv.createDatabase(t, "app")
	srv.createDatabase(t, "other")
	app := srv.db(t, "app")
	other := srv.db(t, "other")

	// Three idle sessions on app, one busy on app, one idle on other.
	var idle []*sql.Conn
	for range 3 {
		c, err := app.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := c.PingContext(ctx); err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	busy, err := app.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	sleeping := make(chan error, 1)
	started := time.Now()
	go func() {
		_, err := busy.ExecContext(ctx, srv.sleep)
		sleeping <- err
	}()
	bystander, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer bystander.Close()
	if err := bystander.PingContext(ctx); err != nil {
		t.Fatal(err)
	}
	// The sleep must have reached the server before the kill, or the kill
	// misses it and it only fails later, on its dead connection; either
	// way it fails, but the count would be 3 or 4. Wait until the server
	// lists four sessions on app.
	waitSessions(t, srv, 4)

	if n := srv.killSessions(t, "app"); n != 4 {
		t.Errorf("KillSessions(app) = %d, want 4 (three idle, one busy)", n)
	}
	select {
	case err := <-sleeping:
		if err == nil {
			t.Error("the sleeping statement succeeded after its session was killed")
		}
		t.Logf("sleeping statement ended after %v: %v", time.Since(started).Round(time.Millisecond), err)
	case <-time.After(15 * time.Second):
		t.Fatal("the sleeping statement still runs 15s after its session was killed")
	}
	for i, c := range idle {
		if err := c.PingContext(ctx); err == nil {
			t.Errorf("idle session %d still answers after KillSessions", i)
		}
	}
	if err := bystander.PingContext(ctx); err != nil {
		t.Errorf("a session on another database was ended: %v", err)
	}
	// The pool recovers: new connections work.
	if err := app.PingContext(ctx); err != nil {
		t.Errorf("new connection on app after KillSessions: %v", err)
	}
	// Nothing left but the pool's new connection, which is idle; a second
	// call ends it.
	if n := srv.killSessions(t, "app"); n > 1 {
		t.Errorf("second KillSessions(app) = %d, want at most 1", n)
	}
	if n := srv.killSessions(t, "nothing-here"); n != 0 {
		t.Errorf("KillSessions on a database nobody uses = %d, want 0", n)
	}
}

// waitSessions waits until the server lists want client sessions on
// database app (the session that asks is on no database).
func waitSessions(t *testing.T, srv sqlServer, want int) {
	t.Helper()
	db := srv.db(t, "")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for {
		var n int
		if err := db.QueryRowContext(ctx, srv.sessions).Scan(&n); err != nil {
			t.Fatalf("count sessions: %v", err)
		}
		if n == want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d sessions on app, want %d", n, want)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
