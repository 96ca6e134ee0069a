package sqllock_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/sqllock"
)

// childEnv, when set, makes the test binary a child of
// TestSQLiteAcrossProcesses: "DB-PATH|LOG-PATH|ID|ROUNDS|DSN|START", where
// DSN is "recipe" or "wal" (sqliteDSN or sqliteWALDSN) and START the Unix
// time in nanoseconds at which to open the file.
const childEnv = "SQLLOCK_TEST_CHILD"

// TestSQLiteAcrossProcesses runs several processes that lock one name in one
// SQLite file and log, with O_APPEND to a shared file, a line when they
// enter the critical section and one when they leave it. In file order the
// lines must pair up (no one enters before the last one left) and the fences
// must grow.
func TestSQLiteAcrossProcesses(t *testing.T) {
	runProcesses(t, filepath.Join(t.TempDir(), "locks.db"), 4, 25, "recipe")
}

// TestSQLiteFirstUseAcrossProcesses has many processes open a fresh file at
// the same moment, so that they meet while the file is switched to WAL and
// the table created, where SQLite answers SQLITE_BUSY without waiting for
// busy_timeout. It does so with the DSN that sets journal_mode on every
// connection too, where the busy file fails the connection itself.
func TestSQLiteFirstUseAcrossProcesses(t *testing.T) {
	for _, dsn := range []string{"recipe", "wal"} {
		t.Run(dsn, func(t *testing.T) {
			for i := range 2 {
				runProcesses(t, filepath.Join(t.TempDir(), fmt.Sprintf("locks%d.db", i)), 10, 2, dsn)
			}
		})
	}
}

// runProcesses starts children processes at once on the file at dbPath, each
// of which locks one name rounds times, and checks their log.
func runProcesses(t *testing.T, dbPath string, children, rounds int, dsn string) {
	t.Helper()
	logPath := dbPath + ".log"
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now().Add(300 * time.Millisecond)
	cmds := make([]*exec.Cmd, children)
	outs := make([]*strings.Builder, children)
	for i := range cmds {
		cmd := exec.Command(exe)
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s|%s|%d|%d|%s|%d",
			childEnv, dbPath, logPath, i, rounds, dsn, start.UnixNano()))
		outs[i] = &strings.Builder{}
		cmd.Stdout, cmd.Stderr = outs[i], outs[i]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[i] = cmd
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("child %d: %v; it said: %s", i, err, strings.TrimSpace(outs[i].String()))
		}
	}

	f, err := os.Open(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var inside string // the child in the critical section, or ""
	var lastFence uint64
	lines := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines++
		var what, who string
		var fence uint64
		if _, err := fmt.Sscan(sc.Text(), &what, &who, &fence); err != nil {
			t.Fatalf("line %d %q: %v", lines, sc.Text(), err)
		}
		switch {
		case what == "enter" && inside == "":
			if fence <= lastFence {
				t.Errorf("line %d: fence %d after %d", lines, fence, lastFence)
			}
			inside, lastFence = who, fence
		case what == "exit" && inside == who:
			inside = ""
		default:
			t.Fatalf("line %d: %q while %q was inside: two holders at once", lines, sc.Text(), inside)
		}
	}
	if want := 2 * children * rounds; lines != want {
		t.Errorf("%d lines, want %d", lines, want)
	}
}

// runChild is a child process's life: lock, log, unlock, rounds times.
func runChild() int {
	parts := strings.Split(os.Getenv(childEnv), "|")
	if len(parts) != 6 {
		fmt.Fprintln(os.Stderr, "bad", childEnv)
		return 2
	}
	dbPath, logPath, id := parts[0], parts[1], parts[2]
	rounds, _ := strconv.Atoi(parts[3])
	dsn := sqliteDSN(dbPath)
	if parts[4] == "wal" {
		dsn = sqliteWALDSN(dbPath)
	}
	start, _ := strconv.ParseInt(parts[5], 10, 64)
	time.Sleep(time.Until(time.Unix(0, start)))
	if err := childRounds(dsn, logPath, id, rounds); err != nil {
		fmt.Fprintf(os.Stderr, "child %s: %v\n", id, err)
		return 1
	}
	return 0
}

func childRounds(dsn, logPath, id string, rounds int) error {
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close()

	c := dlock.New(sqllock.New(db, sqllock.SQLite))
	defer c.Close()
	m := c.Mutex("shared", dlock.WithRetry(dlock.ExponentialBackoff(time.Millisecond, 20*time.Millisecond)))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for range rounds {
		l, err := m.Lock(ctx)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(logFile, "enter %s %d\n", id, l.Fence()); err != nil {
			return err
		}
		time.Sleep(time.Millisecond)
		if _, err := fmt.Fprintf(logFile, "exit %s %d\n", id, l.Fence()); err != nil {
			return err
		}
		if err := l.Unlock(ctx); err != nil {
			return err
		}
	}
	return nil
}
