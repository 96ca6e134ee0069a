package cli_test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dlock-go/dlock/internal/test/testserver"
)

// TestEtcd runs commands under locks on a 3-member etcd cluster whose
// root user needs a password: run, a refused second run, ls, inspect,
// release --force, a reader, a semaphore permit and a fair waiter; the
// password given in
// DLOCK_PASSWORD never shows, and a wrong one is refused with exit 77.
func TestEtcd(t *testing.T) {
	srv := testserver.StartEtcdCluster(t, 3)
	const password = "s3cret-etcd-pw"
	srv.EnableAuth(t, password)
	backend := "etcd://root@" + strings.Join(srv.Endpoints(), ",") + "?namespace=cli/"
	ready := filepath.Join(t.TempDir(), "ready")
	dir := t.TempDir()
	e := newEnv(t, backend, "DLOCK_PASSWORD="+password, "READY="+ready, "DIR="+dir)

	first := hold(t, e, dir, "first", true, "run", "e")
	first.let(t)
	holder := e.start("run", "--ttl", "3s", "--kill-grace", "100ms", "e", "--", "sh", "-c", `echo "$DLOCK_FENCE" > "$READY"; sleep 30`)
	var fence uint64
	if _, err := fmt.Sscan(waitFile(t, ready, holder), &fence); err != nil || fence <= first.fence {
		t.Errorf("second fence %d (%v), want more than the first, %d", fence, err, first.fence)
	}
	pid := fmt.Sprintf("|pid %d|", holder.cmd.Process.Pid)
	expect(t, e.run("run", "e", "--", "true"), 75, pid)

	r := e.run("ls", "--json")
	expect(t, r, 0)
	var locks []lockJSON
	if err := json.Unmarshal([]byte(r.stdout), &locks); err != nil || len(locks) != 1 || locks[0].Fence != fence ||
		!strings.Contains(locks[0].Owner, pid) || locks[0].ExpiresInMS <= 0 || locks[0].ExpiresInMS > 3000 {
		t.Errorf("ls --json: %v\n%s", err, r.stdout)
	}
	r = e.run("inspect", "e")
	if r.code != 0 || !strings.Contains(r.stdout, pid) {
		t.Errorf("inspect: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = e.run("release", "--force", "e")
	if r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf("(fence %d", fence)) {
		t.Errorf("release --force: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	expect(t, holder.wait(), 76, `lost lock "e"`)

	reader := hold(t, e, dir, "reader", true, "run", "--shared", "k:book")
	expect(t, e.run("run", "--shared", "k:book", "--", "true"), 0)
	expect(t, e.run("run", "k:book", "--", "true"), 75, `"k:book": 1 reader holds it`)
	permit := hold(t, e, dir, "permit", true, "run", "--semaphore", "1", "k:pool")
	expect(t, e.run("run", "--semaphore", "1", "k:pool", "--", "true"), 75, `"k:pool": 1 of 1 permits in use`)
	fair := hold(t, e, dir, "fair", true, "run", "--fair", "k:queue")
	waiter := e.start("run", "--fair", "--wait", "60s", "k:queue", "--", "true")
	waitStderr(t, waiter, "; 1st in the queue; waiting up to 1m0s")
	r = e.run("ls", "k:", "--json")
	expect(t, r, 0)
	var kinds []kindsJSON
	if err := json.Unmarshal([]byte(r.stdout), &kinds); err != nil || len(kinds) != 3 || kinds[2].Queued != 1 || !strings.Contains(kinds[2].Owner, fair.pid) {
		t.Errorf("ls k: --json: %v\n%s", err, r.stdout)
	}
	reader.let(t)
	permit.let(t)
	fair.let(t)
	expect(t, waiter.wait(), 0)

	for _, r := range []result{e.run("ls"), e.run("run", "x", "--", "true")} {
		if strings.Contains(r.stdout+r.stderr, password) {
			t.Errorf("output shows the password:\n%s%s", r.stdout, r.stderr)
		}
	}
	wrong := newEnv(t, backend, "DLOCK_PASSWORD=wrong-password")
	r = wrong.run("ls")
	if r.code != 77 || strings.Contains(r.stderr, "wrong-password") {
		t.Errorf("ls with a wrong password: exit %d\n%s", r.code, r.stderr)
	}
	t.Logf("wrong password: exit %d: %s", r.code, strings.TrimSpace(r.stderr))
}
