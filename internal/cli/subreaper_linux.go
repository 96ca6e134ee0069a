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
