package testserver_test

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/test/testserver"
)

// proxied starts a redis-server behind a proxy and returns both, with a
// client that goes through the proxy and fails fast (no retries).
func proxied(t *testing.T) (*testserver.Redis, *testserver.Proxy, *redis.Client) {
	t.Helper()
	srv := testserver.StartRedis(t)
	px := testserver.StartProxy(t, srv.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr(), MaxRetries: -1, DialerRetries: 1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	return srv, px, rdb
}

// dial opens a raw connection to addr.
func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// inlinePing sends PING on conn and reads the answer line, waiting at most wait.
func inlinePing(conn net.Conn, wait time.Duration) (string, error) {
	_ = conn.SetDeadline(time.Now().Add(wait))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	return strings.TrimSpace(line), err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded)
}

func TestProxyPassesTraffic(t *testing.T) {
	srv, px, rdb := proxied(t)
	ctx := t.Context()
	if px.Upstream() != srv.Addr() || px.Addr() == srv.Addr() {
		t.Fatalf("proxy %s -> %s, server %s", px.Addr(), px.Upstream(), srv.Addr())
	}
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := srv.Client(t).Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Errorf("GET on the server = %q, %v; want the value set through the proxy", got, err)
	}
}

func TestProxyDownRefusesAndUpRestores(t *testing.T) {
	srv, px, rdb := proxied(t)
	ctx := t.Context()
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	open := dial(t, px.Addr())
	if line, err := inlinePing(open, 5*time.Second); err != nil || line != "+PONG" {
		t.Fatalf("PING before Down = %q, %v", line, err)
	}

	px.Down(t)
	px.Down(t) // idempotent
	// The open connection is closed: the read ends with EOF or a reset,
	// long before the deadline.
	if line, err := inlinePing(open, 5*time.Second); err == nil || isTimeout(err) {
		t.Errorf("PING on a connection open at Down = %q, %v; want it closed", line, err)
	}
	// New connections are refused.
	if conn, err := net.DialTimeout("tcp", px.Addr(), 5*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		if conn != nil {
			_ = conn.Close()
		}
		t.Errorf("dial while down: %v, want connection refused", err)
	}
	if err := rdb.Ping(ctx).Err(); err == nil {
		t.Error("PING through the proxy answered while it was down")
	}
	// The server itself is untouched.
	if got, err := srv.Client(t).Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Errorf("GET on the server while the proxy is down = %q, %v", got, err)
	}

	px.Up(t)
	px.Up(t) // idempotent
	if got, err := rdb.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Errorf("GET through the proxy after Up = %q, %v; want v", got, err)
	}
}

func TestProxyPartitionAnswersNothing(t *testing.T) {
	srv, px, rdb := proxied(t)
	ctx := t.Context()
	open := dial(t, px.Addr())
	if line, err := inlinePing(open, 5*time.Second); err != nil || line != "+PONG" {
		t.Fatalf("PING before Partition = %q, %v", line, err)
	}

	px.Partition(t)
	px.Partition(t) // idempotent
	// An open connection stays open but gets no answer.
	if line, err := inlinePing(open, 300*time.Millisecond); !isTimeout(err) {
		t.Errorf("PING on an open connection during the partition = %q, %v; want a timeout", line, err)
	}
	// A new connection is accepted and gets no answer either.
	fresh := dial(t, px.Addr())
	if line, err := inlinePing(fresh, 300*time.Millisecond); !isTimeout(err) {
		t.Errorf("PING on a new connection during the partition = %q, %v; want a timeout", line, err)
	}
	// Requests do not reach the server.
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := rdb.Set(wctx, "k", "v", 0).Err()
	cancel()
	if err == nil {
		t.Fatal("SET through the proxy answered during the partition")
	}
	direct := srv.Client(t)
	if n, err := direct.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Errorf("EXISTS on the server = %d, %v; the SET sent during the partition reached it", n, err)
	}

	px.Heal(t)
	px.Heal(t) // idempotent
	if err := rdb.Set(ctx, "k", "after", 0).Err(); err != nil {
		t.Fatalf("SET through the proxy after Heal: %v", err)
	}
	if got, err := direct.Get(ctx, "k").Result(); err != nil || got != "after" {
		t.Errorf("GET on the server after Heal = %q, %v; want after", got, err)
	}
}

func TestProxyLatencyDelaysAnswers(t *testing.T) {
	_, px, rdb := proxied(t)
	ctx := t.Context()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	const d = 150 * time.Millisecond
	px.Latency(t, d)
	start := time.Now()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < d {
		t.Errorf("PING with %v latency took %v", d, took)
	}
	// Back-to-back requests are delayed together, not one after another.
	start = time.Now()
	pipe := rdb.Pipeline()
	for range 5 {
		pipe.Ping(ctx)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < d {
		t.Errorf("pipeline with %v latency took %v", d, took)
	}

	// A long latency holds an answer back; clearing it delivers the answer
	// at once instead of after the delay.
	px.Latency(t, time.Minute)
	answered := make(chan error, 1)
	go func() { answered <- rdb.Ping(context.Background()).Err() }()
	time.Sleep(100 * time.Millisecond) // the PING is on its way
	px.ClearLatency(t)
	px.ClearLatency(t) // idempotent
	select {
	case err := <-answered:
		if err != nil {
			t.Errorf("PING held back by the latency: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("ClearLatency did not release the answer held back")
	}
}

func TestProxyRequestLatencyHoldsRequests(t *testing.T) {
	srv, px, rdb := proxied(t)
	direct := srv.Client(t)
	ctx := t.Context()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	// A request held on its way has not reached the server; removing the
	// latency delivers it, and its answer comes back.
	px.RequestLatency(t, time.Minute, 0)
	answered := make(chan error, 1)
	go func() { answered <- rdb.Set(context.Background(), "k", "v", 0).Err() }()
	time.Sleep(200 * time.Millisecond) // the SET is on its way
	if n, err := direct.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("the server saw the held SET: EXISTS k = %d, %v", n, err)
	}
	px.RequestLatency(t, 0, 0)
	px.RequestLatency(t, 0, 0) // idempotent
	select {
	case err := <-answered:
		if err != nil {
			t.Fatalf("SET held back by the latency: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("removing the latency did not deliver the request held back")
	}
	if v, err := direct.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("GET k = %q, %v after the held SET was delivered", v, err)
	}
}

func TestProxyDownWhilePartitioned(t *testing.T) {
	_, px, rdb := proxied(t)
	ctx := t.Context()
	px.Partition(t)
	px.Down(t)
	px.Up(t)
	// Still partitioned after Up.
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := rdb.Ping(wctx).Err()
	cancel()
	if err == nil {
		t.Error("PING answered through a partitioned proxy after Down and Up")
	}
	px.Heal(t)
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Errorf("PING after Heal: %v", err)
	}
}
