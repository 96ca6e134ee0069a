// The SQLite file's permissions: a file created in a group-shared directory
// is group-writable, and a file dlock cannot write is explained.

package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"strings"
)

// createShared creates the SQLite file at path, empty (SQLite takes an
// empty file for an empty database) and read-write for its group alone
// (0660), when it does not exist and its directory dir is group-shared
// (set-group-ID, the convention for a directory whose files belong to its
// group): SQLite would create it 0644, and the group's other users could
// not take a lock. SQLite gives the -wal and -shm files it adds the file's
// permissions. The file is made under a temporary name and linked into
// place with its mode set, so that no process opens it with another mode.
// Elsewhere the file is left for SQLite to create.
func createShared(path string, dir fs.FileInfo) error {
	if dir.Mode()&fs.ModeSetgid == 0 {
		return nil
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		return nil // there, or not ours to look at: SQLite says what is wrong
	}
	f, err := os.CreateTemp(dirOf(path), ".dlock-new-*")
	if err != nil {
		return fmt.Errorf("create %s: %w", path, unwrapPathErr(err))
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	err = f.Chmod(0o660) // past the umask
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("create %s: %w", path, unwrapPathErr(err))
	}
	if err := os.Link(tmp, path); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create %s: %w", path, unwrapPathErr(err))
	}
	return nil
}

// readOnlyHint explains a SQLite error that says the file cannot be
// written ("attempt to write a readonly database", "unable to open database
// file"): whose the file and its directory are, and what to change; "" for
// other errors.
func readOnlyHint(path, msg string) string {
	if !strings.Contains(msg, "readonly database") && !strings.Contains(msg, "unable to open database file") {
		return ""
	}
	var parts []string
	for _, p := range []string{path, path + "-wal", path + "-shm", dirOf(path)} {
		if st, err := os.Stat(p); err == nil {
			parts = append(parts, p+" "+describeOwner(st))
		}
	}
	return fmt.Sprintf("dlock must write the SQLite file, its -wal and -shm files and their directory (%s); "+
		"between users, give them one group and make the directory set-group-ID and group-writable "+
		"(chgrp GROUP DIR; chmod 2775 DIR), then the files group-writable (chmod g+w); "+
		"-wal and -shm files that another user's failed attempt left can be removed while no dlock runs, by their owner or root",
		strings.Join(parts, ", "))
}

// describeOwner is "(-rw-r--r-- alice:staff)" for a file.
func describeOwner(st fs.FileInfo) string {
	owner, group := "?", "?"
	if uid, gid, ok := fileOwner(st); ok {
		owner, group = uid, gid
		if u, err := user.LookupId(owner); err == nil {
			owner = u.Username
		}
		if g, err := user.LookupGroupId(group); err == nil {
			group = g.Name
		}
	}
	return fmt.Sprintf("(%s %s:%s)", st.Mode(), owner, group)
}

func dirOf(path string) string {
	if i := strings.LastIndexByte(path, '/'); i > 0 {
		return path[:i]
	}
	return "/"
}
