//go:build !unix || solaris || aix

// Without flock(2), a SQLiteBackend has no write gate.

package sqllock

import (
	"errors"
	"os"
)

const gateWorks = false

func lockFileNow(*os.File) bool { return false }

func lockFile(*os.File) error { return errors.New("no flock on this system") }

func unlockFile(*os.File) error { return nil }
