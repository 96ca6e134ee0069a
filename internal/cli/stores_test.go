package cli_test

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/testserver"
)

// TestOtherStores runs one short scenario on each of the other stores a URL
// can name, against real servers: MariaDB, PostgreSQL, Redis Sentinel and a
// one-node Redis Cluster.
func TestOtherStores(t *testing.T) {
	stores := []struct {
		name  string
		start func(t *testing.T) string
	}{
		{"mysql", func(t *testing.T) string {
			m := testserver.StartMariaDB(t)
			m.CreateDatabase(t, "locks")
			return "mysql://root@" + m.Addr() + "/locks"
		}},
		{"postgres", func(t *testing.T) string {
			p := testserver.StartPostgres(t)
			p.CreateDatabase(t, "locks")
			return p.URL("locks")
		}},
		{"redis+sentinel", func(t *testing.T) string {
			master := testserver.StartRedis(t)
			return "redis+sentinel://" + startSentinel(t, master.Addr()) + "/mymaster"
		}},
		{"redis+cluster", func(t *testing.T) string {
			node := testserver.StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
			makeOneNodeCluster(t, node.Client(t))
			return "redis+cluster://" + node.Addr()
		}},
	}
	for _, s := range stores {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			scenario(t, s.start(t))
		})
	}
}

// scenario runs a command under a lock, holds it while another run is
// refused, lists it, and breaks it.
func scenario(t *testing.T, backend string) {
	t.Helper()
	ready := filepath.Join(t.TempDir(), "ready")
	e := newEnv(t, backend, "READY="+ready)
	r := e.run("run", "s", "--", "sh", "-c", `echo "$DLOCK_FENCE"`)
	expect(t, r, 0)
	if r.stdout != "1\n" {
		t.Errorf("first fence %q, want 1", r.stdout)
	}
	holder := e.start("run", "--ttl", "3s", "--kill-grace", "100ms", "s", "--", "sh", "-c", `echo x > "$READY"; sleep 30`)
	waitFile(t, ready, holder)
	pid := fmt.Sprintf("|pid %d|", holder.cmd.Process.Pid)
	expect(t, e.run("run", "s", "--", "true"), 75, pid)

	r = e.run("ls", "--json")
	expect(t, r, 0)
	var locks []lockJSON
	if err := json.Unmarshal([]byte(r.stdout), &locks); err != nil || len(locks) != 1 || locks[0].Fence != 2 || !strings.Contains(locks[0].Owner, pid) {
		t.Errorf("ls --json: %v\n%s", err, r.stdout)
	}
	r = e.run("release", "--force", "s")
	if r.code != 0 || !strings.Contains(r.stdout, "(fence 2") {
		t.Errorf("release --force: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	expect(t, holder.wait(), 76, `lost lock "s"`)
}

// startSentinel starts a redis sentinel that monitors master as
// "mymaster", and returns its address.
func startSentinel(t *testing.T, master string) string {
	t.Helper()
	bin := testserver.RequireBinary(t, "redis-server")
	dir := t.TempDir()
	port := freePort(t)
	host, mport, _ := net.SplitHostPort(master)
	conf := filepath.Join(dir, "sentinel.conf")
	text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor mymaster %s %s 1\n", port, dir, host, mport)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, conf, "--sentinel")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	sc := redis.NewSentinelClient(&redis.Options{Addr: addr})
	defer sc.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := sc.GetMasterAddrByName(t.Context(), "mymaster").Result(); err == nil {
			return addr
		} else if time.Now().After(deadline) {
			t.Fatalf("sentinel on %s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// makeOneNodeCluster gives the node every hash slot and waits until the
// cluster is ready.
func makeOneNodeCluster(t *testing.T, c *redis.Client) {
	t.Helper()
	if err := c.ClusterAddSlotsRange(t.Context(), 0, 16383).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := c.ClusterInfo(t.Context()).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster not ready: %v\n%s", err, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
