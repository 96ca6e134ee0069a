// Linux process controls for dlock run: becoming the subreaper of the
// command's orphans, and killing the command when dlock dies.

package cli

import "syscall"

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER from <linux/prctl.h>.
const prSetChildSubreaper = 36

// becomeSubreaper makes dlock the parent of the orphans its command leaves:
// a grandchild whose parent dies is then reparented to dlock, not to init,
// and dlock can reap it. Without it, a killed grandchild stays a zombie, still
// counted in its process group, until init gets round to it.
func becomeSubreaper() {
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
}

// setParentDeathSignal has the kernel kill the command (SIGKILL) when dlock
// dies without stopping it, by kill -9 for instance: the command must not
// run on without the lock's protection. The signal is sent when the thread
// that started the command exits, so runHolding starts it from a goroutine
// locked to its thread until the command has ended (startLocked).
func setParentDeathSignal(attr *syscall.SysProcAttr) {
	attr.Pdeathsig = syscall.SIGKILL
}
