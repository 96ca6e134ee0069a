package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLookingCreatesNothing: ls, inspect and release --force on a store that
// does not exist yet (a fresh HOME's default file, or a named file in an
// existing directory) answer "nothing held" and create neither the file nor
// its directory.
func TestLookingCreatesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	named := filepath.Join(t.TempDir(), "locks.db")
	for _, backend := range []string{"", "sqlite://" + named} {
		var args []string
		if backend != "" {
			args = []string{"--backend", backend}
		}
		expect(t, e.run(append(args, "ls")...), 0, "")
		if r := e.run(append(args, "ls", "--json")...); strings.TrimSpace(r.stdout) != "[]" {
			t.Errorf("ls --json: %q", r.stdout)
		}
		expect(t, e.run(append(args, "inspect", "x")...), 1)
		if r := e.run(append(args, "release", "--force", "x")...); r.code != 0 || !strings.Contains(r.stdout, "was not held") {
			t.Errorf("release --force: %d %q %q", r.code, r.stdout, r.stderr)
		}
	}
	if _, err := os.Stat(e.state); !os.IsNotExist(err) {
		t.Errorf("the state directory %s exists after ls, inspect and release (%v)", e.state, err)
	}
	if _, err := os.Stat(named); !os.IsNotExist(err) {
		t.Errorf("%s exists after ls, inspect and release (%v)", named, err)
	}
	// A run creates the file; then ls sees its lock.
	expect(t, e.run("run", "x", "--", "true"), 0)
	if _, err := os.Stat(filepath.Join(e.state, "dlock", "locks.db")); err != nil {
		t.Errorf("run did not create the default file: %v", err)
	}
}

// TestSharedDirectoryFile: in a set-group-ID directory (shared by a group),
// the SQLite file and the -wal and -shm files SQLite adds are
// group-writable, so that the group's other users can lock too.
func TestSharedDirectoryFile(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "shared")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, os.ModeSetgid|0o775); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "locks.db")
	e := newEnv(t, "sqlite://"+path)
	expect(t, e.run("run", "x", "--", "sh", "-c", `ls -l "$0"* >&2`, path), 0)
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		st, err := os.Stat(p)
		if err != nil {
			if p == path {
				t.Fatal(err)
			}
			continue // SQLite removes -wal and -shm when the last connection closes
		}
		if st.Mode().Perm()&0o020 == 0 {
			t.Errorf("%s is %v, want group-writable", p, st.Mode())
		}
	}
	// Outside such a directory the file is left to SQLite (0644 here).
	plain := filepath.Join(t.TempDir(), "locks.db")
	expect(t, newEnv(t, "sqlite://"+plain).run("run", "x", "--", "true"), 0)
	if st, err := os.Stat(plain); err != nil || st.Mode().Perm()&0o022 != 0 {
		t.Errorf("%s: %v, %v; want not group- or world-writable", plain, st.Mode(), err)
	}
}
