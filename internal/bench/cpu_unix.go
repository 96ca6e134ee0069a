//go:build unix

package bench

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time this process has used, user and system,
// and true; false where the platform does not say.
func processCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
