//go:build !unix

package sqllock

import (
	"errors"
	"os"
)

func lockFileNow(*os.File) bool { return false }

func lockFile(*os.File) error { return errors.New("no flock on this system") }

func unlockFile(*os.File) error { return nil }
