//go:build !unix

package chaos

import "time"

// start anchors the process-local monotonic clock. Events of other processes
// do not share it on these systems.
var start = time.Now()

func monotonic() int64 { return int64(time.Since(start)) }
