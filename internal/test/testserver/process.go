package testserver

import (
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// process runs one server program again and again with the same command
// line, appending its output to a log file. The server and every process it
// forks share a process group of their own, so that Kill takes them all
// down at once, as a crash of the machine would.
type process struct {
	name string           // the program, for messages
	log  string           // path of the file that receives the server's output
	cmd  func() *exec.Cmd // builds the command line of each start

	mu     sync.Mutex
	proc   *os.Process
	exited chan struct{} // closed when proc has exited; nil when not running
}

// start runs the server and waits until ready succeeds. On failure it kills
// the server and fails the test with the end of the log.
func (p *process) start(t testing.TB, ready func() error) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited != nil {
		t.Fatalf("%s is already running", p.name)
	}
	logFile, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatalf("open %s log: %v", p.name, err)
	}
	defer logFile.Close() // the child has its own copy of the descriptor

	cmd := p.cmd()
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", p.name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	p.proc, p.exited = cmd.Process, exited

	if err := waitUntil(ready, exited); err != nil {
		p.signalAndWait(syscall.SIGKILL)
		t.Fatalf("%s: %v\nlast lines of %s:\n%s", p.name, err, p.log, tail(p.log, 20))
	}
}

// stop sends sig to the server's process group and waits for the server to
// exit; one that is still running after readyTimeout is killed. It does
// nothing when the server is not running.
func (p *process) stop(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.signalAndWait(sig)
}

// signal sends sig to the server's process group (SIGSTOP, SIGCONT); it
// fails when the server is not running. After SIGSTOP it returns once the
// server has stopped (see waitStopped).
func (p *process) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited == nil {
		return fmt.Errorf("%s is not running", p.name)
	}
	if err := syscall.Kill(-p.proc.Pid, sig); err != nil {
		return err
	}
	if sig == syscall.SIGSTOP {
		waitStopped(p.proc.Pid)
	}
	return nil
}

// waitStopped waits, for readyTimeout at most, until every thread of
// process pid is stopped. kill(2) returns before a busy thread has taken
// the signal: on a loaded machine a server "paused" that way could still
// answer the next request. Without /proc it returns at once.
func waitStopped(pid int) {
	deadline := time.Now().Add(readyTimeout)
	for time.Now().Before(deadline) {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return
		}
		stopped := true
		for _, task := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
			if err != nil {
				continue // the thread has exited
			}
			i := strings.LastIndexByte(string(b), ')')
			if fields := strings.Fields(string(b[i+1:])); i < 0 || len(fields) == 0 || !strings.Contains("TtZX", fields[0]) {
				stopped = false
				break
			}
		}
		if stopped {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// running reports whether the server was started and has not been stopped.
func (p *process) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited != nil
}

// signalAndWait is stop with p.mu held.
func (p *process) signalAndWait(sig syscall.Signal) {
	if p.exited == nil {
		return
	}
	pid := p.proc.Pid
	var children []int
	if sig == syscall.SIGKILL {
		// Servers like PostgreSQL put each child in a session of its own,
		// out of the group. Freeze the server so that it forks no more,
		// and kill its children with it.
		_ = syscall.Kill(pid, syscall.SIGSTOP)
		children = childrenOf(pid)
		for _, c := range children {
			_ = syscall.Kill(c, syscall.SIGKILL)
		}
	}
	_ = syscall.Kill(-pid, sig)
	timer := time.NewTimer(readyTimeout)
	defer timer.Stop()
	select {
	case <-p.exited:
	case <-timer.C:
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-p.exited
	}
	// The children are not ours to wait for; wait until they are dead, so
	// that a restart finds the port and shared memory free.
	waitDead(children)
	p.proc, p.exited = nil, nil
}

// childrenOf returns the processes whose parent is pid, from /proc (none
// where there is no /proc).
func childrenOf(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var children []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, _, ok := procStat(child); ok && ppid == pid {
			children = append(children, child)
		}
	}
	return children
}

// procStat reads the parent and the state of process pid from
// /proc/PID/stat: "PID (COMM) STATE PPID ...", where COMM may hold anything.
func procStat(pid int) (ppid int, state byte, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, false
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0, false
	}
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 2 {
		return 0, 0, false
	}
	ppid, err = strconv.Atoi(fields[1])
	return ppid, fields[0][0], err == nil
}

// waitDead waits, for readyTimeout at most, until every process of pids has
// exited (a zombie has: it holds no memory or sockets any more).
func waitDead(pids []int) {
	deadline := time.Now().Add(readyTimeout)
	for _, pid := range pids {
		for time.Now().Before(deadline) {
			if _, state, ok := procStat(pid); !ok || state == 'Z' || state == 'X' {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// waitUntil calls ready every 20ms until it succeeds, the process exits or
// readyTimeout passes.
func waitUntil(ready func() error, exited <-chan struct{}) error {
	deadline := time.Now().Add(readyTimeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %w", readyTimeout, err)
		}
		select {
		case <-exited:
			return fmt.Errorf("exited before it was ready (last check: %v)", err)
		case <-tick.C:
		}
	}
}

// run runs a setup program (initdb and the like) to completion, failing the
// test with its output when it fails.
func run(t testing.TB, cmd *exec.Cmd) {
	t.Helper()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", filepath.Base(cmd.Path), err, out)
	}
}

// findBinary returns the path of the named program, looking first in dirs,
// which may be glob patterns (the highest version first), and then in PATH.
// When it is nowhere, it fails or skips the test as RequireBinary does.
func findBinary(t testing.TB, name string, dirs ...string) string {
	t.Helper()
	for _, pattern := range dirs {
		matches, _ := filepath.Glob(filepath.Join(pattern, name))
		slices.SortFunc(matches, func(a, b string) int { return cmp.Compare(version(b), version(a)) })
		for _, m := range matches {
			if fi, err := os.Stat(m); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
				return m
			}
		}
	}
	return RequireBinary(t, name)
}

// version is the first number in path, as in /usr/lib/postgresql/15/bin, or 0.
func version(path string) int {
	start := strings.IndexAny(path, "0123456789")
	if start < 0 {
		return 0
	}
	end := start
	for end < len(path) && path[end] >= '0' && path[end] <= '9' {
		end++
	}
	n, _ := strconv.Atoi(path[start:end])
	return n
}
