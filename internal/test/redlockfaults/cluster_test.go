package redlockfaults_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redlock"
)

// nodes is a set of independent redis-servers, each behind a proxy of its
// own; clients reach the servers only through the proxies, so that a test
// can cut, partition or slow each node.
type nodes struct {
	servers []*testserver.Redis
	proxies []*testserver.Proxy
}

// startNodes starts n redis-servers, each behind a proxy. The servers keep
// nothing on disk unless args (redis-server options) ask for it.
func startNodes(tb testing.TB, n int, args ...string) *nodes {
	tb.Helper()
	ns := &nodes{}
	for range n {
		srv := testserver.StartRedis(tb, args...)
		ns.servers = append(ns.servers, srv)
		ns.proxies = append(ns.proxies, testserver.StartProxy(tb, srv.Addr()))
	}
	return ns
}

// client returns a new go-redis client for node i through its proxy, closed
// when the test ends.
func (ns *nodes) client(tb testing.TB, i int) *redis.Client {
	tb.Helper()
	return newClient(tb, ns.proxies[i].Addr())
}

// newClient returns a go-redis client for addr, closed when the test ends.
// Context deadlines are honoured on the socket (ContextTimeoutEnabled), so
// that a node that does not answer costs a call no more than its deadline.
// ReadTimeout bounds the calls made without a deadline, which on a silent
// node would otherwise wait go-redis's default 3s each; see
// TestCloseWithSilentNode for why that matters.
func newClient(tb testing.TB, addr string) *redis.Client {
	tb.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, ReadTimeout: 300 * time.Millisecond})
	tb.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// redlock returns a Redlock backend on every node, with clients of its own,
// as a separate process would have.
func (ns *nodes) redlock(tb testing.TB, opts ...redlock.Option) *redlock.Backend {
	tb.Helper()
	clients := make([]redis.UniversalClient, len(ns.proxies))
	for i := range clients {
		clients[i] = ns.client(tb, i)
	}
	b, err := redlock.New(clients, opts...)
	if err != nil {
		tb.Fatalf("redlock.New: %v", err)
	}
	return b
}

// backends returns a function that makes Redlock backends on ns, for contend.
func (ns *nodes) backends(opts ...redlock.Option) func(*testing.T) driver.Backend {
	return func(t *testing.T) driver.Backend { return ns.redlock(t, opts...) }
}
