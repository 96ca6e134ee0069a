//go:build linux

package proclive

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestDead: a process that ended is dead, and so is a number that another
// process was given since; a running process, a tag of another machine and
// a malformed tag are not known to be dead.
func TestDead(t *testing.T) {
	self := Tag()
	if !IsTag(self) {
		t.Fatalf("Tag() = %q, want proc:MACHINE:START", self)
	}
	if Dead(os.Getpid(), self) {
		t.Error("this process is dead")
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	tag := TagOf(pid)
	if tag == "" || Dead(pid, tag) {
		t.Fatalf("a running child: tag %q, dead %v", tag, Dead(pid, tag))
	}
	_ = cmd.Process.Kill()
	// Killed but not yet reaped: a zombie has ended.
	for i := 0; i < 1000 && !Dead(pid, tag); i++ {
		if i == 999 {
			t.Error("a killed child, not reaped, is not dead")
		}
	}
	_ = cmd.Wait()
	if !Dead(pid, tag) {
		t.Error("a child that ended is not dead")
	}
	// Our own number with another start time: the number was given again.
	i := strings.LastIndexByte(self, ':')
	if !Dead(os.Getpid(), self[:i+1]+"1") {
		t.Error("a live process with another start time is not taken for a reused number")
	}
	other := "proc:00000000" + self[len("proc:")+8:]
	if Dead(pid, other) {
		t.Error("a tag of another machine is dead")
	}
	for _, bad := range []string{"", "proc:", "proc:abc:1", "pid 1", self + "x"} {
		if Dead(pid, bad) {
			t.Errorf("malformed tag %q is dead", bad)
		}
	}
}
