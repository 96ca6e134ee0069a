// Package testserver starts real store processes for tests: each test gets
// its own server on a free loopback port, in its own temporary directory,
// and the server is gone when the test ends.
package testserver

import (
	"bufio"
	"fmt"
	"net"
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

	"github.com/redis/go-redis/v9"
)

// readyTimeout bounds how long Start waits for a server to answer.
const readyTimeout = 10 * time.Second

// Redis is a redis-server process owned by one test.
type Redis struct {
	bin  string
	port int
	dir  string
	args []string
	log  string // path of the file that receives the server's output

	mu     sync.Mutex
	proc   *os.Process
	exited chan struct{} // closed when proc has exited; nil when not running
}

// StartRedis starts a fresh redis-server on a free loopback port in
// t.TempDir() and stops it in t.Cleanup. The server keeps nothing on disk
// unless args ask for it; args are appended to the command line and override
// the defaults (for example "--appendonly", "yes").
// It skips the test, or fails it under CI=true, when redis-server is missing.
func StartRedis(t testing.TB, args ...string) *Redis {
	t.Helper()
	dir := t.TempDir()
	r := &Redis{
		bin:  RequireBinary(t, "redis-server"),
		port: freePort(t),
		dir:  dir,
		args: slices.Clone(args),
		log:  filepath.Join(dir, "redis.log"),
	}
	// Registered after TempDir, so it runs first: the process is gone
	// before its directory is removed.
	t.Cleanup(func() { r.Kill(t) })
	// A free port found by freePort is free only until someone else takes
	// it (another test's server, a connection's local port): when the
	// server could not bind, try again on other ports.
	for attempt := 1; ; attempt++ {
		r.mu.Lock()
		err := r.start()
		r.mu.Unlock()
		if err == nil {
			return r
		}
		if attempt < 5 && strings.Contains(tail(r.log, 5), "Address already in use") {
			r.port = freePort(t)
			for i := 0; i+1 < len(r.args); i++ {
				if r.args[i] == "--cluster-port" {
					r.args[i+1] = strconv.Itoa(freePort(t))
				}
			}
			continue
		}
		t.Fatalf("%v", err)
	}
}

// ClusterPort returns the port of the server's cluster bus, from its
// --cluster-port argument, or 0.
func (r *Redis) ClusterPort() int {
	for i := 0; i+1 < len(r.args); i++ {
		if r.args[i] == "--cluster-port" {
			p, _ := strconv.Atoi(r.args[i+1])
			return p
		}
	}
	return 0
}

// Addr returns the server's address, "127.0.0.1:PORT".
func (r *Redis) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port))
}

// Client returns a new go-redis client for the server, closed when the test
// ends (before the server stops).
func (r *Redis) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Start starts the server on its port and directory, as a restart after Stop
// or Kill, and waits until it answers PING. It fails the test when the server
// does not come up, with the end of the server's log in the message.
func (r *Redis) Start(t testing.TB) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.start(); err != nil {
		t.Fatalf("%v", err)
	}
}

// start is Start, returning its failure. r.mu must be held.
func (r *Redis) start() error {
	if r.exited != nil {
		return fmt.Errorf("redis-server on %s is already running", r.Addr())
	}

	logFile, err := os.OpenFile(r.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open redis-server log: %v", err)
	}
	defer logFile.Close() // the child has its own copy of the descriptor

	args := []string{
		"--port", strconv.Itoa(r.port),
		"--bind", "127.0.0.1",
		"--dir", r.dir,
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--protected-mode", "no",
	}
	cmd := exec.Command(r.bin, append(args, r.args...)...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	r.proc, r.exited = cmd.Process, exited

	if err := waitReady(r.Addr(), exited); err != nil {
		r.signalAndWait(syscall.SIGKILL)
		return fmt.Errorf("redis-server on %s: %v\nlast lines of %s:\n%s", r.Addr(), err, r.log, tail(r.log, 20))
	}
	return nil
}

// Stop sends SIGTERM and waits for the server to exit. It does nothing when
// the server is not running.
func (r *Redis) Stop(t testing.TB) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.signalAndWait(syscall.SIGTERM)
}

// Kill sends SIGKILL and waits for the server to exit, as a crash would.
// It does nothing when the server is not running.
func (r *Redis) Kill(t testing.TB) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.signalAndWait(syscall.SIGKILL)
}

// Pause stops the server with SIGSTOP: connections stay open and requests
// go unanswered, as with a store that hangs or a network that drops every
// packet. Resume undoes it; the test's clean-up continues a paused server
// before stopping it.
func (r *Redis) Pause(t testing.TB) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.exited == nil {
		t.Fatal("redis-server is not running")
	}
	if err := r.proc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP redis-server: %v", err)
	}
	waitStopped(r.proc.Pid)
	proc := r.proc
	t.Cleanup(func() { _ = proc.Signal(syscall.SIGCONT) })
}

// Resume continues a server stopped by Pause.
func (r *Redis) Resume(t testing.TB) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.exited == nil {
		t.Fatal("redis-server is not running")
	}
	if err := r.proc.Signal(syscall.SIGCONT); err != nil {
		t.Fatalf("SIGCONT redis-server: %v", err)
	}
}

// signalAndWait sends sig and waits for the exit; a server that ignores
// SIGTERM for readyTimeout is killed. r.mu must be held.
func (r *Redis) signalAndWait(sig syscall.Signal) {
	if r.exited == nil {
		return
	}
	_ = r.proc.Signal(sig)
	timer := time.NewTimer(readyTimeout)
	defer timer.Stop()
	select {
	case <-r.exited:
	case <-timer.C:
		_ = r.proc.Kill()
		<-r.exited
	}
	r.proc, r.exited = nil, nil
}

// waitReady polls addr with PING until it answers PONG, the process exits or
// readyTimeout passes.
func waitReady(addr string, exited <-chan struct{}) error {
	deadline := time.Now().Add(readyTimeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var err error
	for {
		if err = ping(addr); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %w", readyTimeout, err)
		}
		select {
		case <-exited:
			return fmt.Errorf("exited before it was ready (last PING: %v)", err)
		case <-tick.C:
		}
	}
}

// ping sends one inline PING on a fresh connection. A server that is still
// loading its data answers -LOADING, which is not ready.
func ping(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if line = strings.TrimSpace(line); line != "+PONG" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// tail returns the last n lines of the file at path, or why it cannot.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// packages names the Debian package that provides a binary, for the hint in
// RequireBinary's message.
var packages = map[string]string{
	"redis-server":       "redis-server",
	"redis-cli":          "redis-server",
	"mariadbd":           "mariadb-server",
	"mariadb-install-db": "mariadb-server",
	"postgres":           "postgresql",
	"initdb":             "postgresql",
	"script":             "bsdutils",
	"etcd":               "etcd-server",
}

// RequireBinary returns the path of the named binary. When it is not in PATH
// the test fails under CI=true (a missing server must not pass as a skipped
// test there) and is skipped otherwise.
func RequireBinary(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	pkg := packages[name]
	if pkg == "" {
		pkg = name
	}
	msg := fmt.Sprintf("%s not found in PATH; install it with apt-get install %s (scripts/test does this)", name, pkg)
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s", msg)
	}
	t.Skipf("%s", msg)
	return ""
}
