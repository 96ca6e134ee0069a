package testserver

import (
	"context"
	"database/sql"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver used by DB
)

// pgBinDirs is where Debian's postgresql packages put the server programs.
const pgBinDirs = "/usr/lib/postgresql/*/bin"

// Postgres is a PostgreSQL server process owned by one test, with its own
// data directory. Its superuser "postgres" needs no password.
type Postgres struct {
	port int
	data string // the data directory
	proc process
}

// StartPostgres initialises a fresh cluster in a temporary directory, starts
// postgres on a free loopback port and stops it in t.Cleanup. One server can
// serve many cases: give each a database of its own with CreateDatabase.
// fsync is off: the server survives its own crash (Kill) without losing
// committed rows, but not a crash of the machine.
//
// PostgreSQL refuses to run as root, so when the test runs as root the
// server runs as the "postgres" system user (or "nobody" when there is none)
// in a directory handed over to that user. It skips the test, or fails it
// under CI=true, when PostgreSQL is missing.
func StartPostgres(t testing.TB) *Postgres {
	t.Helper()
	bin := findBinary(t, "postgres", pgBinDirs)
	initdb := filepath.Join(filepath.Dir(bin), "initdb")
	if _, err := os.Stat(initdb); err != nil {
		initdb = findBinary(t, "initdb", pgBinDirs)
	}

	// Not t.TempDir: its parents are private to root, and the server's user
	// must reach the directory. The path stays short for the socket, too.
	dir, err := os.MkdirTemp("", "dlock-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	cred := serverCredential(t, dir)
	data := filepath.Join(dir, "data")
	setup := exec.Command(initdb, "-D", data, "-A", "trust", "-U", "postgres",
		"--no-sync", "--encoding=UTF8", "--locale=C")
	setup.Dir = dir
	setup.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	run(t, setup)

	p := &Postgres{port: freePort(t), data: data}
	p.proc = process{
		name: "postgres",
		log:  filepath.Join(dir, "postgres.log"),
		cmd: func() *exec.Cmd {
			cmd := exec.Command(bin,
				"-D", data,
				"-p", strconv.Itoa(p.port),
				"-k", dir,
				"-c", "listen_addresses=127.0.0.1",
				"-c", "fsync=off",
				"-c", "shared_buffers=32MB",
				"-c", "max_connections=200",
			)
			cmd.Dir = dir
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
			return cmd
		},
	}
	// Runs before the RemoveAll above. A clean stop, not Kill: the server's
	// children are its own to reap, and killed ones would stay zombies
	// wherever PID 1 does not reap orphans.
	t.Cleanup(func() { p.Stop(t) })
	p.Start(t)
	return p
}

// serverCredential returns the user to run the server as, and hands dir over
// to it; nil means the current user.
func serverCredential(t testing.TB, dir string) *syscall.Credential {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		u, err = user.Lookup("nobody")
	}
	if err != nil {
		t.Fatalf("no user to run postgres as (it refuses root): %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatalf("hand %s to user %s: %v", dir, u.Username, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}
}

// Addr returns the server's address, "127.0.0.1:PORT".
func (p *Postgres) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port))
}

// URL returns a connection URL for the database ("postgres" when database
// is ""), as user postgres, with a 2s connect timeout.
func (p *Postgres) URL(database string) string {
	if database == "" {
		database = "postgres"
	}
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User("postgres"),
		Host:     p.Addr(),
		Path:     "/" + database,
		RawQuery: "sslmode=disable&connect_timeout=2",
	}
	return u.String()
}

// DB opens a pool on the database through github.com/jackc/pgx/v5/stdlib,
// closed when the test ends.
func (p *Postgres) DB(t testing.TB, database string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", p.URL(database))
	if err != nil {
		t.Fatalf("open %s: %v", p.Addr(), err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// CreateDatabase creates an empty database called name, which must be a
// plain identifier.
func (p *Postgres) CreateDatabase(t testing.TB, name string) {
	t.Helper()
	db := p.DB(t, "")
	if _, err := db.ExecContext(context.Background(), `CREATE DATABASE "`+name+`"`); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	_ = db.Close()
}

// AddPasswordUser creates a login role user (a plain identifier) with
// password, which, unlike the superuser, must give it over TCP
// (scram-sha-256), and reloads the server's configuration.
func (p *Postgres) AddPasswordUser(t testing.TB, user, password string) {
	t.Helper()
	db := p.DB(t, "")
	if _, err := db.ExecContext(context.Background(), `CREATE ROLE "`+user+`" LOGIN PASSWORD '`+strings.ReplaceAll(password, "'", "''")+`'`); err != nil {
		t.Fatalf("create role %s: %v", user, err)
	}
	hba := filepath.Join(p.data, "pg_hba.conf")
	old, err := os.ReadFile(hba)
	if err != nil {
		t.Fatal(err)
	}
	line := "host all " + user + " 127.0.0.1/32 scram-sha-256\n"
	if err := os.WriteFile(hba, append([]byte(line), old...), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(context.Background(), "SELECT pg_reload_conf()"); err != nil {
		t.Fatalf("reload the configuration: %v", err)
	}
	// The reload is asynchronous: wait until a wrong password is refused.
	u := url.URL{Scheme: "postgres", User: url.UserPassword(user, password+"-wrong"), Host: p.Addr(), Path: "/postgres", RawQuery: "sslmode=disable&connect_timeout=2"}
	for deadline := time.Now().Add(10 * time.Second); pingSQL("pgx", u.String()) == nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("user %s still logs in with a wrong password 10s after the reload", user)
		}
	}
	_ = db.Close()
}

// Start starts the server on its port and data directory, as a restart after
// Stop or Kill, and waits until it accepts a connection. It fails the test
// when the server does not come up, with the end of the server's log.
func (p *Postgres) Start(t testing.TB) {
	t.Helper()
	p.proc.start(t, func() error { return pingSQL("pgx", p.URL("")) })
}

// Stop shuts the server down with a fast shutdown (SIGINT: sessions are
// ended, not waited for) and waits for it to exit. It does nothing when the
// server is not running.
func (p *Postgres) Stop(t testing.TB) {
	t.Helper()
	p.proc.stop(syscall.SIGINT)
}

// Kill sends SIGKILL to the server and its backends and waits for them to
// exit, as a crash would. It does nothing when the server is not running.
// The backends are the server's children, not the test's: where PID 1 does
// not reap orphans they stay behind as zombies (which hold nothing).
func (p *Postgres) Kill(t testing.TB) {
	t.Helper()
	p.proc.stop(syscall.SIGKILL)
}
