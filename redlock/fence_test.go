package redlock_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/redlock"
)

// checkGrant checks, once the backend is idle, that every node holding the
// grant carries its fence and that a quorum has a counter at least that high.
func checkGrant(t *testing.T, b *redlock.Backend, nodes []*redis.Client, key, token string, fence uint64) {
	t.Helper()
	redlock.WaitIdle(b)
	fields := lockFields(t, nodes, key)
	cs := counters(t, nodes, key)
	high := 0
	for i := range nodes {
		if _, ok := fields[i][token]; ok && fields[i]["fence"] != strconv.FormatUint(fence, 10) {
			t.Errorf("node %d holds the grant with fence %s, want %d", i, fields[i]["fence"], fence)
		}
		if uint64(cs[i]) >= fence {
			high++
		}
	}
	if high < b.Quorum() {
		t.Errorf("counters %v: fewer than a quorum at fence %d or above", cs, fence)
	}
}

// The grant's fence is the highest of the winning nodes; a winning node with
// a lower counter gets it in a second round, and only that node.
func TestFenceIsHighestOfQuorum(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	b := newBackend(t, servers)
	setCounters(t, nodes, "k", 5, 3, 3)
	holdForeign(t, nodes[2], "k", "someone") // the quorum must be nodes 0 and 1
	// Load the scripts, so that the counts below see no NOSCRIPT retries.
	warm := request(t, "warm", time.Minute)
	mustAcquire(t, b, warm)
	mustRelease(t, b, "warm", warm.Token)
	redlock.WaitIdle(b)
	resetStats(t, nodes)

	req := request(t, "k", time.Minute)
	if res := mustAcquire(t, b, req); res.Fence != 6 {
		t.Fatalf("fence %d, want 6: the highest of the quorum's 6 and 4", res.Fence)
	}
	checkGrant(t, b, nodes, "k", req.Token, 6)
	if got := []int{scriptRuns(t, nodes[0]), scriptRuns(t, nodes[1])}; got[0] != 1 || got[1] != 2 {
		t.Errorf("scripts run on nodes 0 and 1: %v, want [1 2] (acquire; acquire and raise)", got)
	}
}

// When the nodes agree, as they do while all are up, there is no second
// round trip.
func TestNoFenceRoundWhenNodesAgree(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	b := newBackend(t, servers)
	warm := request(t, "warm", time.Minute)
	mustAcquire(t, b, warm)
	mustRelease(t, b, "warm", warm.Token)
	redlock.WaitIdle(b)
	setCounters(t, nodes, "k", 41, 41, 41)
	resetStats(t, nodes)

	req := request(t, "k", time.Minute)
	if res := mustAcquire(t, b, req); res.Fence != 42 {
		t.Fatalf("fence %d, want 42", res.Fence)
	}
	checkGrant(t, b, nodes, "k", req.Token, 42)
	for i, n := range nodes {
		if got := scriptRuns(t, n); got != 1 {
			t.Errorf("node %d ran %d scripts, want 1: the acquire alone", i, got)
		}
	}
}

// Fences strictly increase while the nodes' counters diverge and the
// quorums change, also when the node with the highest counter is left out
// of a quorum and comes back later.
func TestFencesIncreaseAcrossChangingQuorums(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	b := newBackend(t, servers)
	setCounters(t, nodes, "k", 100, 3, 3)

	var last uint64
	// Which node is held by someone else in each round (-1: none), so that
	// the winning quorum changes: first without the highest node.
	for round, blocked := range []int{0, 1, 2, -1, 0, 0, 2, 1, -1, 1, 0, 2} {
		if blocked >= 0 {
			holdForeign(t, nodes[blocked], "k", "someone")
		}
		req := request(t, "k", time.Minute)
		res := mustAcquire(t, b, req)
		if res.Fence <= last {
			t.Fatalf("round %d (node %d blocked): fence %d after %d, want strictly greater", round, blocked, res.Fence, last)
		}
		last = res.Fence
		checkGrant(t, b, nodes, "k", req.Token, res.Fence)
		mustRelease(t, b, "k", req.Token)
		if blocked >= 0 {
			nodes[blocked].Del(t.Context(), lockKey("k"))
		}
		t.Logf("round %d, node %d blocked: fence %d, counters %v", round, blocked, res.Fence, counters(t, nodes, "k"))
	}
	if last <= 100 {
		t.Errorf("last fence %d: the highest counter never entered a quorum", last)
	}
}

// A re-entry keeps the grant's fence while a quorum of nodes re-enters that
// grant alike, fails and is undone when fewer do, and a hold the client does
// not know of (Joining 0) never passes for a re-entry.
func TestReentryKeepsFence(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	b := newBackend(t, servers)
	setCounters(t, nodes, "k", 3, 3, 3)
	req := request(t, "k", time.Minute)
	req.Reentrant = true

	first := mustAcquire(t, b, req)
	redlock.WaitIdle(b)
	again := req
	again.Joining = first.Fence
	second := mustAcquire(t, b, again)
	if second.Fence != first.Fence || second.Holds != 2 {
		t.Errorf("re-entry = %+v, want fence %d and 2 holds", second, first.Fence)
	}
	redlock.WaitIdle(b)

	// Node 2 loses its grant. Nodes 0 and 1, a quorum, still re-enter it
	// alike: the re-entry stands, and node 2 joins it with its fence.
	nodes[2].Del(t.Context(), lockKey("k"))
	third := mustAcquire(t, b, again)
	if third.Fence != first.Fence || third.Holds != 3 {
		t.Errorf("re-entry with a node granting afresh = %+v, want fence %d and 3 holds", third, first.Fence)
	}
	redlock.WaitIdle(b)
	checkGrant(t, b, nodes, "k", req.Token, first.Fence)

	// Nodes 1 and 2 lose the grant: at most node 0 re-enters, fewer than a
	// quorum. Either node 0 answers among the first two and the attempt fails
	// and is undone, or nodes 1 and 2 decide it first and it is a fresh
	// grant with a new fence; never a re-entry with the old fence.
	nodes[1].Del(t.Context(), lockKey("k"))
	nodes[2].Del(t.Context(), lockKey("k"))
	setCounters(t, nodes[1:], "k", 50, 50)
	res, err := b.Acquire(t.Context(), again)
	redlock.WaitIdle(b)
	switch {
	case err != nil:
		if f := lockFields(t, nodes, "k"); f[0][req.Token] != "3" || len(f[1]) > 0 || len(f[2]) > 0 {
			t.Errorf("after the failed re-entry: nodes hold %v, want node 0 back at 3 holds and nothing elsewhere", f)
		}
	case !res.Acquired || res.Fence != 51:
		t.Fatalf("re-entry confirmed by at most one node = %+v, want an error or a fresh grant with fence 51", res)
	default:
		checkGrant(t, b, nodes, "k", req.Token, 51)
	}

	// A hold of the token that the client does not know of (Joining 0), a
	// stray of an attempt whose outcome was unknown, never passes for a
	// re-entry: the acquire is a fresh grant with a higher fence.
	for _, n := range nodes {
		n.Del(t.Context(), lockKey("k"))
	}
	nodes[0].HSet(t.Context(), lockKey("k"), req.Token, 1, "owner", req.Owner, "fence", 7)
	nodes[0].PExpire(t.Context(), lockKey("k"), time.Minute)
	setCounters(t, nodes, "k", 60, 60, 60)
	fresh := mustAcquire(t, b, req)
	if fresh.Fence != 61 {
		t.Errorf("acquire over a stray hold: fence %d, want 61, a new grant", fresh.Fence)
	}
	redlock.WaitIdle(b)
	checkGrant(t, b, nodes, "k", req.Token, fresh.Fence)
}
