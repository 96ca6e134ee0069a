package redlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/redlock"
)

func sharedKey(key string) string { return lockKey(key) + ":s" }
func intentKey(key string) string { return lockKey(key) + ":w" }

// reader is a shared acquire request for key with a fresh token.
func reader(t *testing.T, key, owner string, ttl time.Duration) driver.AcquireRequest {
	t.Helper()
	return driver.AcquireRequest{Key: key, Token: newToken(t), Owner: owner, TTL: ttl, Mode: driver.Shared}
}

// writer is an exclusive request for key that waits (records a writer
// intent when readers refuse it).
func writer(t *testing.T, key, owner string, ttl time.Duration) driver.AcquireRequest {
	t.Helper()
	return driver.AcquireRequest{Key: key, Token: newToken(t), Owner: owner, TTL: ttl, Wait: true, QueueTTL: 5 * time.Second}
}

func mustRefuse(t *testing.T, b *redlock.Backend, req driver.AcquireRequest) driver.AcquireResult {
	t.Helper()
	res, err := b.Acquire(t.Context(), req)
	if err != nil || res.Acquired {
		t.Fatalf("%v Acquire(%q) by %s = %+v, %v; want refused, nil error", req.Mode, req.Key, req.Owner, res, err)
	}
	return res
}

// sharedOn reports, per node, whether token has a shared hold of key there.
func sharedOn(t *testing.T, nodes []*redis.Client, key, token string) []bool {
	t.Helper()
	out := make([]bool, len(nodes))
	for i, n := range nodes {
		_, err := n.ZScore(t.Context(), sharedKey(key), token).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatalf("node %d: ZSCORE: %v", i, err)
		}
		out[i] = err == nil
	}
	return out
}

func countTrue(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// checkClean waits for the backend's background work and checks that
// nothing but fence counters is left of key on any node.
func checkClean(t *testing.T, b *redlock.Backend, nodes []*redis.Client, key string) {
	t.Helper()
	redlock.WaitIdle(b)
	if left := leftovers(t, nodes, key); len(left) > 0 {
		t.Errorf("left on the nodes: %v", left)
	}
}

// nodeBackends returns a single-node redislock backend per node, to set up
// states that only a failure could leave behind.
func nodeBackends(nodes []*redis.Client) []*redislock.Backend {
	out := make([]*redislock.Backend, len(nodes))
	for i, n := range nodes {
		out[i] = redislock.New(n)
	}
	return out
}

// A reader on a name whose nodes hold a semaphore's permits (left by a
// redislock client of the same prefix; redlock grants none) is refused as
// a conflict when those nodes block every quorum, and the dlock client
// turns that into a *dlock.ConflictError; permits on a minority of nodes
// do not stop it.
func TestReaderConflictsWithPermits(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	b := newBackend(t, servers)
	plant := func(key string, on []*redislock.Backend) {
		t.Helper()
		for _, nb := range on {
			req := reader(t, key, "foreign permit", time.Minute)
			req.Limit = 3
			if res, err := nb.Acquire(t.Context(), req); err != nil || !res.Acquired {
				t.Fatalf("planting a permit: %+v, %v", res, err)
			}
		}
	}
	per := nodeBackends(nodes)
	plant("k", per[:2])
	res, err := b.Acquire(t.Context(), reader(t, "k", "reader", time.Minute))
	if err != nil || res.Acquired || !res.Conflict || res.HeldLimit != 3 || res.Holder != "foreign permit" {
		t.Fatalf("reader beside permits on 2 of 3 nodes = %+v, %v; want a conflict with limit 3", res, err)
	}
	c := dlock.New(b)
	defer c.Close()
	_, err = c.RWMutex("k").TryRLock(t.Context())
	var ce *dlock.ConflictError
	if !errors.As(err, &ce) || ce.HeldPermits != 3 || !errors.Is(err, dlock.ErrConflict) {
		t.Fatalf("TryRLock beside permits = %v, want a *dlock.ConflictError", err)
	}

	plant("m", per[:1])
	if res := mustAcquire(t, b, reader(t, "m", "reader", time.Minute)); !res.Acquired {
		t.Fatalf("reader beside permits on 1 of 3 nodes = %+v, want granted on the other two", res)
	}
}

func TestSupportsReadWriteLocksOnly(t *testing.T) {
	servers := startNodes(t, 3)
	b := newBackend(t, servers)
	for c, want := range map[driver.Capability]bool{driver.CapShared: true, driver.CapSemaphore: false, driver.CapFair: false} {
		if got := b.Supports(c); got != want {
			t.Errorf("Supports(%v) = %v, want %v", c, got, want)
		}
	}
	permit := reader(t, "k", "permit", time.Minute)
	permit.Limit = 2
	fair := request(t, "k", time.Minute)
	fair.Fair = true
	reentrant := reader(t, "k", "r", time.Minute)
	reentrant.Reentrant = true
	mode := request(t, "k", time.Minute)
	mode.Mode = driver.Mode(7)
	for what, req := range map[string]driver.AcquireRequest{
		"semaphore": permit, "fair": fair, "reentrant reader": reentrant, "unknown mode": mode,
	} {
		res, err := b.Acquire(t.Context(), req)
		if !errors.Is(err, dlock.ErrInvalid) || res.Acquired || !strings.HasPrefix(err.Error(), "redlock: ") {
			t.Errorf("%s: Acquire = %+v, %v; want an error wrapping dlock.ErrInvalid", what, res, err)
		}
	}
	checkClean(t, b, admins(t, servers), "k")

	// The dlock client refuses semaphores and fair locks on Redlock.
	c := newClient(t, servers)
	if _, err := c.Semaphore("k", 2).TryAcquire(t.Context()); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Semaphore.TryAcquire = %v, want ErrInvalid", err)
	}
	if _, err := c.Mutex("k", dlock.Fair()).TryLock(t.Context()); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("fair Mutex.TryLock = %v, want ErrInvalid", err)
	}
}

// Readers hold at once, on every node, with fences that grow; a writer is
// refused by them and told to wait for the reader that expires last, not to
// retry at once; once they are gone it is granted with a larger fence.
func TestReadersShareAndExcludeWriter(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	b := newBackend(t, servers)

	r1, r2 := reader(t, "k", "reader-1", 20*time.Second), reader(t, "k", "reader-2", 30*time.Second)
	g1 := mustAcquire(t, b, r1)
	g2 := mustAcquire(t, b, r2)
	if g1.Fence != 1 || g2.Fence != 2 || g1.Holds != 1 || g2.Holds != 1 {
		t.Errorf("reader grants %+v, %+v; want fences 1 and 2, one hold each", g1, g2)
	}
	redlock.WaitIdle(b)
	for _, r := range []driver.AcquireRequest{r1, r2} {
		if on := sharedOn(t, nodes, "k", r.Token); countTrue(on) != 3 {
			t.Errorf("%s holds on nodes %v, want every node", r.Owner, on)
		}
	}

	res := mustRefuse(t, b, request(t, "k", time.Minute))
	if res.Holder != "reader-2" || res.HolderTTL < 25*time.Second || res.Shared != 2 || res.WriterWaiting || res.Queued {
		t.Errorf("writer refused with %+v; want reader-2 (expiring last) for about 30s, Shared 2, nothing queued", res)
	}

	for _, r := range []driver.AcquireRequest{r1, r2} {
		if held, err := b.Renew(t.Context(), "k", r.Token, 40*time.Second); err != nil || !held {
			t.Errorf("Renew(%s) = %v, %v; want held", r.Owner, held, err)
		}
	}
	got := b.RenewBatch(t.Context(), []driver.RenewRequest{{Key: "k", Token: r1.Token, TTL: time.Minute}, {Key: "k", Token: "nobody", TTL: time.Minute}})
	if len(got) != 2 || !got[0].Held || got[0].Err != nil || got[1].Held || got[1].Err != nil {
		t.Errorf("RenewBatch = %+v; want the reader renewed and nobody not held", got)
	}
	for _, r := range []driver.AcquireRequest{r1, r2} {
		if got := mustRelease(t, b, "k", r.Token); !got.Held || got.Remaining != 0 {
			t.Errorf("Release(%s) = %+v, want held with nothing remaining", r.Owner, got)
		}
	}
	if got := mustRelease(t, b, "k", r1.Token); got.Held {
		t.Errorf("second Release = %+v, want not held", got)
	}
	w := request(t, "k", time.Minute)
	if g := mustAcquire(t, b, w); g.Fence != 3 {
		t.Errorf("writer's fence %d after the readers' 1 and 2, want 3", g.Fence)
	}
	mustRelease(t, b, "k", w.Token)
	checkClean(t, b, nodes, "k")
}

// A writer refuses readers, who are told to wait for it.
func TestWriterExcludesReaders(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	b := newBackend(t, servers)
	w := request(t, "k", 20*time.Second)
	fence := mustAcquire(t, b, w).Fence

	res := mustRefuse(t, b, reader(t, "k", "reader", time.Minute))
	if res.Holder != w.Owner || res.HolderTTL < 15*time.Second || res.WriterWaiting || res.Queued {
		t.Errorf("reader refused with %+v; want the writer %q for about 20s", res, w.Owner)
	}
	mustRelease(t, b, "k", w.Token)
	r := reader(t, "k", "reader", time.Minute)
	if g := mustAcquire(t, b, r); g.Fence <= fence {
		t.Errorf("reader's fence %d after the writer's %d", g.Fence, fence)
	}
	mustRelease(t, b, "k", r.Token)
	checkClean(t, b, nodes, "k")
}

// With a minority of nodes down, readers still share and exclude writers.
func TestReadersWithANodeDown(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	b := newBackend(t, servers)
	servers[2].Kill(t)

	r1, r2 := reader(t, "k", "reader-1", time.Minute), reader(t, "k", "reader-2", time.Minute)
	mustAcquire(t, b, r1)
	mustAcquire(t, b, r2)
	waiting := writer(t, "k", "writer", time.Minute)
	res := mustRefuse(t, b, waiting)
	if !strings.HasPrefix(res.Holder, "reader-") || res.HolderTTL < 50*time.Second || res.Shared != 2 || !res.Queued {
		t.Errorf("writer refused with %+v; want a reader for about a minute, Shared 2, queued", res)
	}
	mustRelease(t, b, "k", waiting.Token) // it gives up
	if held, err := b.Renew(t.Context(), "k", r1.Token, time.Minute); err != nil || !held {
		t.Errorf("Renew with a node down = %v, %v; want held", held, err)
	}
	mustRelease(t, b, "k", r1.Token)
	mustRelease(t, b, "k", r2.Token)
	w := request(t, "k", time.Minute)
	mustAcquire(t, b, w)
	mustRefuse(t, b, reader(t, "k", "reader-3", time.Minute))
	mustRelease(t, b, "k", w.Token)
	checkClean(t, b, nodes[:2], "k")
}

// A reader that wins only a minority of nodes is undone on them, without
// waking anyone, and told who holds the quorum.
func TestReaderOnMinorityIsUndone(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	b := newBackend(t, servers)
	holdForeign(t, nodes[0], "k", "alpha")
	holdForeign(t, nodes[1], "k", "alpha")
	// Load the scripts on node 2, then count from here.
	warm := reader(t, "warm", "warm", time.Minute)
	mustAcquire(t, b, warm)
	mustRelease(t, b, "warm", warm.Token)
	redlock.WaitIdle(b)
	resetStats(t, nodes)

	r := reader(t, "k", "reader", time.Minute)
	res := mustRefuse(t, b, r)
	if res.Holder != "alpha" || res.HolderTTL < 50*time.Second {
		t.Errorf("reader refused with %+v; want alpha for about a minute", res)
	}
	redlock.WaitIdle(b)
	if on := sharedOn(t, nodes, "k", r.Token); countTrue(on) != 0 {
		t.Errorf("the refused reader still holds nodes %v", on)
	}
	if n := commandCalls(t, nodes[2])["publish"]; n != 0 {
		t.Errorf("undoing the reader's grant published %d release(s)", n)
	}
	for _, n := range nodes[:2] {
		n.Del(t.Context(), lockKey("k"))
	}
	checkClean(t, b, nodes, "k")
}

// Several readers, reported by different nodes, block a writer: that is not
// a split vote between contenders, so the writer is told to wait for them,
// not to retry within a node timeout for as long as they hold.
func TestReadersOnDifferentNodesAreNotASplit(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	b := newBackend(t, servers)
	single := nodeBackends(nodes)
	// Each node reports the reader that expires last there: a different
	// one on each node.
	for i, owner := range []string{"reader-a", "reader-b", "reader-c"} {
		for j, n := range single {
			ttl := 20 * time.Second
			if j == i {
				ttl = 30 * time.Second
			}
			req := driver.AcquireRequest{Key: "k", Token: owner, Owner: owner, TTL: ttl, Mode: driver.Shared}
			if res, err := n.Acquire(t.Context(), req); err != nil || !res.Acquired {
				t.Fatalf("node %d: shared acquire = %+v, %v", j, res, err)
			}
		}
	}
	w := writer(t, "k", "writer", time.Minute)
	res := mustRefuse(t, b, w)
	if !strings.HasPrefix(res.Holder, "reader-") || res.HolderTTL < 25*time.Second || res.Shared != 3 || !res.Queued {
		t.Errorf("writer refused with %+v; want a reader for about 30s (not a short retry), Shared 3, queued", res)
	}
	for _, owner := range []string{"reader-a", "reader-b", "reader-c"} {
		mustRelease(t, b, "k", owner)
	}
	mustAcquire(t, b, w)
	mustRelease(t, b, "k", w.Token)
	checkClean(t, b, nodes, "k")
}

// With an even number of nodes, readers on half of them and a writer on
// the other half block each other without either holding a quorum: the
// readers are contenders then, and the writer retries soon.
func TestEvenSplitWithReadersIsContention(t *testing.T) {
	servers := startNodes(t, 4)
	nodes := admins(t, servers)
	b := newBackend(t, servers)
	single := nodeBackends(nodes)
	for _, n := range single[:2] {
		req := driver.AcquireRequest{Key: "k", Token: "stray", Owner: "stray", TTL: time.Minute, Mode: driver.Shared}
		if res, err := n.Acquire(t.Context(), req); err != nil || !res.Acquired {
			t.Fatalf("shared acquire = %+v, %v", res, err)
		}
	}
	res := mustRefuse(t, b, request(t, "k", time.Minute))
	if res.HolderTTL <= 0 || res.HolderTTL > redlock.DefaultNodeTimeout {
		t.Errorf("HolderTTL = %v, want a short delay within the node timeout", res.HolderTTL)
	}
	mustRelease(t, b, "k", "stray")
	checkClean(t, b, nodes, "k")
}

// A waiting writer's intent keeps new readers out, on a quorum, until it is
// granted or gives up; readers that hold keep holding and renewing.
func TestWriterIntentBlocksNewReaders(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	b := newBackend(t, servers)

	r1 := reader(t, "k", "reader-1", time.Minute)
	mustAcquire(t, b, r1)
	redlock.WaitIdle(b) // the reader holds every node, not only a quorum
	w := writer(t, "k", "writer", time.Minute)
	res := mustRefuse(t, b, w)
	if res.Holder != "reader-1" || !res.Queued || res.Shared != 1 {
		t.Errorf("writer refused with %+v; want reader-1, Shared 1, queued", res)
	}
	redlock.WaitIdle(b)
	for i, n := range nodes {
		if got := n.HGet(t.Context(), intentKey("k"), "t").Val(); got != w.Token {
			t.Errorf("node %d: writer intent %q, want the writer's token", i, got)
		}
	}
	r2 := reader(t, "k", "reader-2", time.Minute)
	res = mustRefuse(t, b, r2)
	if !res.WriterWaiting || res.Holder != "writer" || res.HolderTTL <= 0 || res.HolderTTL > 5*time.Second || res.Queued {
		t.Errorf("reader refused with %+v; want the waiting writer, for at most its 5s intent", res)
	}
	if held, err := b.Renew(t.Context(), "k", r1.Token, time.Minute); err != nil || !held {
		t.Errorf("reader's Renew with a writer waiting = %v, %v; want held", held, err)
	}
	info, ok, err := b.Inspect(t.Context(), "k")
	if err != nil || !ok || !info.WriterWaiting || len(info.Shared) != 1 || info.Owner != "" {
		t.Errorf("Inspect = %+v, %v, %v; want reader-1 and a writer waiting", info, ok, err)
	}

	// The writer gives up: its intent goes, and readers come in again.
	mustRelease(t, b, "k", w.Token)
	mustAcquire(t, b, r2)
	// It waits again, with a new token as every Lock call draws (the token
	// that gave up is refused for a while: a request of it may still be on
	// its way); once the readers leave, it is granted and its intent is
	// gone.
	w = writer(t, "k", "writer", time.Minute)
	mustRefuse(t, b, w)
	mustRelease(t, b, "k", r1.Token)
	mustRelease(t, b, "k", r2.Token)
	mustAcquire(t, b, w)
	redlock.WaitIdle(b)
	for i, n := range nodes {
		if n.Exists(t.Context(), intentKey("k")).Val() != 0 {
			t.Errorf("node %d: writer intent left after its grant", i)
		}
	}
	mustRelease(t, b, "k", w.Token)
	checkClean(t, b, nodes, "k")
}

// A reader that never releases blocks writers until its TTL runs out on
// the nodes, and leaves nothing behind.
func TestCrashedReaderExpires(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	b := newBackend(t, servers)
	mustAcquire(t, b, reader(t, "k", "crashed", 300*time.Millisecond))
	w := request(t, "k", time.Minute)
	eventually(t, "the writer is granted", func() bool {
		res, err := b.Acquire(t.Context(), w)
		if err != nil {
			t.Fatal(err)
		}
		return res.Acquired
	})
	mustRelease(t, b, "k", w.Token)
	redlock.WaitIdle(b)
	eventually(t, "nothing is left", func() bool { return len(leftovers(t, nodes, "k")) == 0 })
}

// A shared grant's fence is the highest of its quorum, raised on the nodes
// that drew less, as for an exclusive grant, so that the next grant on any
// quorum draws more.
func TestReaderFenceIsRaised(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	b := newBackend(t, servers)
	setCounters(t, nodes, "k", 5, 3, 3)
	holdForeign(t, nodes[2], "k", "someone") // the quorum must be nodes 0 and 1

	r := reader(t, "k", "reader", time.Minute)
	if res := mustAcquire(t, b, r); res.Fence != 6 {
		t.Fatalf("reader's fence %d, want 6: the highest of the quorum's 6 and 4", res.Fence)
	}
	redlock.WaitIdle(b)
	if c := counters(t, nodes, "k"); c[0] < 6 || c[1] < 6 {
		t.Errorf("counters %v, want nodes 0 and 1 at 6 or above", c)
	}
	info, ok, err := b.Inspect(t.Context(), "k")
	if err != nil || !ok || len(info.Shared) != 1 || info.Shared[0].Fence != 6 || info.Shared[0].Owner != "reader" {
		t.Errorf("Inspect = %+v, %v, %v; want the reader with fence 6 on a quorum", info, ok, err)
	}
	mustRelease(t, b, "k", r.Token)
	nodes[2].Del(t.Context(), lockKey("k"))
	// A writer on nodes 1 and 2 draws more than the reader's 6.
	servers[0].Kill(t)
	w := request(t, "k", time.Minute)
	if res := mustAcquire(t, b, w); res.Fence <= 6 {
		t.Errorf("writer's fence %d after the reader's 6", res.Fence)
	}
	mustRelease(t, b, "k", w.Token)
	checkClean(t, b, nodes[1:], "k")
}

// Inspect, List and ForceRelease count a shared hold when a quorum of nodes
// has it.
func TestInspectSharedHolds(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	b := newBackend(t, servers)
	r1, r2 := reader(t, "app/rw", "reader-1", 10*time.Second), reader(t, "app/rw", "reader-2", 20*time.Second)
	f1 := mustAcquire(t, b, r1).Fence
	f2 := mustAcquire(t, b, r2).Fence
	// A shared hold on one node only (left by an attempt that lost) is
	// not held.
	stray := driver.AcquireRequest{Key: "app/stray", Token: "stray", Owner: "stray", TTL: time.Minute, Mode: driver.Shared}
	if res, err := nodeBackends(nodes)[1].Acquire(t.Context(), stray); err != nil || !res.Acquired {
		t.Fatalf("shared acquire on node 1 = %+v, %v", res, err)
	}
	// Node 2 is behind for reader-2: the quorum's TTL is the second highest.
	nodes[2].ZAdd(t.Context(), sharedKey("app/rw"), redis.Z{Score: float64(time.Now().Add(2 * time.Second).UnixMilli()), Member: r2.Token})
	redlock.WaitIdle(b)

	info, ok, err := b.Inspect(t.Context(), "app/rw")
	if err != nil || !ok {
		t.Fatalf("Inspect = %+v, %v, %v; want held", info, ok, err)
	}
	if info.Owner != "" || info.Fence != 0 || info.Holds != 0 || info.WriterWaiting || info.Limit != 0 || len(info.Shared) != 2 {
		t.Fatalf("Inspect = %+v; want two shared holds and no exclusive holder", info)
	}
	for i, want := range []struct {
		owner string
		fence uint64
		ttl   time.Duration
	}{{"reader-1", f1, 10 * time.Second}, {"reader-2", f2, 20 * time.Second}} {
		h := info.Shared[i]
		if h.Owner != want.owner || h.Fence != want.fence || h.TTL <= want.ttl-3*time.Second || h.TTL > want.ttl {
			t.Errorf("Shared[%d] = %+v, want %s with fence %d for about %v", i, h, want.owner, want.fence, want.ttl)
		}
	}
	if _, ok, err := b.Inspect(t.Context(), "app/stray"); err != nil || ok {
		t.Errorf("Inspect of a shared hold on one node = %v, %v; want not held", ok, err)
	}
	infos, err := b.List(t.Context(), "app/")
	if err != nil || len(infos) != 1 || infos[0].Key != "app/rw" || len(infos[0].Shared) != 2 {
		t.Errorf("List(app/) = %+v, %v; want app/rw with its two readers", infos, err)
	}

	info, ok, err = b.ForceRelease(t.Context(), "app/rw")
	if err != nil || !ok || len(info.Shared) != 2 || info.Owner != "" {
		t.Errorf("ForceRelease = %+v, %v, %v; want the two readers", info, ok, err)
	}
	info, ok, err = b.ForceRelease(t.Context(), "app/stray")
	if err != nil || !ok || len(info.Shared) != 1 || info.Shared[0].Owner != "stray" {
		t.Errorf("ForceRelease of the stray = %+v, %v, %v; want it", info, ok, err)
	}
	if held, err := b.Renew(t.Context(), "app/rw", r1.Token, time.Second); err != nil || held {
		t.Errorf("Renew after ForceRelease = %v, %v; want not held", held, err)
	}
	checkClean(t, b, nodes, "app/rw")
	checkClean(t, b, nodes, "app/stray")
}

// Through the dlock client: readers share, a writer waits until the last
// reader unlocks (woken by its release), and new readers wait behind the
// writer; with one node down.
func TestRWMutexOnRedlock(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	servers[1].Kill(t)
	c1, c2, c3 := newClient(t, servers), newClient(t, servers), newClient(t, servers)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	// Long retry delays: only notifications make the waits short.
	slow := dlock.WithRetry(dlock.ExponentialBackoff(time.Hour, time.Hour))

	r1, err := c1.RWMutex("rw", dlock.WithTTL(time.Minute)).RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := c2.RWMutex("rw", dlock.WithTTL(time.Minute)).RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wrote := make(chan *dlock.Lease, 1)
	go func() {
		l, err := c3.RWMutex("rw", dlock.WithTTL(time.Minute), slow).Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		wrote <- l
	}()
	// Once the writer waits, a new reader is refused.
	b := newBackend(t, servers)
	eventually(t, "the writer waits", func() bool {
		info, ok, err := b.Inspect(ctx, "rw")
		return err == nil && ok && info.WriterWaiting
	})
	var no *dlock.NotObtainedError
	if _, err := c1.RWMutex("rw").TryRLock(ctx); !errors.As(err, &no) || !no.WriterWaiting {
		t.Errorf("TryRLock with a writer waiting = %v, want refused with WriterWaiting", err)
	}
	if err := r1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wrote:
		t.Fatal("writer granted while a reader holds")
	case <-time.After(100 * time.Millisecond):
	}
	if err := r2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	var w *dlock.Lease
	select {
	case w = <-wrote:
	case <-ctx.Done():
		t.Fatal("writer not granted after the readers left")
	}
	if w == nil {
		return
	}
	if w.Fence() <= r2.Fence() || w.Fence() <= r1.Fence() {
		t.Errorf("writer's fence %d after the readers' %d and %d", w.Fence(), r1.Fence(), r2.Fence())
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	checkClean(t, b, []*redis.Client{nodes[0], nodes[2]}, "rw")
}
