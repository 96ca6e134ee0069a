//go:build unix

package chaos

import "golang.org/x/sys/unix"

func monotonic() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic("chaos: clock_gettime(CLOCK_MONOTONIC): " + err.Error()) // cannot fail on a Unix kernel
	}
	return ts.Nano()
}
