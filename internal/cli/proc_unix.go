//go:build unix

// Process groups and signals for dlock run on Unix: the signals passed on or
// caught, signalling and reaping the command's group, exit statuses.

package cli

import (
	"errors"
	"io/fs"
	"os"
	"strconv"
	"syscall"
)

// forwardedSignals are passed on by dlock run to its command's process group.
var forwardedSignals = []os.Signal{
	syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP,
	syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2,
}

// suspendSignals would stop dlock while its command runs on, its lease
// lapsing: dlock run catches them and stays.
var suspendSignals = []os.Signal{syscall.SIGTSTP}

// childSignals tell dlock that a child stopped (or exited); dlock run always
// watches them.
var childSignals = []os.Signal{syscall.SIGCHLD}

// The signals that stop a command whose lock was lost.
const (
	sigTerm = syscall.SIGTERM
	sigKill = syscall.SIGKILL
)

// sigPipe is the signal of a write to a pipe whose reader is gone.
var sigPipe os.Signal = syscall.SIGPIPE

// childProcAttr starts the command in a process group of its own, whose ID is
// its PID: the whole group can then be signalled, grandchildren included. On
// Linux the command is also killed when dlock dies (setParentDeathSignal).
func childProcAttr() *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{Setpgid: true}
	setParentDeathSignal(attr)
	return attr
}

// wakesStopped reports whether dlock continues the command's group after
// passing sig on: a stopped process would otherwise keep a SIGTERM pending,
// unseen, for as long as it stays stopped.
func wakesStopped(sig os.Signal) bool {
	switch sig {
	case syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT:
		return true
	}
	return false
}

// continueGroup sends SIGCONT to the process group pgid.
func continueGroup(pgid int) { _ = signalGroup(pgid, syscall.SIGCONT) }

// signalGroup sends sig to the process group pgid. A group that is already
// gone is not an error.
func signalGroup(pgid int, sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return errors.New("not a signal number")
	}
	if err := syscall.Kill(-pgid, s); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

// groupAlive reports whether any process of the group pgid is left.
func groupAlive(pgid int) bool {
	err := syscall.Kill(-pgid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// reapGroup reaps the exited processes of the group pgid that are dlock's
// children: after the command's own process has been waited for, these are
// orphans reparented to dlock (see becomeSubreaper).
func reapGroup(pgid int) {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-pgid, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}

// signalNumber returns sig's number, or 0.
func signalNumber(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return int(s)
	}
	return 0
}

// exitStatus returns the exit code of a finished process as a shell reports
// it (128+N when signal N killed it) and a description of how it ended.
func exitStatus(ps *os.ProcessState) (code int, how string) {
	ws, ok := ps.Sys().(syscall.WaitStatus)
	if ok && ws.Signaled() {
		return exitSignalBase + int(ws.Signal()), "was killed by " + signalName(ws.Signal())
	}
	code = ps.ExitCode()
	return code, "exited with status " + strconv.Itoa(code)
}

// signalName gives the conventional name of sig, "SIGTERM", or its number.
func signalName(sig os.Signal) string {
	if name, ok := signalNames[signalNumber(sig)]; ok {
		return name
	}
	return "signal " + strconv.Itoa(signalNumber(sig))
}

var signalNames = map[int]string{
	int(syscall.SIGHUP): "SIGHUP", int(syscall.SIGINT): "SIGINT", int(syscall.SIGQUIT): "SIGQUIT",
	int(syscall.SIGKILL): "SIGKILL", int(syscall.SIGTERM): "SIGTERM", int(syscall.SIGUSR1): "SIGUSR1",
	int(syscall.SIGUSR2): "SIGUSR2", int(syscall.SIGPIPE): "SIGPIPE", int(syscall.SIGABRT): "SIGABRT",
	int(syscall.SIGSEGV): "SIGSEGV", int(syscall.SIGALRM): "SIGALRM",
}

// fileOwner returns the numeric owner and group of a file.
func fileOwner(st fs.FileInfo) (uid, gid string, ok bool) {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return "", "", false
	}
	return strconv.FormatUint(uint64(sys.Uid), 10), strconv.FormatUint(uint64(sys.Gid), 10), true
}
