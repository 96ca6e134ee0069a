package redlock_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redlock"
)

// startNodes starts n redis-servers, stopped at the end of the test.
func startNodes(t *testing.T, n int) []*testserver.Redis {
	t.Helper()
	servers := make([]*testserver.Redis, n)
	for i := range servers {
		servers[i] = testserver.StartRedis(t)
	}
	return servers
}

// newBackend returns a Backend with a go-redis client of its own per server,
// connected to every server that is up (see Backend.Ping).
func newBackend(t *testing.T, servers []*testserver.Redis, opts ...redlock.Option) *redlock.Backend {
	t.Helper()
	clients := make([]redis.UniversalClient, len(servers))
	for i, srv := range servers {
		clients[i] = srv.Client(t)
	}
	b := backendOn(t, clients, opts...)
	_ = b.Ping(t.Context()) // fails when a test has stopped a majority on purpose
	return b
}

// backendOn returns a Backend on the given clients; at the end of the test
// it waits for the Backend's background work.
func backendOn(t *testing.T, clients []redis.UniversalClient, opts ...redlock.Option) *redlock.Backend {
	t.Helper()
	b, err := redlock.New(clients, opts...)
	if err != nil {
		t.Fatalf("redlock.New: %v", err)
	}
	t.Cleanup(func() { redlock.WaitIdle(b) })
	return b
}

// admins returns a plain client per server, for looking behind the backend.
func admins(t *testing.T, servers []*testserver.Redis) []*redis.Client {
	t.Helper()
	out := make([]*redis.Client, len(servers))
	for i, srv := range servers {
		out[i] = srv.Client(t)
	}
	return out
}

// silentNode returns the address of a TCP server that accepts connections
// and never answers: a node that hangs rather than refuses.
func silentNode(t *testing.T) string { return testserver.StartSilent(t) }

// clientFor returns a go-redis client for addr, closed at the end of the
// test. go-redis bounds a new connection's handshake by the client's read
// timeout, not by the call's context, so a silent node holds each call for
// readTimeout.
func clientFor(t *testing.T, addr string, readTimeout time.Duration) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: readTimeout, ReadTimeout: readTimeout})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func newToken(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func lockKey(key string) string  { return "dlock:{" + key + "}" }
func fenceKey(key string) string { return "dlock:{" + key + "}:fence" }

// request is an acquire request for key with a fresh token.
func request(t *testing.T, key string, ttl time.Duration) driver.AcquireRequest {
	t.Helper()
	return driver.AcquireRequest{Key: key, Token: newToken(t), Owner: "owner-" + key, TTL: ttl}
}

func mustAcquire(t *testing.T, b *redlock.Backend, req driver.AcquireRequest) driver.AcquireResult {
	t.Helper()
	res, err := b.Acquire(t.Context(), req)
	if err != nil || !res.Acquired {
		t.Fatalf("Acquire(%q) = %+v, %v; want acquired", req.Key, res, err)
	}
	return res
}

func mustRelease(t *testing.T, b *redlock.Backend, key, token string) driver.ReleaseResult {
	t.Helper()
	res, err := b.Release(t.Context(), key, token)
	if err != nil {
		t.Fatalf("Release(%q): %v", key, err)
	}
	return res
}

// lockFields returns the lock hash of key on each node (empty when absent).
func lockFields(t *testing.T, nodes []*redis.Client, key string) []map[string]string {
	t.Helper()
	out := make([]map[string]string, len(nodes))
	for i, n := range nodes {
		m, err := n.HGetAll(t.Context(), lockKey(key)).Result()
		if err != nil {
			t.Fatalf("node %d: HGETALL: %v", i, err)
		}
		out[i] = m
	}
	return out
}

// counters returns the fence counter of key on each node.
func counters(t *testing.T, nodes []*redis.Client, key string) []int64 {
	t.Helper()
	out := make([]int64, len(nodes))
	for i, n := range nodes {
		v, err := n.Get(t.Context(), fenceKey(key)).Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatalf("node %d: GET fence: %v", i, err)
		}
		out[i] = v
	}
	return out
}

// setCounters sets the fence counter of key on each node.
func setCounters(t *testing.T, nodes []*redis.Client, key string, values ...int64) {
	t.Helper()
	for i, n := range nodes {
		if err := n.Set(t.Context(), fenceKey(key), values[i], 0).Err(); err != nil {
			t.Fatalf("node %d: SET fence: %v", i, err)
		}
	}
}

// leftovers lists the keys of key on every node, fence counters excepted.
func leftovers(t *testing.T, nodes []*redis.Client, key string) []string {
	t.Helper()
	var left []string
	for i, n := range nodes {
		keys, err := n.Keys(t.Context(), lockKey(key)+"*").Result()
		if err != nil {
			t.Fatalf("node %d: KEYS: %v", i, err)
		}
		for _, k := range keys {
			if !strings.HasSuffix(k, ":fence") && !strings.HasSuffix(k, ":r") && !strings.HasSuffix(k, ":late") { // kept on purpose: the fence counter; recent releases (15s); late-request records (5s)
				left = append(left, k)
			}
		}
	}
	return left
}

// eventually polls cond every 10ms until it holds or 10s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	eventuallyWithin(t, 10*time.Second, what, cond)
}

// eventuallyWithin is eventually with a bound of d.
func eventuallyWithin(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		<-tick.C
	}
}

// commandCalls returns how many times each command ran successfully on the
// node since the last CONFIG RESETSTAT, from INFO commandstats.
func commandCalls(t *testing.T, node *redis.Client) map[string]int {
	t.Helper()
	info, err := node.Info(t.Context(), "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	calls := make(map[string]int)
	for _, line := range strings.Split(info, "\n") {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		fields := make(map[string]int)
		for _, f := range strings.Split(stats, ",") {
			k, v, _ := strings.Cut(f, "=")
			n, _ := strconv.Atoi(v)
			fields[k] = n
		}
		calls[strings.TrimPrefix(name, "cmdstat_")] = fields["calls"] - fields["failed_calls"] - fields["rejected_calls"]
	}
	return calls
}

// scriptRuns returns how many scripts ran successfully on the node.
func scriptRuns(t *testing.T, node *redis.Client) int {
	t.Helper()
	c := commandCalls(t, node)
	return c["eval"] + c["evalsha"]
}

func resetStats(t *testing.T, nodes []*redis.Client) {
	t.Helper()
	for i, n := range nodes {
		if err := n.ConfigResetStat(t.Context()).Err(); err != nil {
			t.Fatalf("node %d: CONFIG RESETSTAT: %v", i, err)
		}
	}
}

// holdForeign makes node hold key for another owner, as a grant of someone
// else would.
func holdForeign(t *testing.T, node *redis.Client, key, owner string) {
	t.Helper()
	if err := node.HSet(t.Context(), lockKey(key), "f0reign", 1, "owner", owner, "fence", 1).Err(); err != nil {
		t.Fatal(err)
	}
	if err := node.PExpire(t.Context(), lockKey(key), time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
}

// nodeClient returns a go-redis client for addr as the dlock CLI makes them
// (socket deadlines from the call's context, no retries), which dials
// through d and reports its calls' timeouts to h; closed at the end of the
// test.
func nodeClient(t *testing.T, addr string, d *countingDialer, h *timeoutHook) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1, Dialer: d.dial})
	c.AddHook(h)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// countingDialer counts the connections a client opens, and makes each
// take delay first, as a node slow to connect (far away, TLS, or a loaded
// client machine) would.
type countingDialer struct {
	delay time.Duration
	dials atomic.Int64
}

func (d *countingDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.dials.Add(1)
	if d.delay > 0 {
		timer := time.NewTimer(d.delay)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	var nd net.Dialer
	return nd.DialContext(ctx, network, addr)
}

// timeoutHook counts the commands of a client that ended with a timeout: a
// deadline that passed while connecting or waiting for the answer.
type timeoutHook struct{ timeouts atomic.Int64 }

func (h *timeoutHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *timeoutHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.count(err)
		return err
	}
}

func (h *timeoutHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.count(err)
		return err
	}
}

func (h *timeoutHook) count(err error) {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		h.timeouts.Add(1)
	}
}
