package proclive

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// machine is 8 hex digits of a hash of this boot's id and this PID
// namespace: processes that share it see one process table.
func machine() (string, bool) {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", false
	}
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return "", false
	}
	// Start times read in /proc are shifted by the reader's time
	// namespace: processes in two of them must not compare theirs.
	timeNS, err := os.Readlink("/proc/self/ns/time")
	if err != nil {
		timeNS = "time:none" // a kernel without time namespaces
	}
	// A /proc mounted for another PID namespace (a sandbox that did not
	// mount its own) would show other processes under our numbers.
	if self, err := os.Readlink("/proc/self"); err != nil || self != strconv.Itoa(os.Getpid()) {
		return "", false
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(string(boot)) + "\n" + ns + "\n" + timeNS))
	return hex.EncodeToString(sum[:4]), true
}

func selfPID() int { return os.Getpid() }

// procStat reads the start time of process pid, in clock ticks since boot
// (field 22 of /proc/PID/stat), and whether it is a zombie (field 3).
func procStat(pid int) (start uint64, zombie, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false, false
	}
	// The command name, in parentheses, may hold spaces and parentheses:
	// the fields after it follow the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, false, false
	}
	fields := strings.Fields(string(b[i+1:]))
	// fields[0] is field 3 (state): field 22 is fields[19].
	if len(fields) < 20 {
		return 0, false, false
	}
	v, err := strconv.ParseUint(fields[19], 10, 64)
	return v, fields[0] == "Z", err == nil
}

// exists asks the kernel whether process pid exists: kill(pid, 0) fails
// with ESRCH when it does not, and with EPERM when it is another user's.
func exists(pid int) existence {
	err := syscall.Kill(pid, 0)
	switch {
	case err == nil, errors.Is(err, syscall.EPERM):
		return running
	case errors.Is(err, syscall.ESRCH):
		return gone
	}
	return unknown
}
