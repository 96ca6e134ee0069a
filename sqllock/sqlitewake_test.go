package sqllock_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/sqllock"
)

// wakeChildEnv, when set, makes the test binary the waiting process of
// TestSQLiteWakeAcrossProcesses; its value is the database file's path.
const wakeChildEnv = "SQLLOCK_TEST_WAKE_CHILD"

// TestSQLiteWakeAcrossProcesses checks that a release in one process wakes
// a waiter in another through the sockets beside the file: the waiter
// polls only once a minute and the holder's lease has a minute to run, so
// without the wake-up it would wait about a minute.
func TestSQLiteWakeAcrossProcesses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "locks.db")
	db := openSQLite(t, path)
	c := dlock.New(sqllock.NewSQLite(db))
	defer c.Close()
	l, err := c.Mutex("woken", dlock.WithTTL(time.Minute)).Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), wakeChildEnv+"="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	next := func(what string, limit time.Duration) string {
		t.Helper()
		select {
		case s, ok := <-lines:
			if !ok {
				t.Fatalf("the waiting process ended before %s; it said: %s", what, stderr.String())
			}
			return s
		case <-time.After(limit):
			t.Fatalf("the waiting process did not report %s within %v; it said: %s", what, limit, stderr.String())
		}
		return ""
	}
	if s := next("its first refusal", 30*time.Second); s != "busy" {
		t.Fatalf("the waiting process said %q, want busy", s)
	}
	time.Sleep(time.Second) // the waiter is asleep by now
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if s := next("its grant", 30*time.Second); !strings.HasPrefix(s, "got ") || s <= "got "+fmt.Sprint(l.Fence()-1) {
		t.Fatalf("the waiting process said %q, want its grant after fence %d", s, l.Fence())
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the waiting process: %v; it said: %s", err, stderr.String())
	}
}

// runWakeChild waits for the lock that TestSQLiteWakeAcrossProcesses
// holds, polling once a minute, and reports its first refusal and its
// grant on stdout.
func runWakeChild() int {
	db, err := sql.Open("sqlite", sqliteDSN(os.Getenv(wakeChildEnv)))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	c := dlock.New(sqllock.NewSQLite(db))
	defer c.Close()
	busy := make(chan struct{}, 1)
	m := c.Mutex("woken",
		// A fixed owner ID: the waiter never claims (a claimer would try
		// again every claimTTL/3 to keep its claim), so only a wake-up
		// brings it in before its minute is up.
		dlock.WithOwnerID("wake-child"),
		dlock.WithRetry(dlock.ExponentialBackoff(time.Minute, time.Minute)),
		dlock.WithOnBusy(func(*dlock.NotObtainedError) {
			select {
			case busy <- struct{}{}:
				fmt.Println("busy")
			default:
			}
		}))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := m.Lock(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("got", l.Fence())
	if err := l.Unlock(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// TestSQLiteWakeRemovesStaleSockets checks that a release removes the
// socket file of a listener that is gone without removing it (a process
// that died), and that a closed listener removes its own.
func TestSQLiteWakeRemovesStaleSockets(t *testing.T) {
	path := filepath.Join(t.TempDir(), "locks.db")
	b := sqllock.NewSQLite(openSQLite(t, path))
	c := dlock.New(b)
	defer c.Close()
	dir := path + "-wake"
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, "1-dead.sock")
	bindAndAbandon(t, stale)
	if _, err := os.Stat(stale); err != nil {
		t.Fatalf("the abandoned socket file: %v", err)
	}
	l, err := c.Mutex("m").Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("the socket file nobody is bound to is still there after a release (%v)", err)
	}

	ln, err := b.Listen(t.Context(), func(string, string) {})
	if err != nil {
		t.Fatal(err)
	}
	if n := socketFiles(t, dir); n != 1 {
		t.Errorf("%d socket files with one listener, want 1", n)
	}
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	if n := socketFiles(t, dir); n != 0 {
		t.Errorf("%d socket files after the listener closed, want 0", n)
	}
}

// TestSQLiteWakeInMemory checks that a database without a file refuses to
// listen, so that the client polls.
func TestSQLiteWakeInMemory(t *testing.T) {
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	if ln, err := sqllock.NewSQLite(db).Listen(t.Context(), func(string, string) {}); err == nil {
		_ = ln.Close()
		t.Fatal("Listen on an in-memory database succeeded")
	}
}

func openSQLite(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", sqliteDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func socketFiles(t *testing.T, dir string) int {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".sock") {
			n++
		}
	}
	return n
}
