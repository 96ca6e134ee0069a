package otel_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// startRedis starts a redis-server of the test's own on a free loopback
// port in a temporary directory, keeping nothing on disk, and stops it when
// the test ends; it returns a client of it. It skips the test when
// redis-server is not installed, and fails it under CI=true. (dlock's
// internal/testserver does the same with more care, but is internal to
// the dlock module.)
func startRedis(t *testing.T) *redis.Client {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		msg := "redis-server not found in PATH; install it with apt-get install redis-server (scripts/test does this)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	dir := t.TempDir()
	for attempt := 1; ; attempt++ {
		port := freePort(t)
		log := filepath.Join(dir, "redis-"+strconv.Itoa(attempt)+".log")
		logFile, err := os.Create(log)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
			"--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "no")
		cmd.Stdout, cmd.Stderr = logFile, logFile
		err = cmd.Start()
		logFile.Close()
		if err != nil {
			t.Fatalf("start redis-server: %v", err)
		}
		exited := make(chan struct{})
		go func() {
			_ = cmd.Wait()
			close(exited)
		}()
		stop := func() {
			_ = cmd.Process.Kill()
			<-exited
		}
		rdb := redis.NewClient(&redis.Options{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))})
		if err := waitReady(rdb, exited); err != nil {
			_ = rdb.Close()
			stop()
			b, _ := os.ReadFile(log)
			if attempt < 5 && strings.Contains(string(b), "Address already in use") {
				continue // the free port was taken meanwhile
			}
			t.Fatalf("redis-server on port %d: %v; its log:\n%s", port, err, b)
		}
		// Cleanups run last-in first-out: the client closes, then the
		// server stops, then the directory goes.
		t.Cleanup(stop)
		t.Cleanup(func() { _ = rdb.Close() })
		return rdb
	}
}

// waitReady waits up to 10s for the server to answer PING.
func waitReady(rdb *redis.Client, exited <-chan struct{}) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return err
		default:
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
