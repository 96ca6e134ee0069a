//go:build !linux

// Stand-ins, off Linux, for handing the terminal to the command and for
// telling whether its process group is stopped.

package cli

import "syscall"

// handTerminal leaves the terminal to dlock where it has no implementation:
// the command runs in a background process group and cannot read from the
// terminal.
func handTerminal(*syscall.SysProcAttr) (restore func(), ok bool) { return nil, false }

// groupStopped cannot tell where there is no /proc: a stopped command is
// only continued when a forwarded signal or a lost lock continues it.
func groupStopped(int) bool { return false }
