package redlock_test

import (
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/redlock"
)

// waitRequest is an acquire request for key with a fresh token, of a
// caller that waits (dlock's Lock).
func waitRequest(t *testing.T, key string, ttl time.Duration) driver.AcquireRequest {
	t.Helper()
	req := request(t, key, ttl)
	req.Wait, req.QueueTTL = true, ttl
	return req
}

// refuse makes one acquire attempt of req, which must be refused.
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

// TestContendedKeyAsksLeaderFirst checks that once a key is contended, a
// waiter's attempt that the holder refuses costs one node call, always on
// the same node (the key's leader), where it queues, instead of one call
// per node: every waiter woken then tries at the price of one round trip,
// and contenders can no longer split the nodes between them. After the
// release the leader's queue decides who goes first: the head is granted,
// on every node, and a waiter behind it is told to look again soon.
func TestContendedKeyAsksLeaderFirst(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	b := newBackend(t, servers)
	const key = "hot"
	holder := request(t, key, 10*time.Second)
	mustAcquire(t, b, holder)

	// The first refusal asks every node and marks the key contended.
	first := refuse(t, b, waitRequest(t, key, 10*time.Second))
	if first.Holder != holder.Owner || first.HolderTTL <= 0 {
		t.Errorf("first refusal: %+v, want holder %q with a TTL", first, holder.Owner)
	}
	// Let the first attempt finish on the node it did not wait for.
	redlock.WaitIdle(b)
	resetStats(t, nodes)
	var waiters []driver.AcquireRequest
	for i := range 5 {
		w := waitRequest(t, key, 10*time.Second)
		res := refuse(t, b, w)
		if res.Holder != holder.Owner || res.HolderTTL <= 0 || res.HolderTTL > 10*time.Second || !res.Queued || res.Position != i+1 {
			t.Errorf("waiter %d refused by the leader: %+v, want holder %q with a TTL of at most 10s, queued at %d", i, res, holder.Owner, i+1)
		}
		waiters = append(waiters, w)
	}
	runs := scriptsByNode(t, b, nodes)
	if !slices.Contains(runs, len(waiters)) || runs[0]+runs[1]+runs[2] != len(waiters) {
		t.Errorf("scripts per node for %d refused attempts: %v, want %[1]d on one node", len(waiters), runs)
	}

	mustRelease(t, b, key, holder.Token)
	// Free, but promised to the head: the second is told to look again soon.
	res := refuse(t, b, waiters[1])
	if res.Holder != "" || res.HolderTTL <= 0 || res.HolderTTL > 100*time.Millisecond || !res.Queued || res.Position != 2 {
		t.Errorf("the second waiter while the head is promised the lock: %+v, want no holder, a short HolderTTL, queued second", res)
	}
	mustAcquire(t, b, waiters[0])
	redlock.WaitIdle(b)
	for i, f := range lockFields(t, nodes, key) {
		if f["owner"] != waiters[0].Owner {
			t.Errorf("node %d after the head's grant: %v, want held by %q", i, f, waiters[0].Owner)
		}
	}
	for _, w := range waiters {
		mustRelease(t, b, key, w.Token)
	}
	redlock.WaitIdle(b)
	checkClean(t, b, nodes, key)
}

// TestPromisedToADeadHead checks that a head that does not come for the
// lock holds the others up for about promisedGrace, not for its entry's
// time to live: after that, a waiter's request ignores the queue.
func TestPromisedToADeadHead(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	b := newBackend(t, servers)
	const key = "hot"
	holder := request(t, key, 10*time.Second)
	mustAcquire(t, b, holder)
	refuse(t, b, request(t, key, 10*time.Second))
	dead, live := waitRequest(t, key, 10*time.Second), waitRequest(t, key, 10*time.Second)
	refuse(t, b, dead) // queued first on the leader
	refuse(t, b, live)
	mustRelease(t, b, key, holder.Token)
	start := time.Now()
	for {
		res, err := b.Acquire(t.Context(), live)
		if err != nil {
			t.Fatal(err)
		}
		if res.Acquired {
			break
		}
		if res.Holder != "" {
			t.Fatalf("refused by %q while the lock is free", res.Holder)
		}
		if time.Since(start) > 2*time.Second {
			t.Fatalf("not granted %v after the release, promised to a head that does not come", time.Since(start))
		}
		time.Sleep(res.HolderTTL)
	}
	mustRelease(t, b, key, live.Token)
	mustRelease(t, b, key, dead.Token)
	redlock.WaitIdle(b)
	checkClean(t, b, nodes, key)
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
	// Let the first attempt finish on the node it did not wait for.
	redlock.WaitIdle(b)
	resetStats(t, nodes)
	queued := waitRequest(t, key, 10*time.Second)
	refuse(t, b, queued)
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
	next := waitRequest(t, key, 10*time.Second)
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
	other := waitRequest(t, key, 10*time.Second)
	refuse(t, b, other)
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
	mustRelease(t, b, key, other.Token)
	mustRelease(t, b, key, queued.Token)
}

// TestHoldOnTheLeaderAlone checks that a hold that only the leader has
// (a contender that won the leader and died before undoing it) keeps a
// waiter out for about a second, not for that hold's TTL, while a quorum
// of the other nodes is free.
func TestHoldOnTheLeaderAlone(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	b := newBackend(t, servers)
	const key = "hot"
	holder := request(t, key, 10*time.Second)
	mustAcquire(t, b, holder)
	refuse(t, b, request(t, key, 10*time.Second)) // contended from now on
	// Let the first attempt finish on the node it did not wait for.
	redlock.WaitIdle(b)
	resetStats(t, nodes)
	w := waitRequest(t, key, 10*time.Second)
	refuse(t, b, w)
	lead := slices.IndexFunc(scriptsByNode(t, b, nodes), func(n int) bool { return n > 0 })
	mustRelease(t, b, key, holder.Token)
	mustRelease(t, b, key, w.Token)
	holdForeign(t, nodes[lead], key, "ghost") // for a minute

	start := time.Now()
	for {
		res, err := b.Acquire(t.Context(), w)
		if err != nil {
			t.Fatal(err)
		}
		if res.Acquired {
			break
		}
		if res.Holder != "ghost" {
			t.Fatalf("refused by %q, want the leader's ghost", res.Holder)
		}
		if time.Since(start) > 3*time.Second {
			t.Fatalf("still refused by the leader's ghost after %v, with the other nodes free", time.Since(start))
		}
		time.Sleep(100 * time.Millisecond) // a waiter's retry pace
	}
	if took := time.Since(start); took < 900*time.Millisecond {
		t.Errorf("granted after %v: a waiter went past the leader's hold before it had lasted a second", took)
	}
	for i, f := range lockFields(t, nodes, key) {
		if i != lead && f["owner"] != w.Owner {
			t.Errorf("node %d: %v, want held by the waiter", i, f)
		}
	}
	mustRelease(t, b, key, w.Token)
}
