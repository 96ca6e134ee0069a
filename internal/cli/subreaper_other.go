//go:build unix && !linux

// No-op stand-ins, on Unix other than Linux, for the subreaper and the
// parent death signal.

package cli

import "syscall"

// becomeSubreaper does nothing where there are no child subreapers; a killed
// process group is then gone once init has reaped its orphans.
func becomeSubreaper() {}

// setParentDeathSignal does nothing where there is no parent death signal:
// there, a command whose dlock is killed runs on.
func setParentDeathSignal(*syscall.SysProcAttr) {}
