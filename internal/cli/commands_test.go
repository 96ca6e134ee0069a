package cli_test

import (
	"bytes"
	"database/sql"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "modernc.org/sqlite"
)

// TestWatchersDoNotWriteAnotherDatabase: top and dash are documented
// to only read the store ("dash only reads the store"). Pointed at a SQLite
// file that exists but is not a dlock store (an application's database, or
// a typo), they must not add dlock's tables to it nor switch its journal to
// WAL. Today opening the store runs the DDL and sets journal_mode=WAL.
func TestWatchersDoNotWriteAnotherDatabase(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"top", "--once"}, {"ls"}} {
		t.Run(args[0], func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "app.db")
			db, err := sql.Open("sqlite", path)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec("CREATE TABLE users (id INTEGER)"); err != nil {
				t.Fatal(err)
			}
			db.Close()
			e := newEnv(t, "sqlite://"+path)
			r := e.run(args...)
			t.Logf("dlock %s: exit %d, %q %q", strings.Join(args, " "), r.code, r.stdout, r.stderr)
			db, err = sql.Open("sqlite", path)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			var n int
			if err := db.QueryRow("SELECT count(*) FROM sqlite_master WHERE name LIKE 'dlock%'").Scan(&n); err != nil {
				t.Fatal(err)
			}
			var mode string
			if err := db.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil {
				t.Fatal(err)
			}
			if n != 0 || mode != "delete" {
				t.Errorf("dlock %s wrote to a database it only reads: %d dlock tables added, journal_mode %s (was delete)", strings.Join(args, " "), n, mode)
			}
		})
	}
}

// TestDashDoesNotWriteAnotherDatabase: the same for dash, whose help
// says "dash only reads the store".
func TestDashDoesNotWriteAnotherDatabase(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "app.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE users (id INTEGER)"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	e := newEnv(t, "sqlite://"+path)
	p := e.start("dash", "--listen", "127.0.0.1:0")
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.stderrSoFar(), "serving") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	expect(t, p.wait(), 0)
	db, err = sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow("SELECT count(*) FROM sqlite_master WHERE name LIKE 'dlock%'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("dlock dash added %d dlock tables to a database it only reads", n)
	}
}

// TestCommandFlagsBeforeCommandName: a command's own flags belong
// after its name (usage: dlock [--backend URL] ... COMMAND [ARGS...]); only
// the global flags may come before it. A boolean one is refused there
// (dlock --json ls: unknown flag --json), but one that takes a value is
// taken as the command's: dlock --ttl 7s run x runs with a 7s lease.
func TestCommandFlagsBeforeCommandName(t *testing.T) {
	e := newEnv(t, "")
	expect(t, e.run("--json", "ls"), 64, "unknown flag --json")
	expect(t, e.run("--ttl", "7s", "run", "x", "--", "true"), 64, "--ttl")
	expect(t, e.run("--prefix", "zz", "top", "--once"), 64, "--prefix")
}

// TestDashDashBeforeCommand: "dlock -- run" names a command dlock
// has, yet it says: unknown command "run"; did you mean run?
func TestDashDashBeforeCommand(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	r := e.run("--", "run", "x", "--", "true")
	if strings.Contains(r.stderr, `unknown command "run"; did you mean run?`) {
		t.Errorf("dlock -- run x -- true: %q", r.stderr)
	}
}

// TestCompletionOffersOnlyRealNames: the NAME completion of inspect
// and release prints every listed key raw, one per line. A key holding a
// newline (written straight into Redis) is cut by cobra at it and offered
// as a name that is not held ("a" for "a\nb"); a key holding an escape
// sequence is offered with it raw (bash then lists it as it is when there
// are several candidates). Names that are not safe text should be left out.
func TestCompletionOffersOnlyRealNames(t *testing.T) {
	t.Parallel()
	u, srv := redisURL(t)
	rdb := srv.Client(t)
	for _, k := range []string{"dlock:{a\nb}", "dlock:{c\x1b]0;pwned\x07d}", "dlock:{plain}"} {
		if err := rdb.HSet(t.Context(), k, "tok", 1, "owner", "x", "fence", 3).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.PExpire(t.Context(), k, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	e := newEnv(t, u)
	r := e.run("__complete", "inspect", "")
	expect(t, r, 0)
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		if strings.HasPrefix(line, ":") {
			continue
		}
		if line != "plain" {
			t.Errorf("completion offers %q (want only plain); stdout %q", line, r.stdout)
		}
	}
}

// TestTopOnceWriteErrorExitCode: top's help says 74 when the
// terminal cannot be written, 69 when the store cannot be reached. A
// failed write of --once's table (stdout on a full disk) exits 69, as if
// the store were down.
func TestTopOnceWriteErrorExitCode(t *testing.T) {
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and no /dev/full to fail writes with: %v", err)
		}
		t.Skip(err)
	}
	defer full.Close()
	e := newEnv(t, "")
	cmd := exec.Command(dlockBin, "top", "--once")
	cmd.Env = e.vars
	cmd.Stdout = full
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	_ = cmd.Run()
	if code := cmd.ProcessState.ExitCode(); code != 74 {
		t.Errorf("dlock top --once > /dev/full: exit %d, want 74 (EX_IOERR); stderr %q", code, stderr.String())
	}
}
