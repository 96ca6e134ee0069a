package cli_test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dlock-go/dlock/internal/test/testserver"
)

// TestOtherStores runs one short scenario on each of the other stores a URL
// can name, against real servers: MariaDB, PostgreSQL, Redis Sentinel, a
// one-node Redis Cluster and Redlock over three nodes.
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
			set := testserver.StartSentinel(t)
			return "redis+sentinel://" + strings.Join(set.SentinelAddrs(), ",") + "/" + set.MasterName() + "?replica_ack=1"
		}},
		{"redis+cluster", func(t *testing.T) string {
			return "redis+cluster://" + testserver.StartCluster(t, 1).Addrs()[0]
		}},
		{"redlock", func(t *testing.T) string {
			var addrs []string
			for range 3 {
				addrs = append(addrs, testserver.StartRedis(t).Addr())
			}
			// Redlock's 50ms node timeout is for a healthy network; three
			// race-built processes on a loaded machine miss it, and the
			// scenario is not about timeouts.
			return "redlock://" + strings.Join(addrs, ",") + "?node_timeout=2s"
		}},
	}
	for _, s := range stores {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			backend := s.start(t)
			scenario(t, backend)
			if s.name != "redlock" {
				kindsScenario(t, backend)
			}
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

// kindsScenario holds a reader and a semaphore permit: a second reader
// runs beside the first, a writer and a second permit are refused, and ls
// shows both; a fair lock's waiter names its place in the queue.
func kindsScenario(t *testing.T, backend string) {
	t.Helper()
	dir := t.TempDir()
	e := newEnv(t, backend, "DIR="+dir)
	reader := hold(t, e, dir, "reader", true, "run", "--shared", "k:book")
	expect(t, e.run("run", "--shared", "k:book", "--", "true"), 0)
	expect(t, e.run("run", "k:book", "--", "true"), 75, `"k:book": 1 reader holds it`)
	permit := hold(t, e, dir, "permit", true, "run", "--semaphore", "1", "k:pool")
	expect(t, e.run("run", "--semaphore", "1", "k:pool", "--", "true"), 75, `"k:pool": 1 of 1 permits in use`)
	fair := hold(t, e, dir, "fair", true, "run", "--fair", "k:queue")
	waiter := e.start("run", "--fair", "--wait", "60s", "k:queue", "--", "true")
	waitStderr(t, waiter, "; 1st in the queue; waiting up to 1m0s")

	r := e.run("ls", "k:", "--json")
	expect(t, r, 0)
	var locks []kindsJSON
	if err := json.Unmarshal([]byte(r.stdout), &locks); err != nil || len(locks) != 3 ||
		len(locks[0].Shared) != 1 || locks[0].Limit != 0 || !strings.Contains(locks[0].Shared[0].Owner, reader.pid) ||
		len(locks[1].Shared) != 1 || locks[1].Limit != 1 || !strings.Contains(locks[1].Shared[0].Owner, permit.pid) ||
		locks[2].Queued != 1 || !strings.Contains(locks[2].Owner, fair.pid) {
		t.Errorf("ls k: --json: %v\n%s", err, r.stdout)
	}
	reader.let(t)
	permit.let(t)
	fair.let(t)
	expect(t, waiter.wait(), 0)
}
