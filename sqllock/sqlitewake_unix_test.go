//go:build unix

package sqllock_test

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/sqllock"
)

// bindAndAbandon leaves a socket file at path that nobody is bound to, as
// a process that died does.
func bindAndAbandon(t *testing.T, path string) {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
}

// TestSQLiteWakeDirectoryTrusted: a wake directory that is a symlink, or
// that others may write, is not used: Listen refuses it (the Client polls),
// and a release sends nothing there and removes nothing, where it used to
// delete every "*.sock" entry that answered "connection refused" at the
// symlink's target. In a trusted directory only socket files are removed.
func TestSQLiteWakeDirectoryTrusted(t *testing.T) {
	base := t.TempDir()
	path := filepath.Join(base, "locks.db")
	b := sqllock.NewSQLite(openSQLite(t, path))
	c := dlock.New(b)
	defer c.Close()

	elsewhere := filepath.Join(base, "elsewhere")
	if err := os.Mkdir(elsewhere, 0o700); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(elsewhere, "important.sock")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(elsewhere, "1-dead.sock")
	bindAndAbandon(t, stale)
	if err := os.Symlink(elsewhere, path+"-wake"); err != nil {
		t.Fatal(err)
	}
	if ln, err := b.Listen(t.Context(), func(string, string) {}); err == nil {
		_ = ln.Close()
		t.Error("Listen bound in a symlinked wake directory")
	}
	cycle := func() {
		t.Helper()
		l, err := c.Mutex("m").Lock(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	cycle()
	for _, p := range []string{victim, stale} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s is gone after a release through a symlinked wake directory: %v", p, err)
		}
	}

	// A directory others may write is refused too.
	if err := os.Remove(path + "-wake"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path+"-wake", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path+"-wake", 0o777); err != nil {
		t.Fatal(err)
	}
	if ln, err := b.Listen(t.Context(), func(string, string) {}); err == nil {
		_ = ln.Close()
		t.Error("Listen bound in a world-writable wake directory")
	}

	// Trusted: a regular file named like a socket is left alone.
	if err := os.Chmod(path+"-wake", 0o700); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(path+"-wake", "2-file.sock")
	if err := os.WriteFile(plain, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cycle()
	if _, err := os.Lstat(plain); err != nil {
		t.Errorf("a regular file in the wake directory was removed: %v", err)
	}
}
