package testserver

import (
	"context"
	"database/sql"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// MariaDB is a mariadbd process owned by one test, with its own data
// directory. Its root user has no password and may connect from 127.0.0.1.
type MariaDB struct {
	port int
	dir  string
	proc process
}

// StartMariaDB initialises a fresh data directory in t.TempDir(), starts
// mariadbd on a free loopback port and stops it in t.Cleanup. One server can
// serve many cases: give each a database of its own with CreateDatabase.
// The server survives its own crash (Kill) without losing committed rows,
// but not a crash of the machine (the redo log is flushed once a second).
// It skips the test, or fails it under CI=true, when MariaDB is missing.
func StartMariaDB(t testing.TB) *MariaDB {
	t.Helper()
	bin := findBinary(t, "mariadbd", "/usr/sbin", "/usr/local/sbin")
	install := findBinary(t, "mariadb-install-db", "/usr/bin", "/usr/local/bin")
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	var asRoot []string
	if os.Geteuid() == 0 {
		asRoot = []string{"--user=root"} // mariadbd refuses root otherwise
	}
	// Temporary tables go to a directory of this server's own: in a shared
	// /tmp, the bootstraps of servers started at once can trip over each
	// other's files.
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	run(t, exec.Command(install, append([]string{
		"--no-defaults",
		"--auth-root-authentication-method=normal",
		"--skip-test-db",
		"--datadir=" + data,
		"--tmpdir=" + tmp,
	}, asRoot...)...))

	m := &MariaDB{port: freePort(t), dir: dir}
	m.proc = process{
		name: "mariadbd",
		log:  filepath.Join(dir, "mariadbd.log"),
		cmd: func() *exec.Cmd {
			return exec.Command(bin, append([]string{
				"--no-defaults",
				"--datadir=" + data,
				"--tmpdir=" + tmp,
				"--port=" + strconv.Itoa(m.port),
				"--bind-address=127.0.0.1",
				"--skip-networking=0",
				"--socket=" + filepath.Join(dir, "mariadbd.sock"),
				"--pid-file=" + filepath.Join(dir, "mariadbd.pid"),
				"--skip-name-resolve",
				"--skip-log-bin",
				"--performance-schema=OFF",
				"--innodb-buffer-pool-size=32M",
				"--innodb-flush-log-at-trx-commit=2",
			}, asRoot...)...)
		},
	}
	// Registered after TempDir, so it runs first: the process is gone
	// before its directory is removed.
	t.Cleanup(func() { m.Kill(t) })
	m.Start(t)
	return m
}

// Addr returns the server's address, "127.0.0.1:PORT".
func (m *MariaDB) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(m.port))
}

// DSN returns a github.com/go-sql-driver/mysql data source name for the
// database (none when database is "") as root, with a 2s connect timeout.
func (m *MariaDB) DSN(database string) string {
	cfg := mysql.NewConfig()
	cfg.User = "root"
	cfg.Net = "tcp"
	cfg.Addr = m.Addr()
	cfg.DBName = database
	cfg.Timeout = 2 * time.Second
	return cfg.FormatDSN()
}

// DB opens a pool on the database (none when database is ""), closed when
// the test ends.
func (m *MariaDB) DB(t testing.TB, database string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", m.DSN(database))
	if err != nil {
		t.Fatalf("open %s: %v", m.Addr(), err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// CreateDatabase creates an empty database called name, which must be a
// plain identifier.
func (m *MariaDB) CreateDatabase(t testing.TB, name string) {
	t.Helper()
	db := m.DB(t, "")
	if _, err := db.ExecContext(context.Background(), "CREATE DATABASE `"+name+"`"); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	_ = db.Close()
}

// Start starts the server on its port and data directory, as a restart after
// Stop or Kill, and waits until it accepts a connection. It fails the test
// when the server does not come up, with the end of the server's log.
func (m *MariaDB) Start(t testing.TB) {
	t.Helper()
	m.proc.start(t, func() error { return pingSQL("mysql", m.DSN("")) })
}

// Stop shuts the server down cleanly (SIGTERM) and waits for it to exit.
// It does nothing when the server is not running.
func (m *MariaDB) Stop(t testing.TB) {
	t.Helper()
	m.proc.stop(syscall.SIGTERM)
}

// Kill sends SIGKILL and waits for the server to exit, as a crash would.
// It does nothing when the server is not running.
func (m *MariaDB) Kill(t testing.TB) {
	t.Helper()
	m.proc.stop(syscall.SIGKILL)
}

// pingSQL opens a pool with the driver and checks that the server answers.
func pingSQL(driverName, dsn string) error {
	db, err := sql.Open(driverName, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return db.PingContext(ctx)
}

// Pause freezes the server with SIGSTOP: it keeps its sockets open and
// answers nothing, like a server stuck in a long pause, until Resume.
func (m *MariaDB) Pause(t testing.TB) {
	t.Helper()
	if err := m.proc.signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("pause mariadbd: %v", err)
	}
}

// Resume continues the server after Pause (SIGCONT).
func (m *MariaDB) Resume(t testing.TB) {
	t.Helper()
	if err := m.proc.signal(syscall.SIGCONT); err != nil {
		t.Fatalf("resume mariadbd: %v", err)
	}
}
