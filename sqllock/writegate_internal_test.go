package sqllock

// Tests of the write gate: it builds on every Unix, and survives the removal
// of its directory.

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestWriteGateBuildsOnEveryUnix checks that the package still compiles
// for every GOOS of the unix build tag that it compiled for before the
// gate: gate_unix.go calls syscall.Flock, which Solaris and AIX lack.
func TestWriteGateBuildsOnEveryUnix(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, to cross-build: %v", err)
	}
	for _, target := range [][2]string{{"solaris", "amd64"}, {"aix", "ppc64"}, {"illumos", "amd64"}} {
		cmd := exec.Command(gobin, "build", "-o", os.DevNull, ".")
		cmd.Env = append(os.Environ(), "GOOS="+target[0], "GOARCH="+target[1], "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("GOOS=%s GOARCH=%s go build ./sqllock: %v\n%s", target[0], target[1], err, out)
		}
	}
}

// TestWriteGateFollowsARemovedDirectory removes the directory of the
// sockets and the gate, as a tmp cleaner or a user does (the listener binds
// its socket anew then). A Backend that opened the gate before, and one that
// opens it after, must still exclude each other: otherwise the processes
// started since the removal never wait for the older ones again.
func TestWriteGateFollowsARemovedDirectory(t *testing.T) {
	noLeaks(t)
	path := filepath.Join(t.TempDir(), "locks.db")
	a, b := gateOn(t, path), gateOn(t, path)
	a.enter(t.Context(), false)() // opens a's file
	if err := os.RemoveAll(path + wakeDirSuffix); err != nil {
		t.Fatal(err)
	}
	leaveA := a.enter(t.Context(), false)
	defer func() { leaveA() }()
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	b.enter(ctx, false)()
	if !b.stalled.Load() {
		t.Error("the second Backend went through the gate while the first held it: they lock two different files now")
	}
	leaveA()
	leaveA = noLeave
	for deadline := time.Now().Add(5 * time.Second); b.stalled.Load() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
}
