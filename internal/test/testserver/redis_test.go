package testserver_test

import (
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/internal/test/testserver"
)

func TestMain(m *testing.M) {
	// toxiproxy's links (a toxic's stub piping data) end a moment after
	// their proxy is removed; they are the test rig's, as in redlockfaults.
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).Start.func1"),
	)
}

func TestRedisStopAndStartKeepsAddress(t *testing.T) {
	srv := testserver.StartRedis(t)
	// No retries, so that the PING after Stop fails fast.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := t.Context()
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}

	srv.Stop(t)
	srv.Stop(t) // idempotent
	if err := rdb.Ping(ctx).Err(); err == nil {
		t.Fatal("PING answered after Stop")
	}
	srv.Start(t)
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after restart: %v", err)
	}
	if n, _ := rdb.Exists(ctx, "k").Result(); n != 0 {
		t.Error("data survived a restart without persistence")
	}
	srv.Kill(t)
	srv.Kill(t) // idempotent
}

func TestRedisExtraArgsOverrideDefaults(t *testing.T) {
	srv := testserver.StartRedis(t, "--appendonly", "yes")
	rdb := srv.Client(t)
	ctx := t.Context()
	if got, _ := rdb.ConfigGet(ctx, "appendonly").Result(); got["appendonly"] != "yes" {
		t.Fatalf("appendonly = %q, want yes", got["appendonly"])
	}
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	srv.Kill(t)
	srv.Start(t)
	if got, err := rdb.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Errorf("after SIGKILL and restart with appendonly: GET = %q, %v; want v", got, err)
	}
}

// recorder is a testing.TB whose Fatalf and Skipf record the message and
// end the goroutine, so tests can check how a helper fails.
type recorder struct {
	testing.TB
	fatal, skip string
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Skipf(format string, args ...any) {
	r.skip = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls fn with r in a goroutine of its own and waits for it.
func (r *recorder) run(fn func(testing.TB)) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(r)
	}()
	<-done
}

func TestStartFailureShowsServerLog(t *testing.T) {
	r := &recorder{TB: t}
	r.run(func(tb testing.TB) { testserver.StartRedis(tb, "--no-such-option", "1") })
	if !strings.Contains(r.fatal, "exited before it was ready") || !strings.Contains(r.fatal, "no-such-option") {
		t.Errorf("failure message does not show the server's complaint:\n%s", r.fatal)
	}
}

func TestRequireBinaryMissing(t *testing.T) {
	const name = "dlock-test-no-such-binary"

	t.Setenv("CI", "")
	r := &recorder{TB: t}
	r.run(func(tb testing.TB) { testserver.RequireBinary(tb, name) })
	if !strings.Contains(r.skip, name+" not found in PATH") || r.fatal != "" {
		t.Errorf("outside CI: skip %q, fatal %q; want a skip", r.skip, r.fatal)
	}

	t.Setenv("CI", "true")
	r = &recorder{TB: t}
	r.run(func(tb testing.TB) { testserver.RequireBinary(tb, name) })
	if !strings.Contains(r.fatal, name+" not found in PATH") || r.skip != "" {
		t.Errorf("under CI=true: skip %q, fatal %q; want a failure", r.skip, r.fatal)
	}
}

func TestRequireBinaryMessageForRedis(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv("CI", "true")
	r := &recorder{TB: t}
	r.run(func(tb testing.TB) { testserver.RequireBinary(tb, "redis-server") })
	want := "redis-server not found in PATH; install it with apt-get install redis-server (scripts/test does this)"
	if r.fatal != want {
		t.Errorf("message = %q, want %q", r.fatal, want)
	}
}

// TestStartMovesOffTakenPorts: a port freePort found can be taken before
// the server binds it; the server then starts on other ports. Here the
// cluster bus port is taken on purpose.
func TestStartMovesOffTakenPorts(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port
	r := testserver.StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--cluster-port", strconv.Itoa(taken))
	if p := r.ClusterPort(); p == taken || p == 0 {
		t.Errorf("cluster bus port %d, want one other than the taken %d", p, taken)
	}
	if err := r.Client(t).Ping(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
}
