//go:build !unix

// Process handling for dlock run without process groups or POSIX signals
// (not Unix): only the command's own process is signalled.

package cli

import (
	"errors"
	"io/fs"
	"os"
	"strconv"
	"syscall"
)

// dlock run needs process groups and POSIX signals; elsewhere it runs the
// command but can only stop the command's own process.

var forwardedSignals = []os.Signal{os.Interrupt}

var (
	suspendSignals []os.Signal
	childSignals   []os.Signal
)

var (
	sigPipe os.Signal // none here
	sigTerm = os.Kill
	sigKill = os.Kill
)

func childProcAttr() *syscall.SysProcAttr { return nil }

func wakesStopped(os.Signal) bool { return false }

func continueGroup(int) {}

func signalGroup(pid int, sig os.Signal) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	if sig == os.Interrupt {
		return errors.New("cannot interrupt a process on this system")
	}
	return p.Kill()
}

func groupAlive(int) bool { return false }

func reapGroup(int) {}

func becomeSubreaper() {}

func signalNumber(os.Signal) int { return 2 }

func exitStatus(ps *os.ProcessState) (int, string) {
	return ps.ExitCode(), "exited with status " + strconv.Itoa(ps.ExitCode())
}

func signalName(sig os.Signal) string { return sig.String() }

// fileOwner reports no owner where files have no numeric one.
func fileOwner(fs.FileInfo) (uid, gid string, ok bool) { return "", "", false }
