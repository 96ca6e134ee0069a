package cli

import (
	"bytes"
	"os"
	"os/signal"
	"strconv"
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

// stopped reports whether the process pid is stopped (state T in
// /proc/PID/stat), as after Ctrl-Z.
func stopped(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses and may
	// itself contain ") ".
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'T'
}
