package redlock_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/test/testserver"
)

// busyNode blocks node for d with a Lua busy loop (as a node that stalls
// for a moment would), from a connection of its own, in the background; it
// returns once the loop has started.
func busyNode(t *testing.T, node *redis.Client, d time.Duration) <-chan struct{} {
	t.Helper()
	done := make(chan struct{})
	started := make(chan struct{})
	go func() {
		defer close(done)
		close(started)
		_ = node.Eval(t.Context(), `
local t = redis.call('TIME')
local stop = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[1])
repeat
  t = redis.call('TIME')
until tonumber(t[1]) * 1000000 + tonumber(t[2]) >= stop
return 1`, nil, d.Microseconds()).Err()
	}()
	<-started
	time.Sleep(100 * time.Millisecond) // the loop is running
	return done
}

// lockWithUnknownOutcomeNode locks name with TTL ttl on three nodes while
// node 2 stalls past the node timeout: the grant is made on nodes 0 and 1,
// and node 2 runs the acquire that timed out later, under a fence of its
// own (the counters are 5, 5 and 40). It returns the servers, the admin
// clients of the nodes and the lease.
func lockWithUnknownOutcomeNode(t *testing.T, name string, ttl time.Duration) ([]*testserver.Redis, []*redis.Client, *dlock.Lease) {
	t.Helper()
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	// The nodes' counters differ (failed attempts, a node that was down):
	// node 2 draws a fence of its own.
	setCounters(t, nodes, name, 5, 5, 40)
	// Node clients as docs/REDLOCK.md advises: ReadTimeout a few node
	// timeouts (here 150ms), no retries.
	clients := make([]redis.UniversalClient, len(servers))
	for i, srv := range servers {
		clients[i] = clientFor(t, srv.Addr(), 150*time.Millisecond)
	}
	c := dlock.New(backendOn(t, clients))
	t.Cleanup(func() { _ = c.Close() })
	// Warm up: the scripts are in every node's cache (a NOSCRIPT answer
	// after the stall would not be retried).
	if w, err := c.Mutex("redlock/warm-up").Lock(t.Context()); err != nil {
		t.Fatal(err)
	} else if err := w.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	busy := busyNode(t, nodes[2], 600*time.Millisecond) // > the 50ms node timeout
	l, err := c.Mutex(name, dlock.WithTTL(ttl)).Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	<-busy
	eventually(t, "node 2 runs the acquire that timed out", func() bool {
		n, _ := nodes[2].Exists(t.Context(), lockKey(name)).Result()
		return n == 1
	})
	f2, _ := nodes[2].HGet(t.Context(), lockKey(name), "fence").Result()
	t.Logf("lease fence %d; node 2 carries fence %s", l.Fence(), f2)
	if f2 == strconv.FormatUint(l.Fence(), 10) {
		t.Fatalf("node 2 carries the lease's fence %s: it drew 41 where the others drew 6, and nothing raises a node whose outcome was unknown", f2)
	}
	return servers, nodes, l
}

// A node whose acquire timed out on the client but ran on the server (an
// unknown outcome; the attempt won on the other nodes) holds the grant's
// token under the fence it drew itself: the attempt leaves such a node
// alone (lateAction: actNone), nothing raises it to the grant's fence.
// Unlock must still drop that hold (releases find it by token): otherwise
// the hold stays until its TTL, and with one other node down nobody can
// take the lock meanwhile, although it was released. (A release tied to the
// grant's fence, as on one Redis node, would leave it.)
func TestUnknownOutcomeNodeReleasedByUnlock(t *testing.T) {
	const name = "redlock/unknown-outcome"
	servers, nodes, l := lockWithUnknownOutcomeNode(t, name, 3*time.Second)
	other := newClient(t, servers)

	t.Logf("before Unlock: node 2 %v", lockFields(t, nodes, name)[2])
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	if left := leftovers(t, nodes, name); len(left) > 0 {
		t.Errorf("after Unlock, keys left on the nodes: %v (the hold of node 2 stays until its TTL)", left)
	}
	// With node 0 down, the stray hold on node 2 keeps everybody out until
	// it expires, although the lock was released.
	servers[0].Kill(t)
	if l2, err := other.Mutex(name, dlock.WithTTL(3*time.Second)).TryLock(t.Context()); err != nil {
		t.Errorf("TryLock after Unlock, node 0 down: %v", err)
	} else {
		_ = l2.Unlock(t.Context())
	}
}

// The same node (its acquire's outcome unknown to the client, its hold
// under a fence of its own) must count in renewals: when another node of
// the grant then goes down, two of three nodes still hold the lease's
// token, and the lease must live on (renewals tied to the grant's fence
// lost it).
func TestUnknownOutcomeNodeCountsInRenewals(t *testing.T) {
	const ttl = 1500 * time.Millisecond
	servers, _, l := lockWithUnknownOutcomeNode(t, "redlock/unknown-outcome-renew", ttl)
	servers[1].Kill(t)
	time.Sleep(2 * ttl)
	if err := l.Err(); err != nil {
		t.Errorf("lease lost with nodes 0 and 2 holding its token: %v", err)
	}
}
