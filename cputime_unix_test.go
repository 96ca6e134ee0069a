//go:build unix

package dlock_test

import (
	"syscall"
	"time"
)

// cpuTime is the CPU time this process has used, user and system, every
// thread (the garbage collector's too); ok is false when unknown.
func cpuTime() (d time.Duration, ok bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
