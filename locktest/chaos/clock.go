package chaos

import "time"

// Now reads the host's monotonic clock, in nanoseconds. On Linux and the other
// Unix systems it is CLOCK_MONOTONIC, one clock for every process on the
// host, so events recorded by child processes sort with the parent's. It
// never goes back and does not follow changes of the wall clock.
func Now() int64 { return monotonic() }

// At converts a time.Time of this process (such as a lease's Deadline) to
// the clock of Now.
func At(t time.Time) int64 {
	now := Now()
	return now + int64(time.Until(t))
}
