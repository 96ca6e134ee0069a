package redlock_test

import (
	"errors"
	"fmt"
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

// lockWithUnknownOutcomeNode locks a name made from prefix with TTL ttl on
// three nodes while node 2 stalls past the node timeout: the grant is made
// on nodes 0 and 1, and node 2 runs the acquire that timed out later,
// under a fence of its own (the counters are 5, 5 and 40). It returns the
// servers, the admin clients of the nodes, the name and the lease.
//
// On a loaded machine the client may not even send node 2 its acquire
// before the attempt stops waiting for it; then node 2 runs nothing, the
// lease is given back and the set-up is tried again on another name.
func lockWithUnknownOutcomeNode(t *testing.T, prefix string, ttl time.Duration) ([]*testserver.Redis, []*redis.Client, string, *dlock.Lease) {
	t.Helper()
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
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
	const attempts = 5
	for i := range attempts {
		name := fmt.Sprintf("%s-%d", prefix, i)
		// The nodes' counters differ (failed attempts, a node that was
		// down): node 2 draws a fence of its own.
		setCounters(t, nodes, name, 5, 5, 40)
		busy := busyNode(t, nodes[2], 600*time.Millisecond) // > the 50ms node timeout
		l, err := c.Mutex(name, dlock.WithTTL(ttl)).Lock(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		<-busy
		ran := false
		for deadline := time.Now().Add(time.Second); !ran && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			n, _ := nodes[2].Exists(t.Context(), lockKey(name)).Result()
			ran = n == 1
		}
		if !ran {
			t.Logf("attempt %d: node 2 did not run the acquire that timed out; trying again", i+1)
			if err := l.Unlock(t.Context()); err != nil {
				t.Fatal(err)
			}
			continue
		}
		f2, _ := nodes[2].HGet(t.Context(), lockKey(name), "fence").Result()
		t.Logf("lease fence %d; node 2 carries fence %s", l.Fence(), f2)
		if f2 == strconv.FormatUint(l.Fence(), 10) {
			t.Fatalf("node 2 carries the lease's fence %s: it drew 41 where the others drew 6, and nothing raises a node whose outcome was unknown", f2)
		}
		return servers, nodes, name, l
	}
	t.Fatalf("node 2 never ran an acquire that timed out, in %d attempts", attempts)
	return nil, nil, "", nil
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
	// The TTL outlasts the wait below: a hold left by Unlock would still
	// be there when it gives up.
	servers, nodes, name, l := lockWithUnknownOutcomeNode(t, "redlock/unknown-outcome", 30*time.Second)
	other := newClient(t, servers)

	t.Logf("before Unlock: node 2 %v", lockFields(t, nodes, name)[2])
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	// Unlock returns once a quorum answered; a slow node's release lands
	// after it.
	eventually(t, "Unlock's releases leave no key of the lock on any node", func() bool {
		return len(leftovers(t, nodes, name)) == 0
	})
	// With node 0 down, the stray hold on node 2 keeps everybody out until
	// it expires, although the lock was released.
	servers[0].Kill(t)
	if l2, err := other.Mutex(name, dlock.WithTTL(30*time.Second)).TryLock(t.Context()); err != nil {
		t.Errorf("TryLock after Unlock, node 0 down: %v", err)
	} else {
		_ = l2.Unlock(t.Context())
	}
}

// The same node (its acquire's outcome unknown to the client, its hold
// under a fence of its own) must count in renewals: when another node of
// the grant then goes down, two of three nodes still hold the lease's
// token, and a renewal must succeed (renewals tied to the grant's fence
// lost the lease). A renewal that times out on a loaded machine is tried
// again: the TTL leaves the lease far more time than that takes.
func TestUnknownOutcomeNodeCountsInRenewals(t *testing.T) {
	servers, _, _, l := lockWithUnknownOutcomeNode(t, "redlock/unknown-outcome-renew", 30*time.Second)
	servers[1].Kill(t)
	const tries = 100
	var err error
	for range tries {
		if err = l.Refresh(t.Context()); err == nil || errors.Is(err, dlock.ErrNotHeld) {
			break
		}
	}
	if err != nil {
		t.Fatalf("renewal with nodes 0 and 2 holding the lease's token (up to %d tries): %v", tries, err)
	}
	if err := l.Err(); err != nil {
		t.Errorf("lease lost with nodes 0 and 2 holding its token: %v", err)
	}
}
