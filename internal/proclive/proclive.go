// Package proclive tells, on the host where it runs, whether the process
// that wrote a dlock owner string has ended: each owner string carries a tag
// of its process ("proc:MACHINE:START": the machine, as this boot and PID
// namespace, and the process's start time), which a process of the same
// machine can check against the process table. Where it cannot tell (another
// host or PID namespace, another boot, a process table it may not read, a
// system without the tag) it says "alive": a lock is only ever taken over
// from a holder known to be dead.
package proclive

import (
	"strconv"
	"strings"
	"sync"
)

// tagPrefix starts a process tag in an owner string.
const tagPrefix = "proc:"

var (
	once  sync.Once
	self  string // this process's tag, "" where unknown
	mach  string // this machine's part of it
	ready bool
)

func load() {
	once.Do(func() {
		m, ok := machine()
		if !ok {
			return
		}
		start, _, ok := procStat(selfPID())
		if !ok {
			return
		}
		mach, self, ready = m, tagPrefix+m+":"+strconv.FormatUint(start, 10), true
	})
}

// Tag returns this process's tag, "proc:MACHINE:START", or "" where the
// system does not tell (not Linux, no /proc).
func Tag() string {
	load()
	return self
}

// TagOf returns the tag of process pid of this machine, or "" when it
// cannot be read.
func TagOf(pid int) string {
	load()
	start, _, ok := procStat(pid)
	if !ready || !ok {
		return ""
	}
	return tagPrefix + mach + ":" + strconv.FormatUint(start, 10)
}

// IsTag reports whether s has the form of a process tag.
func IsTag(s string) bool {
	_, _, ok := parse(s)
	return ok
}

func parse(tag string) (machine string, start uint64, ok bool) {
	rest, ok := strings.CutPrefix(tag, tagPrefix)
	if !ok {
		return "", 0, false
	}
	machine, s, ok := strings.Cut(rest, ":")
	if !ok || len(machine) != 8 {
		return "", 0, false
	}
	start, err := strconv.ParseUint(s, 10, 64)
	return machine, start, err == nil
}

// Dead reports whether the process pid that wrote tag is known to have
// ended: tag names this machine (this boot, this PID namespace), and pid is
// not running, or runs a process that started at another time (its number
// was given again). It is false whenever that cannot be known.
func Dead(pid int, tag string) bool {
	load()
	m, start, ok := parse(tag)
	if !ready || !ok || m != mach || pid <= 0 {
		return false
	}
	switch exists(pid) {
	case gone:
		return true
	case unknown:
		return false
	}
	// Running, a zombie (ended, not yet reaped) or another process that
	// was given the same number.
	now, zombie, ok := procStat(pid)
	return ok && (zombie || now != start)
}

type existence int

const (
	running existence = iota
	gone
	unknown
)
