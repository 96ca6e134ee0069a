// Handing the terminal to the command on Linux, and telling from /proc
// whether its process group is stopped.

package cli

import (
	"bytes"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// handTerminal gives the command the terminal when dlock runs in the
// terminal's foreground: attr then starts the command's process group in
// the foreground, so that the command can read from the terminal (a
// background group reading it would be stopped by SIGTTIN) and gets the
// keys' signals (Ctrl-C, Ctrl-\) itself. It returns the function that takes
// the terminal back, and false when stdin is not a terminal or dlock is not
// in its foreground.
func handTerminal(attr *syscall.SysProcAttr) (restore func(), ok bool) {
	fd := int(os.Stdin.Fd())
	pgrp, err := tcgetpgrp(fd)
	own := syscall.Getpgrp()
	if err != nil || pgrp != own {
		return nil, false
	}
	// dlock is in a background group while the command runs; writing to
	// the terminal (with stty tostop) or taking it back would stop it.
	signal.Ignore(syscall.SIGTTOU)
	attr.Foreground = true
	attr.Ctty = fd
	return func() { _ = tcsetpgrp(fd, own) }, true
}

func tcgetpgrp(fd int) (int, error) {
	var pgrp int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TIOCGPGRP, uintptr(unsafe.Pointer(&pgrp))); e != 0 {
		return 0, e
	}
	return int(pgrp), nil
}

func tcsetpgrp(fd, pgrp int) error {
	p := int32(pgrp)
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TIOCSPGRP, uintptr(unsafe.Pointer(&p))); e != 0 {
		return e
	}
	return nil
}

// groupStopped reports whether a process of the group pgid is stopped
// (state T in /proc/PID/stat), as after Ctrl-Z, SIGSTOP, or SIGTTIN for a
// background process that reads from its terminal. A process stopped by a
// debugger (state t) does not count: continuing it is the debugger's job.
func groupStopped(pgid int) bool {
	d, err := os.Open("/proc")
	if err != nil {
		return false
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	for _, name := range names {
		if name == "" || name[0] < '0' || name[0] > '9' {
			continue
		}
		if state, pgrp, ok := procState(name); ok && state == 'T' && pgrp == pgid {
			return true
		}
	}
	return false
}

// procState reads the state and the process group of the process pid from
// /proc/PID/stat.
func procState(pid string) (state byte, pgrp int, ok bool) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// The state follows the command name, which is in parentheses and may
	// itself contain ") "; then come the parent's PID and the group's ID.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 3 || len(f[0]) != 1 {
		return 0, 0, false
	}
	pgrp, err = strconv.Atoi(f[2])
	return f[0][0], pgrp, err == nil
}
