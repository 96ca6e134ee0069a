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
// TestSQLiteAcrossProcesses: "DB-PATH|LOG-PATH|ID|ROUNDS".
const childEnv = "SQLLOCK_TEST_CHILD"

// TestSQLiteAcrossProcesses runs several processes that lock one name in one
// SQLite file and log, with O_APPEND to a shared file, a line when they
// enter the critical section and one when they leave it. In file order the
// lines must pair up (no one enters before the last one left) and the fences
// must grow.
func TestSQLiteAcrossProcesses(t *testing.T) {
	const children, rounds = 4, 25
	dir := t.TempDir()
	dbPath, logPath := filepath.Join(dir, "locks.db"), filepath.Join(dir, "critical.log")

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmds := make([]*exec.Cmd, children)
	for i := range cmds {
		cmd := exec.Command(exe)
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s|%s|%d|%d", childEnv, dbPath, logPath, i, rounds))
		out := &strings.Builder{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[i] = cmd
		t.Cleanup(func() {
			if t.Failed() && out.Len() > 0 {
				t.Logf("child %d said:\n%s", i, out)
			}
		})
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("child %d: %v", i, err)
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
	if len(parts) != 4 {
		fmt.Fprintln(os.Stderr, "bad", childEnv)
		return 2
	}
	dbPath, logPath, id := parts[0], parts[1], parts[2]
	rounds, _ := strconv.Atoi(parts[3])
	if err := childRounds(dbPath, logPath, id, rounds); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func childRounds(dbPath, logPath, id string, rounds int) error {
	db, err := sql.Open("sqlite", sqliteDSN(dbPath))
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
