package redlock_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/redlock"
)

// refuse makes one acquire attempt of req, which another owner's hold
// must refuse.
func refuse(t *testing.T, b *redlock.Backend, req driver.AcquireRequest) driver.AcquireResult {
	t.Helper()
	res, err := b.Acquire(t.Context(), req)
	if err != nil || res.Acquired {
		t.Fatalf("Acquire(%q) = %+v, %v; want refused", req.Key, res, err)
	}
	return res
}

// scriptsByNode returns how many scripts ran on each node since the last
// resetStats.
func scriptsByNode(t *testing.T, b *redlock.Backend, nodes []*redis.Client) []int {
	t.Helper()
	redlock.WaitIdle(b)
	out := make([]int, len(nodes))
	for i, n := range nodes {
		out[i] = scriptRuns(t, n)
	}
	return out
}

// TestContendedKeyAsksLeaderFirst checks that once a key is contended, an
// attempt that its holder refuses costs one node call, always on the same
// node, instead of one call per node: every waiter that a release wakes
// then tries at the price of one round trip, and contenders can no longer
// split the nodes between them. A grant still takes a quorum.
func TestContendedKeyAsksLeaderFirst(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	b := newBackend(t, servers)
	const key = "hot"
	holder := request(t, key, 10*time.Second)
	mustAcquire(t, b, holder)

	// The first refusal asks every node and marks the key contended.
	first := refuse(t, b, request(t, key, 10*time.Second))
	if first.Holder != holder.Owner || first.HolderTTL <= 0 {
		t.Errorf("first refusal: %+v, want holder %q with a TTL", first, holder.Owner)
	}
	resetStats(t, nodes)
	const waiters = 5
	for range waiters {
		res := refuse(t, b, request(t, key, 10*time.Second))
		if res.Holder != holder.Owner || res.HolderTTL <= 0 || res.HolderTTL > 10*time.Second {
			t.Errorf("refusal by the leader: %+v, want holder %q with a TTL of at most 10s", res, holder.Owner)
		}
	}
	runs := scriptsByNode(t, b, nodes)
	total, busiest := 0, 0
	for _, r := range runs {
		total += r
		busiest = max(busiest, r)
	}
	if total != waiters || busiest != waiters {
		t.Errorf("scripts per node for %d refused attempts: %v, want %d on one node", waiters, runs, waiters)
	}

	// Released, the next contender is granted on every node.
	mustRelease(t, b, key, holder.Token)
	next := request(t, key, 10*time.Second)
	mustAcquire(t, b, next)
	redlock.WaitIdle(b)
	for i, f := range lockFields(t, nodes, key) {
		if len(f) == 0 || f["owner"] != next.Owner {
			t.Errorf("node %d after the grant: %v, want held by %q", i, f, next.Owner)
		}
	}
	mustRelease(t, b, key, next.Token)
}

// TestLeaderDownAsksTheOthers checks that a contended key whose leader is
// down is still granted on a quorum of the other nodes, and that the next
// attempts pass the failed leader over.
func TestLeaderDownAsksTheOthers(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	b := newBackend(t, servers)
	const key = "hot"
	holder := request(t, key, 10*time.Second)
	mustAcquire(t, b, holder)
	refuse(t, b, request(t, key, 10*time.Second)) // contended from now on
	resetStats(t, nodes)
	refuse(t, b, request(t, key, 10*time.Second))
	lead := -1
	for i, r := range scriptsByNode(t, b, nodes) {
		if r > 0 {
			lead = i
		}
	}
	if lead < 0 {
		t.Fatal("no node ran the refused attempt")
	}
	mustRelease(t, b, key, holder.Token)
	servers[lead].Stop(t)

	start := time.Now()
	next := request(t, key, 10*time.Second)
	mustAcquire(t, b, next)
	if took := time.Since(start); took > time.Second {
		t.Errorf("grant with the leader down took %v", took)
	}
	// The leader is passed over now: a refused attempt asks another node.
	for i, n := range nodes {
		if i != lead {
			resetStats(t, []*redis.Client{n})
		}
	}
	refuse(t, b, request(t, key, 10*time.Second))
	asked := 0
	for i, n := range nodes {
		if i != lead {
			asked += scriptRuns(t, n)
		}
	}
	if asked != 1 {
		t.Errorf("refused attempt with the leader down ran %d scripts on the live nodes, want 1", asked)
	}
	mustRelease(t, b, key, next.Token)
}
