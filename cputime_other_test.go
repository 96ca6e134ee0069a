//go:build !unix

package dlock_test

import "time"

// cpuTime is unknown here.
func cpuTime() (time.Duration, bool) { return 0, false }
