//go:build unix && !solaris && !aix

package sqllock

import (
	"os"
	"syscall"
)

// gateWorks: this system has flock(2) (Solaris, illumos and AIX do not).
const gateWorks = true

// lockFileNow takes f's exclusive flock if nobody holds it.
func lockFileNow(f *os.File) bool {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil
}

// lockFile waits for f's exclusive flock.
func lockFile(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			return err
		}
	}
}

// unlockFile lets go of f's flock.
func unlockFile(f *os.File) error { return syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }
