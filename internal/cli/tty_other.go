//go:build !linux

package cli

import "syscall"

// handTerminal leaves the terminal to dlock where it has no implementation:
// the command runs in a background process group and cannot read from the
// terminal.
func handTerminal(*syscall.SysProcAttr) (restore func(), ok bool) { return nil, false }

func stopped(int) bool { return false }
