package redislock_test

// Driver-level tests of shared holds (readers, semaphore permits), writer
// intents and fair queues. Every case runs on one redis-server
// (TestSharedHolds) and on a 3-primary Cluster (TestClusterSharedHolds).

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/redisnode"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// sharedEnv is one store for one case: two backends, as two processes,
// and a plain client to look at the keys.
type sharedEnv struct {
	b, b2 *redislock.Backend
	rdb   redis.Cmdable
	// keys returns every key of the lock named key (the fence counter
	// included), sorted.
	keys func(t *testing.T, key string) []string
}

var sharedCases = []struct {
	name string
	fn   func(t *testing.T, e sharedEnv)
}{
	{"SharedGrants", testSharedGrants},
	{"SemaphoreLimit", testSemaphoreLimit},
	{"OtherLimitRefused", testOtherLimitRefused},
	{"SharedTokenHoldsOnce", testSharedTokenHoldsOnce},
	{"WriterIntentBlocksReaders", testWriterIntentBlocksReaders},
	{"WriterIntentLapses", testWriterIntentLapses},
	{"WriterIntentKeptBehindWriter", testWriterIntentKeptBehindWriter},
	{"FairOrder", testFairOrder},
	{"FairTryLockYieldsAndRecordsNothing", testFairTryLockYieldsAndRecordsNothing},
	{"PlainSharedRequestSeesLiveQueue", testPlainSharedRequestSeesLiveQueue},
	{"FairEntryLapses", testFairEntryLapses},
	{"ReleaseRemovesQueueEntryAndIntent", testReleaseRemovesQueueEntryAndIntent},
	{"ReleaseNamesNext", testReleaseNamesNext},
	{"RenewAndReleaseShared", testRenewAndReleaseShared},
	{"CrashedReaderExpires", testCrashedReaderExpires},
	{"InspectShared", testInspectShared},
	{"ListFindsSharedOnlyLocks", testListFindsSharedOnlyLocks},
	{"ForceReleaseShared", testForceReleaseShared},
	{"NoLeftovers", testNoLeftovers},
	{"OneScriptPerCall", testOneScriptPerCall},
}

func TestSharedHolds(t *testing.T) {
	for _, c := range sharedCases {
		t.Run(c.name, func(t *testing.T) {
			srv := testserver.StartRedis(t)
			admin := srv.Client(t)
			c.fn(t, sharedEnv{
				b:   redislock.New(srv.Client(t)),
				b2:  redislock.New(srv.Client(t)),
				rdb: admin,
				keys: func(t *testing.T, key string) []string {
					return sortedKeys(t, admin, key)
				},
			})
		})
	}
}

// TestClusterSharedHolds runs the cases on one 3-primary Cluster, emptied
// after each case, with a ClusterClient per backend.
func TestClusterSharedHolds(t *testing.T) {
	t.Parallel()
	c := testserver.StartCluster(t, clusterSize)
	admin := c.Client(t)
	for _, sc := range sharedCases {
		t.Run(sc.name, func(t *testing.T) {
			t.Cleanup(func() {
				for i := range c.Len() {
					if err := c.Node(i).Client(t).FlushAll(context.Background()).Err(); err != nil {
						t.Errorf("FLUSHALL on node %d: %v", i, err)
					}
				}
			})
			sc.fn(t, sharedEnv{
				b:   redislock.New(c.Client(t)),
				b2:  redislock.New(c.Client(t)),
				rdb: admin,
				keys: func(t *testing.T, key string) []string {
					// One lock's keys share a slot, so they are all on its master.
					node, err := admin.MasterForKey(t.Context(), lockKey(key))
					if err != nil {
						t.Fatalf("master of %q: %v", key, err)
					}
					return sortedKeys(t, node, key)
				},
			})
		})
	}
}

func sortedKeys(t *testing.T, rdb redis.Cmdable, key string) []string {
	t.Helper()
	keys, err := rdb.Keys(t.Context(), globEscapeTest(lockKey(key))+"*").Result()
	if err != nil {
		t.Fatalf("KEYS: %v", err)
	}
	// The ids of recent releases stay 15s on purpose (see release.lua),
	// and the late-request record 5s (late.lua): they hold nothing back.
	keys = slices.DeleteFunc(keys, func(k string) bool { return k == lockKey(key)+":r" || k == lockKey(key)+":late" })
	slices.Sort(keys)
	return keys
}

// globEscapeTest quotes the characters that are special in a KEYS pattern.
func globEscapeTest(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`)
	return r.Replace(s)
}

// Requests as the dlock client makes them.

func exclusiveReq(key, tok, owner string) driver.AcquireRequest {
	return driver.AcquireRequest{Key: key, Token: tok, Owner: owner, TTL: 10 * time.Second}
}

// waitingReq is an exclusive request of a Lock that waits, with a queue TTL.
func waitingReq(key, tok, owner string, queueTTL time.Duration) driver.AcquireRequest {
	r := exclusiveReq(key, tok, owner)
	r.Wait, r.QueueTTL = true, queueTTL
	return r
}

// fairReq is a request of a fair Mutex: Lock with wait, TryLock without.
func fairReq(key, tok, owner string, wait bool) driver.AcquireRequest {
	r := exclusiveReq(key, tok, owner)
	r.Fair = true
	if wait {
		r.Wait, r.QueueTTL = true, 5*time.Second
	}
	return r
}

func sharedReq(key, tok, owner string, limit int) driver.AcquireRequest {
	return driver.AcquireRequest{Key: key, Token: tok, Owner: owner, TTL: 10 * time.Second, Mode: driver.Shared, Limit: limit}
}

// refused acquires and fails the test if the request was granted.
func refused(t *testing.T, b *redislock.Backend, req driver.AcquireRequest) driver.AcquireResult {
	t.Helper()
	res := acquire(t, b, req)
	if res.Acquired {
		t.Fatalf("Acquire(%s, %v, owner %q) was granted: %+v", req.Key, req.Mode, req.Owner, res)
	}
	return res
}

// about reports whether d is in (want-slack, want].
func about(d, want time.Duration) bool {
	const slack = 2 * time.Second
	return d > want-slack && d <= want
}

func zcard(t *testing.T, rdb redis.Cmdable, name string) int64 {
	t.Helper()
	n, err := rdb.ZCard(t.Context(), name).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func existsAny(t *testing.T, rdb redis.Cmdable, name string) bool {
	t.Helper()
	n, err := rdb.Exists(t.Context(), name).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

func testSharedGrants(t *testing.T, e sharedEnv) {
	r1, r2 := newToken(t), newToken(t)
	first := mustAcquire(t, e.b, sharedReq("k", r1, "reader 1", 0))
	second := mustAcquire(t, e.b2, sharedReq("k", r2, "reader 2", 0))
	if first.Fence == 0 || second.Fence <= first.Fence || first.Holds != 1 || second.Holds != 1 {
		t.Errorf("shared grants = %+v, %+v; want one hold each and increasing fences", first, second)
	}

	// A writer waits for the shared hold that expires last.
	r3 := newToken(t)
	req3 := sharedReq("k", r3, "reader 3", 0)
	req3.TTL = 20 * time.Second
	third := mustAcquire(t, e.b, req3)
	w := refused(t, e.b2, exclusiveReq("k", newToken(t), "writer"))
	if w.Holder != "reader 3" || !about(w.HolderTTL, 20*time.Second) || w.Shared != 3 || w.Queued || w.WriterWaiting {
		t.Errorf("writer refused by readers = %+v, want holder reader 3, ~20s, 3 shared, nothing queued", w)
	}
	// A non-waiting writer recorded nothing: readers still get in.
	if existsAny(t, e.rdb, lockKey("k")+":w") {
		t.Error("a writer without Wait left an intent")
	}
	r4 := newToken(t)
	mustAcquire(t, e.b, sharedReq("k", r4, "reader 4", 0))

	// Readers wait for a writer, and every grant draws from one counter.
	for _, tok := range []string{r1, r2, r3, r4} {
		release(t, e.b, "k", tok)
	}
	wtok := newToken(t)
	wres := mustAcquire(t, e.b2, exclusiveReq("k", wtok, "writer"))
	if wres.Fence <= third.Fence+1 {
		t.Errorf("writer's fence %d, want above the last shared grant's %d", wres.Fence, third.Fence+1)
	}
	r := refused(t, e.b, sharedReq("k", newToken(t), "reader 5", 0))
	if r.Holder != "writer" || !about(r.HolderTTL, 10*time.Second) || r.WriterWaiting || r.Shared != 0 {
		t.Errorf("reader refused by a writer = %+v, want holder writer, ~10s", r)
	}
	release(t, e.b2, "k", wtok)
	if got := mustAcquire(t, e.b, sharedReq("k", newToken(t), "reader 5", 0)); got.Fence <= wres.Fence {
		t.Errorf("reader's fence %d after the writer's %d", got.Fence, wres.Fence)
	}
}

func testSemaphoreLimit(t *testing.T, e sharedEnv) {
	short := sharedReq("sem", newToken(t), "permit 1", 2)
	short.TTL = 5 * time.Second
	mustAcquire(t, e.b, short)
	p2 := newToken(t)
	mustAcquire(t, e.b2, sharedReq("sem", p2, "permit 2", 2))

	res := refused(t, e.b, sharedReq("sem", newToken(t), "permit 3", 2))
	// At its limit a semaphore waits for the permit that expires first.
	if res.Holder != "permit 1" || !about(res.HolderTTL, 5*time.Second) || res.Shared != 2 || res.WriterWaiting || res.Queued {
		t.Errorf("third permit = %+v, want refused for permit 1 (~5s), 2 shared", res)
	}
	// A shared request never records anything, even with Wait.
	waiting := sharedReq("sem", newToken(t), "permit 3", 2)
	waiting.Wait, waiting.QueueTTL = true, time.Second
	if res := refused(t, e.b, waiting); res.Queued || res.Position != 0 {
		t.Errorf("waiting shared request = %+v, want nothing queued", res)
	}
	for _, suffix := range []string{":w", ":q", ":qe"} {
		if existsAny(t, e.rdb, lockKey("sem")+suffix) {
			t.Errorf("a refused shared request left %s", suffix)
		}
	}

	release(t, e.b2, "sem", p2)
	mustAcquire(t, e.b, sharedReq("sem", newToken(t), "permit 3", 2))
	// A larger limit is refused while permits of 2 are held.
	if res := refused(t, e.b, sharedReq("sem", newToken(t), "permit 4", 3)); !res.Conflict || res.HeldLimit != 2 {
		t.Errorf("permit of 3 beside permits of 2 = %+v, want a conflict with limit 2", res)
	}
}

// testOtherLimitRefused: the live holds bind the name's limit: a request of
// another limit, lower or higher, or a reader, is refused as a conflict
// (naming the holds' limit, their number and one of them)
// and takes no hold away; once the holds are gone the new limit is granted.
func testOtherLimitRefused(t *testing.T, e sharedEnv) {
	toks := []string{newToken(t), newToken(t), newToken(t)}
	for i, tok := range toks {
		mustAcquire(t, e.b, sharedReq("sem", tok, "permit "+string(rune('a'+i)), 3))
	}
	for _, limit := range []int{2, 4, 0} {
		res := refused(t, e.b2, sharedReq("sem", newToken(t), "new", limit))
		if !res.Conflict || res.HeldLimit != 3 || res.Shared != 3 || !strings.HasPrefix(res.Holder, "permit ") || res.HolderTTL <= 0 {
			t.Errorf("limit %d beside permits of 3 = %+v, want a conflict with limit 3, 3 shared, naming a permit", limit, res)
		}
	}
	for _, tok := range toks {
		if !renew(t, e.b, "sem", tok, 10*time.Second) {
			t.Error("a refused conflict took a hold away")
		}
	}
	release(t, e.b, "sem", toks[0])
	release(t, e.b, "sem", toks[1])
	if res := refused(t, e.b2, sharedReq("sem", newToken(t), "new", 2)); !res.Conflict {
		t.Errorf("limit 2 beside one permit of 3 = %+v, want a conflict", res)
	}
	release(t, e.b, "sem", toks[2])
	mustAcquire(t, e.b2, sharedReq("sem", newToken(t), "new", 2))
	if res := refused(t, e.b2, sharedReq("sem", newToken(t), "reader", 0)); !res.Conflict || res.HeldLimit != 2 {
		t.Errorf("reader beside a permit of 2 = %+v, want a conflict with limit 2", res)
	}
}

// A token holds once; since the client draws a token for every shared
// request, a request that finds its token's hold is that request resent
// (go-redis resends a command whose answer was lost), and gets the hold
// back as the first run made it.
func testSharedTokenHoldsOnce(t *testing.T, e sharedEnv) {
	tok := newToken(t)
	first := mustAcquire(t, e.b, sharedReq("k", tok, "reader", 0))
	if again := mustAcquire(t, e.b, sharedReq("k", tok, "reader", 0)); again.Fence != first.Fence {
		t.Errorf("second acquire by the same token = %+v, want the first grant (fence %d) back", again, first.Fence)
	}
	if info, _, err := e.b.Inspect(t.Context(), "k"); err != nil || len(info.Shared) != 1 {
		t.Errorf("shared holds after the second acquire = %+v, %v; want one", info.Shared, err)
	}
	if got := release(t, e.b, "k", tok); got != (driver.ReleaseResult{Held: true}) {
		t.Errorf("release = %+v, want held with 0 remaining", got)
	}
	if got := mustAcquire(t, e.b, sharedReq("k", tok, "reader", 0)); got.Fence <= first.Fence {
		t.Errorf("fence %d after %d", got.Fence, first.Fence)
	}
}

func testWriterIntentBlocksReaders(t *testing.T, e sharedEnv) {
	reader := newToken(t)
	mustAcquire(t, e.b, sharedReq("rw", reader, "reader", 0))
	writer := newToken(t)
	w := refused(t, e.b2, waitingReq("rw", writer, "writer", 5*time.Second))
	if !w.Queued || w.Shared != 1 || w.Holder != "reader" || w.Position != 0 {
		t.Errorf("waiting writer = %+v, want queued behind 1 reader", w)
	}
	if got, err := e.rdb.HGetAll(t.Context(), lockKey("rw")+":w").Result(); err != nil || got["t"] != writer || got["o"] != "writer" {
		t.Errorf("intent = %v, %v; want the writer's token and owner", got, err)
	}
	if d, err := e.rdb.PTTL(t.Context(), lockKey("rw")+":w").Result(); err != nil || !about(d, 5*time.Second) {
		t.Errorf("intent PTTL = %v, %v; want about the queue TTL", d, err)
	}

	// New readers are kept out and told about the writer.
	r := refused(t, e.b, sharedReq("rw", newToken(t), "late reader", 0))
	if !r.WriterWaiting || r.Holder != "writer" || !about(r.HolderTTL, 5*time.Second) || r.Shared != 1 || r.Queued {
		t.Errorf("reader behind a writer = %+v, want WriterWaiting, holder writer, ~5s", r)
	}
	// The reader that holds still renews.
	if !renew(t, e.b, "rw", reader, 10*time.Second) {
		t.Error("the reader's renew was refused while a writer waits")
	}

	// A second waiting writer does not take over the intent.
	other := refused(t, e.b, waitingReq("rw", newToken(t), "writer 2", 5*time.Second))
	if other.Queued {
		t.Errorf("second writer = %+v, want not queued", other)
	}
	// The first writer's retry keeps it.
	again := refused(t, e.b2, waitingReq("rw", writer, "writer", 8*time.Second))
	if !again.Queued {
		t.Errorf("writer's retry = %+v, want still queued", again)
	}
	if d, err := e.rdb.PTTL(t.Context(), lockKey("rw")+":w").Result(); err != nil || !about(d, 8*time.Second) {
		t.Errorf("intent PTTL after the retry = %v, %v; want about 8s", d, err)
	}

	// The last reader leaves; the writer gets in and its intent is gone.
	release(t, e.b, "rw", reader)
	mustAcquire(t, e.b2, waitingReq("rw", writer, "writer", 5*time.Second))
	if existsAny(t, e.rdb, lockKey("rw")+":w") {
		t.Error("the writer's intent survived its grant")
	}
}

func testWriterIntentLapses(t *testing.T, e sharedEnv) {
	mustAcquire(t, e.b, sharedReq("rw", newToken(t), "reader", 0))
	refused(t, e.b2, waitingReq("rw", newToken(t), "writer", 300*time.Millisecond))
	refused(t, e.b, sharedReq("rw", newToken(t), "late reader", 0))
	// The writer died: its intent lapses after the queue TTL.
	eventually(t, "a reader gets in after the intent lapsed", func() bool {
		return acquire(t, e.b, sharedReq("rw", newToken(t), "late reader", 0)).Acquired
	})
}

// A waiting writer keeps its intent while another writer holds the lock
// (the readers it waited for are gone), so readers cannot overtake it when
// that writer releases.
func testWriterIntentKeptBehindWriter(t *testing.T, e sharedEnv) {
	reader, w1, w2 := newToken(t), newToken(t), newToken(t)
	mustAcquire(t, e.b, sharedReq("rw", reader, "reader", 0))
	if res := refused(t, e.b2, waitingReq("rw", w1, "w1", 600*time.Millisecond)); !res.Queued {
		t.Fatalf("the waiting writer recorded no intent: %+v", res)
	}
	if _, err := e.b.Release(t.Context(), "rw", reader); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, e.b, exclusiveReq("rw", w2, "w2")) // another writer overtakes
	for i := range 6 {                                // 1.2s: twice the intent's TTL
		time.Sleep(200 * time.Millisecond)
		if res := refused(t, e.b2, waitingReq("rw", w1, "w1", 600*time.Millisecond)); !res.Queued {
			t.Fatalf("retry %d: the waiting writer lost its intent behind another writer: %+v", i, res)
		}
	}
	if _, err := e.b.Release(t.Context(), "rw", w2); err != nil {
		t.Fatal(err)
	}
	if res := refused(t, e.b, sharedReq("rw", newToken(t), "late reader", 0)); !res.WriterWaiting {
		t.Fatalf("a new reader was refused, but not for the waiting writer: %+v", res)
	}
}

func testFairOrder(t *testing.T, e sharedEnv) {
	holder := newToken(t)
	h := fairReq("f", holder, "holder", true)
	mustAcquire(t, e.b, h)
	tokA, tokB, tokC := newToken(t), newToken(t), newToken(t)
	for i, w := range []struct {
		b   *redislock.Backend
		tok string
	}{{e.b, tokA}, {e.b2, tokB}, {e.b, tokC}} {
		res := refused(t, w.b, fairReq("f", w.tok, "waiter", true))
		if res.Position != i+1 || !res.Queued || res.Holder != "holder" || !about(res.HolderTTL, 10*time.Second) {
			t.Errorf("waiter %d = %+v, want position %d behind the holder", i, res, i+1)
		}
	}
	// A retry keeps its place.
	if res := refused(t, e.b2, fairReq("f", tokB, "waiter", true)); res.Position != 2 {
		t.Errorf("B's retry: position %d, want 2", res.Position)
	}
	release(t, e.b, "f", holder)

	// Free, but promised to A: B and C wait; a non-fair request does not.
	for _, tok := range []string{tokB, tokC} {
		if res := refused(t, e.b2, fairReq("f", tok, "waiter", true)); !res.Queued || res.Holder != "" || res.HolderTTL != 0 {
			t.Errorf("fair waiter behind the head = %+v, want queued with no holder", res)
		}
	}
	if got := zcard(t, e.rdb, lockKey("f")+":q"); got != 3 {
		t.Errorf("queue length %d, want 3", got)
	}
	a := mustAcquire(t, e.b, fairReq("f", tokA, "waiter", true))
	if a.Holds != 1 {
		t.Errorf("A's grant = %+v", a)
	}
	if res := refused(t, e.b2, fairReq("f", tokB, "waiter", true)); res.Position != 1 || res.Holder != "waiter" {
		t.Errorf("B after A's grant = %+v, want position 1 behind A", res)
	}
	if res := refused(t, e.b2, fairReq("f", tokC, "waiter", true)); res.Position != 2 {
		t.Errorf("C after A's grant = %+v, want position 2", res)
	}
	release(t, e.b, "f", tokA)
	// A request without Fair ignores the queue, and says that it overtook it.
	plain := newToken(t)
	if res := mustAcquire(t, e.b2, exclusiveReq("f", plain, "plain")); !res.Overtook {
		t.Errorf("non-fair grant before a live queue = %+v, want Overtook", res)
	}
	release(t, e.b2, "f", plain)
	if res := mustAcquire(t, e.b2, fairReq("f", tokB, "waiter", true)); res.Overtook {
		t.Errorf("the head's own grant = %+v, want no Overtook", res)
	}
	release(t, e.b2, "f", tokB)
	mustAcquire(t, e.b, fairReq("f", tokC, "waiter", true))
	release(t, e.b, "f", tokC)
	if res := mustAcquire(t, e.b, exclusiveReq("f", plain, "plain")); res.Overtook {
		t.Errorf("grant with no queue = %+v, want no Overtook", res)
	}
	release(t, e.b, "f", plain)
	if got := e.keys(t, "f"); !slices.Equal(got, []string{lockKey("f") + ":fence"}) {
		t.Errorf("keys after every fair waiter had its turn = %v, want the fence counter", got)
	}
}

func testFairTryLockYieldsAndRecordsNothing(t *testing.T, e sharedEnv) {
	holder := newToken(t)
	mustAcquire(t, e.b, fairReq("f", holder, "holder", true))
	head := newToken(t)
	refused(t, e.b2, fairReq("f", head, "head", true))
	release(t, e.b, "f", holder)

	res := refused(t, e.b, fairReq("f", newToken(t), "try", false))
	if res.Queued || res.Position != 0 {
		t.Errorf("fair TryLock = %+v, want refused with nothing queued", res)
	}
	if got := zcard(t, e.rdb, lockKey("f")+":q"); got != 1 {
		t.Errorf("queue length after a fair TryLock = %d, want 1", got)
	}
	// The head's own TryLock gets it.
	mustAcquire(t, e.b2, fairReq("f", head, "head", false))
	if existsAny(t, e.rdb, lockKey("f")+":q") || existsAny(t, e.rdb, lockKey("f")+":qe") {
		t.Error("the queue survived its last entry's grant")
	}
	// With the queue empty a fair TryLock of a held lock records nothing.
	refused(t, e.b, fairReq("f", newToken(t), "try", false))
	if existsAny(t, e.rdb, lockKey("f")+":q") {
		t.Error("a fair TryLock was queued")
	}
}

// A shared request without Fair is told of a live fair queue as an
// exclusive one is (driver.CapOvertookShared): a waiting one that is
// refused with QueueLive, a granted one with Overtook, so that a plain
// Semaphore's or reader's starving waiters join the queue and its Client's
// next requests respect it.
func testPlainSharedRequestSeesLiveQueue(t *testing.T, e sharedEnv) {
	holder := newToken(t)
	mustAcquire(t, e.b, sharedReq("q", holder, "holder", 1))
	plain := sharedReq("q", newToken(t), "plain", 1)
	plain.Wait, plain.QueueTTL = true, 3*time.Second
	if res := refused(t, e.b2, plain); res.QueueLive || res.Queued {
		t.Errorf("plain waiter, no queue: %+v; want refused, not queued, QueueLive false", res)
	}
	fair := sharedReq("q", newToken(t), "fair", 1)
	fair.Fair, fair.Wait, fair.QueueTTL = true, true, 3*time.Second
	if res := refused(t, e.b, fair); !res.Queued || res.QueueLive {
		t.Errorf("fair waiter: %+v; want queued, QueueLive false", res)
	}
	if res := refused(t, e.b2, plain); !res.QueueLive || res.Queued || res.Holder != "holder" {
		t.Errorf("plain waiter behind a queue: %+v; want refused by the holder with QueueLive, not queued", res)
	}
	try := sharedReq("q", newToken(t), "try", 1)
	if res := refused(t, e.b2, try); res.QueueLive {
		t.Errorf("plain TryLock behind a queue: %+v; want QueueLive false (only waiters queue)", res)
	}
	release(t, e.b, "q", holder)
	// Free, but promised to the fair waiter: a plain grant goes before it,
	// and says so.
	if res := mustAcquire(t, e.b2, plain); !res.Overtook {
		t.Errorf("plain grant before a live queue: %+v; want Overtook", res)
	}
	release(t, e.b2, "q", plain.Token)
	if res := mustAcquire(t, e.b, fair); res.Overtook {
		t.Errorf("the head's own grant: %+v; want no Overtook", res)
	}
	release(t, e.b, "q", fair.Token)
	if res := mustAcquire(t, e.b2, plain); res.Overtook {
		t.Errorf("plain grant with no queue: %+v; want no Overtook", res)
	}
	release(t, e.b2, "q", plain.Token)
	if got := e.keys(t, "q"); !slices.Equal(got, []string{lockKey("q") + ":fence"}) {
		t.Errorf("keys after the last release = %v, want the fence counter", got)
	}
}

func testFairEntryLapses(t *testing.T, e sharedEnv) {
	holder := newToken(t)
	mustAcquire(t, e.b, exclusiveReq("f", holder, "holder"))
	dying := fairReq("f", newToken(t), "dies", true)
	dying.QueueTTL = 300 * time.Millisecond
	refused(t, e.b, dying)
	live := newToken(t)
	if res := refused(t, e.b2, fairReq("f", live, "lives", true)); res.Position != 2 {
		t.Fatalf("second waiter = %+v, want position 2", res)
	}
	// The queue outlives its latest entry (5s) by up to a quarter of its
	// QueueTTL.
	if d, err := e.rdb.PTTL(t.Context(), lockKey("f")+":q").Result(); err != nil || d <= 3*time.Second || d > 6250*time.Millisecond {
		t.Errorf("queue PTTL = %v, %v; want its latest entry's 5s to 6.25s", d, err)
	}
	eventually(t, "the dead waiter's entry lapses", func() bool {
		return refused(t, e.b2, fairReq("f", live, "lives", true)).Position == 1
	})
	release(t, e.b, "f", holder)
	mustAcquire(t, e.b2, fairReq("f", live, "lives", true))
}

func testReleaseRemovesQueueEntryAndIntent(t *testing.T, e sharedEnv) {
	l, rel := listenNext(t, e.b2)
	subscribe(t, l, "f")

	holder := newToken(t)
	mustAcquire(t, e.b, exclusiveReq("f", holder, "holder"))
	a, b := newToken(t), newToken(t)
	refused(t, e.b, fairReq("f", a, "a", true))
	refused(t, e.b, fairReq("f", b, "b", true))

	// A waiter that gives up behind a holder leaves quietly.
	if got := release(t, e.b, "f", b); got.Held {
		t.Errorf("release of a queue entry = %+v, want not held", got)
	}
	if got := zcard(t, e.rdb, lockKey("f")+":q"); got != 1 {
		t.Errorf("queue length %d, want 1", got)
	}
	rel.expectNone(t, "f")

	// The lock is freed for A; A gives up, and the queue is empty.
	release(t, e.b, "f", holder)
	rel.expect(t, "f", a)
	release(t, e.b, "f", a)
	rel.expect(t, "f", "")
	if existsAny(t, e.rdb, lockKey("f")+":q") || existsAny(t, e.rdb, lockKey("f")+":qe") {
		t.Error("queue left after its last entry gave up")
	}

	// A writer that gives up takes its intent with it and lets readers in.
	subscribe(t, l, "rw")
	reader := newToken(t)
	mustAcquire(t, e.b, sharedReq("rw", reader, "reader", 0))
	writer := newToken(t)
	refused(t, e.b2, waitingReq("rw", writer, "writer", 5*time.Second))
	if got := release(t, e.b2, "rw", writer); got.Held {
		t.Errorf("release of an intent = %+v, want not held", got)
	}
	rel.expect(t, "rw", "")
	if existsAny(t, e.rdb, lockKey("rw")+":w") {
		t.Error("intent left after its writer gave up")
	}
	mustAcquire(t, e.b, sharedReq("rw", newToken(t), "reader 2", 0))
}

func testReleaseNamesNext(t *testing.T, e sharedEnv) {
	l, rel := listenNext(t, e.b2)
	subscribe(t, l, "f")

	// Without a queue anyone may try.
	lockAndRelease(t, e.b, "f")
	rel.expect(t, "f", "")

	// With one, the release names its head, and then the next.
	holder := newToken(t)
	mustAcquire(t, e.b, fairReq("f", holder, "holder", true))
	a, b := newToken(t), newToken(t)
	refused(t, e.b2, fairReq("f", a, "a", true))
	refused(t, e.b2, fairReq("f", b, "b", true))
	release(t, e.b, "f", holder)
	rel.expect(t, "f", a)
	mustAcquire(t, e.b2, fairReq("f", a, "a", true))
	release(t, e.b2, "f", a)
	rel.expect(t, "f", b)

	// The head gives up while the lock is free: the next one is named.
	c := newToken(t)
	refused(t, e.b2, fairReq("f", c, "c", true))
	release(t, e.b2, "f", b)
	rel.expect(t, "f", c)
	release(t, e.b2, "f", c)
	rel.expect(t, "f", "")

	// Shared releases are for anyone, even with a queue.
	subscribe(t, l, "s")
	r1, r2 := newToken(t), newToken(t)
	mustAcquire(t, e.b, sharedReq("s", r1, "r1", 0))
	mustAcquire(t, e.b, sharedReq("s", r2, "r2", 0))
	refused(t, e.b2, fairReq("s", newToken(t), "fair writer", true))
	release(t, e.b, "s", r1)
	rel.expect(t, "s", "")
	release(t, e.b, "s", r2)
	rel.expect(t, "s", "")

	// A release that lets nobody in is not announced.
	if got := release(t, e.b, "s", newToken(t)); got.Held {
		t.Errorf("release of nothing = %+v", got)
	}
	rel.expectNone(t, "s")
}

func testRenewAndReleaseShared(t *testing.T, e sharedEnv) {
	tok := newToken(t)
	req := sharedReq("k", tok, "reader", 0)
	req.TTL = 2 * time.Second
	mustAcquire(t, e.b, req)
	score := func() time.Duration {
		t.Helper()
		exp, err := e.rdb.ZScore(t.Context(), lockKey("k")+":s", tok).Result()
		if err != nil {
			t.Fatal(err)
		}
		return time.Until(time.UnixMilli(int64(exp)))
	}
	if !renew(t, e.b, "k", tok, time.Minute) {
		t.Fatal("renew of a shared hold = false")
	}
	if d := score(); !about(d, time.Minute) {
		t.Errorf("shared hold expires in %v after renew, want about 1m", d)
	}
	for _, name := range []string{":s", ":si"} {
		if d, err := e.rdb.PTTL(t.Context(), lockKey("k")+name).Result(); err != nil || !about(d, time.Minute) {
			t.Errorf("PTTL of %s = %v, %v; want its latest entry's minute", name, d, err)
		}
	}
	// Never shortened.
	if !renew(t, e.b, "k", tok, time.Second) {
		t.Fatal("shorter renew of a shared hold = false")
	}
	if d := score(); !about(d, time.Minute) {
		t.Errorf("shared hold expires in %v after a shorter renew, want about 1m", d)
	}
	// Batch renewals find it too.
	if got := e.b.RenewBatch(t.Context(), []driver.RenewRequest{{Key: "k", Token: tok, TTL: 2 * time.Minute}, {Key: "k", Token: newToken(t), TTL: time.Minute}}); got[0] != (driver.RenewResult{Held: true}) || got[1] != (driver.RenewResult{}) {
		t.Errorf("RenewBatch = %+v, want held, not held", got)
	}
	if d := score(); !about(d, 2*time.Minute) {
		t.Errorf("shared hold expires in %v after a batch renew, want about 2m", d)
	}
	if renew(t, e.b, "k", newToken(t), time.Minute) {
		t.Error("another token renewed the shared hold")
	}
	if got := release(t, e.b, "k", newToken(t)); got.Held {
		t.Errorf("another token's release = %+v", got)
	}
	if got := release(t, e.b, "k", tok); got != (driver.ReleaseResult{Held: true, Remaining: 0}) {
		t.Errorf("release = %+v, want held, 0 remaining", got)
	}
	if got := release(t, e.b, "k", tok); got.Held {
		t.Errorf("second release = %+v, want not held", got)
	}
	if renew(t, e.b, "k", tok, time.Minute) {
		t.Error("renew after release = true")
	}
}

func testCrashedReaderExpires(t *testing.T, e sharedEnv) {
	crashed := newToken(t)
	req := sharedReq("k", crashed, "crashed reader", 0)
	req.TTL = 200 * time.Millisecond
	mustAcquire(t, e.b, req)
	refused(t, e.b2, exclusiveReq("k", newToken(t), "writer"))
	eventually(t, "the writer gets in after the reader's lease ran out", func() bool {
		return acquire(t, e.b2, exclusiveReq("k", newToken(t), "writer")).Acquired
	})
	if renew(t, e.b, "k", crashed, time.Minute) {
		t.Error("renew of an expired shared hold = true")
	}
	if got := release(t, e.b, "k", crashed); got.Held {
		t.Errorf("release of an expired shared hold = %+v", got)
	}
	// The semaphore's permit of a crashed holder comes back too.
	perm := sharedReq("sem", newToken(t), "crashed permit", 1)
	perm.TTL = 200 * time.Millisecond
	mustAcquire(t, e.b, perm)
	refused(t, e.b2, sharedReq("sem", newToken(t), "next permit", 1))
	eventually(t, "the permit comes back after its lease ran out", func() bool {
		return acquire(t, e.b2, sharedReq("sem", newToken(t), "next permit", 1)).Acquired
	})
}

func testInspectShared(t *testing.T, e sharedEnv) {
	ctx := t.Context()
	var fences []uint64
	for i, limit := range []int{3, 3} {
		req := sharedReq("sem", newToken(t), []string{"first", "second"}[i], limit)
		req.TTL = time.Duration(20-10*i) * time.Second
		fences = append(fences, mustAcquire(t, e.b, req).Fence)
	}
	refused(t, e.b2, fairReq("sem", newToken(t), "queued", true))
	refused(t, e.b2, waitingReq("sem", newToken(t), "writer", 5*time.Second))

	info, ok, err := e.b.Inspect(ctx, "sem")
	if err != nil || !ok {
		t.Fatalf("Inspect = %v, %v", ok, err)
	}
	if info.Owner != "" || info.Fence != 0 || info.Holds != 0 || info.TTL != 0 || info.HeldFor != 0 || info.Delayed {
		t.Errorf("Inspect of a lock with shared holds only = %+v, want no exclusive holder", info)
	}
	if len(info.Shared) != 2 ||
		info.Shared[0].Owner != "first" || info.Shared[0].Fence != fences[0] || !about(info.Shared[0].TTL, 20*time.Second) ||
		info.Shared[1].Owner != "second" || info.Shared[1].Fence != fences[1] || !about(info.Shared[1].TTL, 10*time.Second) {
		t.Errorf("Inspect shared holds = %+v, want first (~20s), second (~10s), oldest first", info.Shared)
	}
	if info.Limit != 3 || info.Queued != 1 || !info.WriterWaiting {
		t.Errorf("Inspect = %+v, want the newest limit 3, 1 queued, a writer waiting", info)
	}

	// An exclusive holder with a queue.
	holder := mustAcquire(t, e.b, exclusiveReq("x", newToken(t), "holder"))
	refused(t, e.b2, fairReq("x", newToken(t), "q1", true))
	refused(t, e.b2, fairReq("x", newToken(t), "q2", true))
	info, ok, err = e.b.Inspect(ctx, "x")
	if err != nil || !ok || info.Owner != "holder" || info.Fence != holder.Fence || info.Holds != 1 ||
		len(info.Shared) != 0 || info.Limit != 0 || info.Queued != 2 || info.WriterWaiting {
		t.Errorf("Inspect of an exclusive lock with a queue = %+v, %v, %v", info, ok, err)
	}

	// Waiters alone are not a held lock.
	refused(t, e.b2, fairReq("x", newToken(t), "q3", true))
	if _, _, err := e.b.ForceRelease(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if info, ok, err := e.b.Inspect(ctx, "x"); err != nil || ok {
		t.Errorf("Inspect of a lock with only waiters = %+v, %v, %v; want not held", info, ok, err)
	}
}

func testListFindsSharedOnlyLocks(t *testing.T, e sharedEnv) {
	mustAcquire(t, e.b, sharedReq("jobs/readers", newToken(t), "reader", 0))
	mustAcquire(t, e.b, sharedReq("jobs/readers", newToken(t), "reader 2", 0))
	mustAcquire(t, e.b, sharedReq("jobs/sem", newToken(t), "permit", 4))
	mustAcquire(t, e.b, exclusiveReq("jobs/writer", newToken(t), "writer"))
	mustAcquire(t, e.b, exclusiveReq("jobs/x}:s", newToken(t), "odd name")) // its hash ends in "}:s}"
	// Only waiters, and an expired reader: not held.
	mustAcquire(t, e.b, exclusiveReq("jobs/queued", newToken(t), "h"))
	refused(t, e.b, fairReq("jobs/queued", newToken(t), "w", true))
	if _, _, err := e.b.ForceRelease(t.Context(), "jobs/queued"); err != nil {
		t.Fatal(err)
	}
	gone := sharedReq("jobs/expired", newToken(t), "r", 0)
	gone.TTL = time.Millisecond
	mustAcquire(t, e.b, gone)
	time.Sleep(5 * time.Millisecond) // the lease has run out by the server's clock

	infos, err := e.b2.List(t.Context(), "jobs/")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, info := range infos {
		got = append(got, info.Key)
		if info.Key == "jobs/readers" && len(info.Shared) != 2 {
			t.Errorf("List entry of jobs/readers = %+v, want 2 shared holds", info)
		}
		if info.Key == "jobs/sem" && (info.Limit != 4 || len(info.Shared) != 1) {
			t.Errorf("List entry of jobs/sem = %+v, want 1 shared hold, limit 4", info)
		}
	}
	if want := []string{"jobs/readers", "jobs/sem", "jobs/writer", "jobs/x}:s"}; !slices.Equal(got, want) {
		t.Errorf("List = %q, want %q", got, want)
	}
}

func testForceReleaseShared(t *testing.T, e sharedEnv) {
	l, rel := listenNext(t, e.b2)
	subscribe(t, l, "rw")
	r1, r2 := newToken(t), newToken(t)
	mustAcquire(t, e.b, sharedReq("rw", r1, "r1", 0))
	mustAcquire(t, e.b, sharedReq("rw", r2, "r2", 0))
	refused(t, e.b2, fairReq("rw", newToken(t), "fair writer", true))
	writer := newToken(t)
	refused(t, e.b2, waitingReq("rw", writer, "writer", 5*time.Second))

	info, ok, err := e.b.ForceRelease(t.Context(), "rw")
	if err != nil || !ok || len(info.Shared) != 2 || info.Queued != 1 || !info.WriterWaiting {
		t.Fatalf("ForceRelease = %+v, %v, %v; want 2 shared holds removed", info, ok, err)
	}
	rel.expect(t, "rw", "")
	if renew(t, e.b, "rw", r1, time.Minute) {
		t.Error("a forcibly released reader renewed")
	}
	if got := release(t, e.b, "rw", r2); got.Held {
		t.Errorf("release of a forcibly released reader = %+v", got)
	}
	for _, name := range []string{":s", ":si"} {
		if existsAny(t, e.rdb, lockKey("rw")+name) {
			t.Errorf("%s left after ForceRelease", name)
		}
	}
	// The queue and the intent stay with their waiters.
	if zcard(t, e.rdb, lockKey("rw")+":q") != 1 || !existsAny(t, e.rdb, lockKey("rw")+":w") {
		t.Error("ForceRelease removed the waiters' queue entry or intent")
	}
	if _, ok, err := e.b.ForceRelease(t.Context(), "rw"); err != nil || ok {
		t.Errorf("ForceRelease of a lock with only waiters: ok=%v err=%v, want not held", ok, err)
	}
	// The intent keeps new readers out until the writer comes.
	refused(t, e.b, sharedReq("rw", newToken(t), "r3", 0))
	mustAcquire(t, e.b2, waitingReq("rw", writer, "writer", 5*time.Second))
}

func testNoLeftovers(t *testing.T, e sharedEnv) {
	only := func(key string) {
		t.Helper()
		if got := e.keys(t, key); !slices.Equal(got, []string{lockKey(key) + ":fence"}) {
			t.Errorf("keys of %q = %v, want only the fence counter", key, got)
		}
	}
	// Readers and a writer that waited for them.
	r1, r2 := newToken(t), newToken(t)
	mustAcquire(t, e.b, sharedReq("rw", r1, "r1", 0))
	mustAcquire(t, e.b, sharedReq("rw", r2, "r2", 0))
	w := newToken(t)
	refused(t, e.b2, waitingReq("rw", w, "writer", 5*time.Second))
	release(t, e.b, "rw", r1)
	release(t, e.b, "rw", r2)
	mustAcquire(t, e.b2, waitingReq("rw", w, "writer", 5*time.Second))
	release(t, e.b2, "rw", w)
	only("rw")

	// A reader that crashed, and a fair writer to which the last live
	// reader's release handed the lock: the crashed hold goes with the
	// shared keys then, not when that reader's hold would have expired.
	crashed := sharedReq("ho", newToken(t), "crashed", 0)
	crashed.TTL = 100 * time.Millisecond
	mustAcquire(t, e.b, crashed)
	r := newToken(t)
	mustAcquire(t, e.b, sharedReq("ho", r, "r", 0))
	hw := fairReq("ho", newToken(t), "fair writer", true)
	hw.QueueTTL, hw.Handoff = 5*time.Second, true
	refused(t, e.b2, hw)
	time.Sleep(150 * time.Millisecond) // the crashed hold expires
	release(t, e.b, "ho", r)
	if info, _, err := e.b.Inspect(t.Context(), "ho"); err != nil || info.Owner != "fair writer" {
		t.Fatalf("after the last reader's release: %+v, %v; want the lock handed to the fair writer", info, err)
	}
	release(t, e.b2, "ho", hw.Token)
	only("ho")

	// Fair waiters that gave up, and one whose entry lapsed.
	h := newToken(t)
	mustAcquire(t, e.b, fairReq("f", h, "h", true))
	quit := newToken(t)
	refused(t, e.b2, fairReq("f", quit, "quits", true))
	lapsing := fairReq("f", newToken(t), "dies", true)
	lapsing.QueueTTL = 100 * time.Millisecond
	refused(t, e.b2, lapsing)
	release(t, e.b2, "f", quit)
	release(t, e.b, "f", h)
	eventually(t, "the dead waiter's queue entry expires", func() bool {
		return !existsAny(t, e.rdb, lockKey("f")+":q") && !existsAny(t, e.rdb, lockKey("f")+":qe")
	})
	only("f")

	// Permits that crashed, and an intent that lapsed.
	for range 3 {
		p := sharedReq("sem", newToken(t), "p", 3)
		p.TTL = 100 * time.Millisecond
		mustAcquire(t, e.b, p)
	}
	refused(t, e.b2, waitingReq("sem", newToken(t), "writer", 150*time.Millisecond))
	eventually(t, "the crashed permits and the intent expire", func() bool {
		return len(e.keys(t, "sem")) == 1
	})
	only("sem")
}

// testOneScriptPerCall checks that each operation on a shared, fair or
// waiting request is one script call (one round trip).
func testOneScriptPerCall(t *testing.T, e sharedEnv) {
	var hooked redis.UniversalClient
	switch rdb := e.rdb.(type) {
	case *redis.Client:
		hooked = redis.NewClient(rdb.Options())
	case *redis.ClusterClient:
		hooked = redis.NewClusterClient(rdb.Options())
	default:
		t.Fatalf("unexpected client %T", e.rdb)
	}
	t.Cleanup(func() { _ = hooked.Close() })
	b := redislock.New(hooked)
	ctx := t.Context()
	run := func() {
		r, w, f := newToken(t), newToken(t), newToken(t)
		mustAcquire(t, b, sharedReq("k", r, "r", 0))
		refused(t, b, waitingReq("k", w, "w", time.Second))
		refused(t, b, fairReq("k", f, "f", true))
		refused(t, b, sharedReq("k", newToken(t), "r2", 0))
		renew(t, b, "k", r, time.Minute)
		b.RenewBatch(ctx, []driver.RenewRequest{{Key: "k", Token: r, TTL: time.Minute}})
		if _, _, err := b.Inspect(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		release(t, b, "k", r)
		release(t, b, "k", f)
		mustAcquire(t, b, waitingReq("k", w, "w", time.Second))
		if _, _, err := b.ForceRelease(ctx, "k"); err != nil {
			t.Fatal(err)
		}
	}
	const ops = 11
	run() // loads the scripts on the node of "k" (EVALSHA, NOSCRIPT, EVAL)
	hook := &countingHook{}
	hooked.AddHook(hook)
	run()
	hook.mu.Lock()
	defer hook.mu.Unlock()
	n := len(hook.commands)
	for _, p := range hook.pipelines {
		n += len(p)
		if len(p) != 1 {
			t.Errorf("pipeline %v, want one command", p)
		}
	}
	for _, c := range slices.Concat(append(hook.pipelines, hook.commands)...) {
		if c != "evalsha" {
			t.Errorf("command %s sent, want only EVALSHA", c)
		}
	}
	if n != ops {
		t.Errorf("%d operations sent %d commands (%v, %v), want one EVALSHA each", ops, n, hook.commands, hook.pipelines)
	}
}

// TestClusterReleaseNamesNextOnEveryNode checks that a release heard with
// SSUBSCRIBE on each master names the head of the lock's fair queue.
func TestClusterReleaseNamesNextOnEveryNode(t *testing.T) {
	b, c := setupCluster(t)
	other := redislock.New(c.Client(t))
	l, rel := listenNext(t, other)
	for _, k := range keysPerNode(t, c, 1) {
		key := k[0]
		subscribe(t, l, key)
		holder, head := newToken(t), newToken(t)
		mustAcquire(t, b, fairReq(key, holder, "holder", true))
		refused(t, other, fairReq(key, head, "head", true))
		refused(t, other, fairReq(key, newToken(t), "second", true))
		release(t, b, key, holder)
		rel.expect(t, key, head)
		mustAcquire(t, other, fairReq(key, head, "head", true))
	}
}

// TestRaiseFence checks the fence raising that package redlock does on
// exclusive and shared grants alike.
func TestRaiseFence(t *testing.T) {
	b, rdb, _ := setup(t)
	ctx := t.Context()
	raise := func(key, tok string, fence uint64) bool {
		t.Helper()
		ok, err := redisnode.RaiseFence(b, ctx, key, tok, fence)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	counter := func(key string) uint64 {
		t.Helper()
		n, err := rdb.Get(ctx, lockKey(key)+":fence").Uint64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	x := newToken(t)
	mustAcquire(t, b, exclusiveReq("x", x, "writer"))
	if !raise("x", x, 40) || counter("x") != 40 {
		t.Errorf("exclusive RaiseFence to 40: counter %d", counter("x"))
	}
	if info, _, _ := b.Inspect(ctx, "x"); info.Fence != 40 {
		t.Errorf("exclusive hold's fence %d after RaiseFence, want 40", info.Fence)
	}

	r, other := newToken(t), newToken(t)
	mustAcquire(t, b, sharedReq("s", other, "other reader", 7))
	mustAcquire(t, b, sharedReq("s", r, "reader", 7))
	if !raise("s", r, 9) || counter("s") != 9 {
		t.Errorf("shared RaiseFence to 9: counter %d", counter("s"))
	}
	// A lower fence is given to the grant, but never lowers the counter.
	if !raise("s", other, 3) || counter("s") != 9 {
		t.Errorf("shared RaiseFence to 3: counter %d, want 9", counter("s"))
	}
	info, _, _ := b.Inspect(ctx, "s")
	if len(info.Shared) != 2 || info.Shared[0].Fence != 3 || info.Shared[0].Owner != "other reader" ||
		info.Shared[1].Fence != 9 || info.Shared[1].Owner != "reader" || info.Limit != 7 {
		t.Errorf("shared holds after RaiseFence = %+v, limit %d; want other reader 3, reader 9, limit 7", info.Shared, info.Limit)
	}
	if got := mustAcquire(t, b, sharedReq("s", newToken(t), "third", 7)); got.Fence != 10 {
		t.Errorf("next grant's fence %d, want 10", got.Fence)
	}

	if raise("s", newToken(t), 50) || raise("none", x, 50) || counter("s") != 10 {
		t.Error("RaiseFence for a token that holds nothing changed something")
	}
	release(t, b, "s", r)
	if raise("s", r, 50) {
		t.Error("RaiseFence after release = true")
	}
}

// TestReleaseQuietlyShared checks that ReleaseQuietly announces nothing
// for shared holds, intents and queue entries either.
func TestReleaseQuietlyShared(t *testing.T) {
	b, _, _ := setup(t)
	l, rel := listenNext(t, b)
	subscribe(t, l, "k")
	r := newToken(t)
	mustAcquire(t, b, sharedReq("k", r, "reader", 0))
	w := newToken(t)
	refused(t, b, waitingReq("k", w, "writer", 5*time.Second))
	for _, tok := range []string{r, w} {
		if _, err := redisnode.ReleaseQuietly(b, t.Context(), "k", tok); err != nil {
			t.Fatal(err)
		}
	}
	rel.expectNone(t, "k")
	mustAcquire(t, b, exclusiveReq("k", w, "writer"))
}

func TestCapabilities(t *testing.T) {
	b := redislock.New(nil) // no I/O
	for _, c := range []driver.Capability{driver.CapShared, driver.CapSemaphore, driver.CapFair, driver.CapFairShared, driver.CapOvertookShared} {
		if !b.Supports(c) {
			t.Errorf("Supports(%v) = false", c)
		}
	}
	if b.Supports(driver.Capability(99)) {
		t.Error("Supports(an unknown capability) = true")
	}
}

func TestUnknownModeIsAnError(t *testing.T) {
	b, rdb, _ := setup(t)
	_, err := b.Acquire(t.Context(), driver.AcquireRequest{Key: "k", Token: newToken(t), Owner: "o", TTL: time.Second, Mode: driver.Mode(7)})
	if err == nil || !strings.HasPrefix(err.Error(), "redis "+rdb.Options().Addr+": unknown mode") {
		t.Errorf("Acquire with Mode(7) = %v, want an error", err)
	}
	if exists(t, rdb, "dlock:{k}:fence") {
		t.Error("Acquire with an unknown mode reached Redis")
	}
}

// nextNotifications collects the (key, next) pairs a listener reports.
type nextNotifications struct {
	ch chan [2]string
}

// listenNext opens a listener on b that records (key, next).
func listenNext(t *testing.T, b *redislock.Backend) (driver.Listener, *nextNotifications) {
	t.Helper()
	n := &nextNotifications{ch: make(chan [2]string, 100)}
	l, err := b.Listen(t.Context(), func(key, next string) {
		select {
		case n.ch <- [2]string{key, next}:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l, n
}

// expect waits up to 5s for the next notification of key and checks that
// it names next.
func (n *nextNotifications) expect(t *testing.T, key, next string) {
	t.Helper()
	timer := time.NewTimer(5 * time.Second)
	defer timer.Stop()
	for {
		select {
		case got := <-n.ch:
			if got[0] != key {
				continue
			}
			if got[1] != next {
				t.Fatalf("notification of %q names %q, want %q", key, got[1], next)
			}
			return
		case <-timer.C:
			t.Fatalf("no notification of %q", key)
		}
	}
}

// expectNone checks that no notification of key arrives for 200ms.
func (n *nextNotifications) expectNone(t *testing.T, key string) {
	t.Helper()
	timer := time.NewTimer(200 * time.Millisecond)
	defer timer.Stop()
	for {
		select {
		case got := <-n.ch:
			if got[0] == key {
				t.Fatalf("unexpected notification of %q (next %q)", key, got[1])
			}
		case <-timer.C:
			return
		}
	}
}

// TestSharedHoldsReadWholeOrCounted: a request or release reads a name's
// live shared holds in one command while they are few (smallLimit in
// common.lua: 16), and counts them otherwise; on both sides of that line
// a Semaphore grants up to its limit and no more, names the hold that
// expires first when at the limit, hands a released permit to the
// queue's head, refuses another kind with the count of the holds, and
// keeps the holds' keys until their latest hold expires.
func TestSharedHoldsReadWholeOrCounted(t *testing.T) {
	b, rdb, _ := setup(t)
	ctx := t.Context()
	// expiresWithLatest checks that key's holds keys expire when their
	// latest hold does.
	expiresWithLatest := func(key string) {
		t.Helper()
		for _, k := range []string{"dlock:{" + key + "}:s", "dlock:{" + key + "}:si"} {
			latest := rdb.ZRangeWithScores(ctx, "dlock:{"+key+"}:s", -1, -1).Val()
			at, err := rdb.PExpireTime(ctx, k).Result()
			if err != nil || len(latest) != 1 {
				t.Fatalf("%s: PEXPIRETIME %v, %v; latest hold %v", k, at, err, latest)
			}
			if want := time.Duration(latest[0].Score) * time.Millisecond; at != want {
				t.Errorf("%s expires at %v, want %v (its latest hold's expiry)", k, at, want)
			}
		}
	}
	for _, limit := range []int{3, 16, 17, 20} {
		key := fmt.Sprintf("sem%d", limit)
		permit := func(i int) driver.AcquireRequest {
			tok := fmt.Sprintf("p%02d", i)
			return driver.AcquireRequest{Key: key, Token: tok, Owner: "owner-" + tok, TTL: 10 * time.Second,
				Mode: driver.Shared, Limit: limit, Fair: true, Wait: true, QueueTTL: 20 * time.Second, Handoff: true}
		}
		for i := range limit {
			if res := acquire(t, b, permit(i)); !res.Acquired {
				t.Fatalf("limit %d: permit %d refused: %+v", limit, i, res)
			}
			time.Sleep(time.Millisecond) // each later hold expires later
		}
		res := acquire(t, b, permit(limit))
		if res.Acquired || !res.Queued || res.Shared != limit || res.Holder != "owner-p00" {
			t.Fatalf("limit %d: the request past the limit: %+v; want queued, %d holds, held by owner-p00 (expires first)", limit, res, limit)
		}
		expiresWithLatest(key)
		if _, err := b.Release(ctx, key, "p01"); err != nil {
			t.Fatal(err)
		}
		holds := rdb.ZRange(ctx, "dlock:{"+key+"}:s", 0, -1).Val()
		if len(holds) != limit || !slices.Contains(holds, permit(limit).Token) || slices.Contains(holds, "p01") {
			t.Fatalf("limit %d: after a release the holds are %v; want %d, the queue's head among them", limit, holds, limit)
		}
		expiresWithLatest(key)
		if res := acquire(t, b, permit(limit+1)); res.Acquired || res.Shared != limit {
			t.Fatalf("limit %d: a request after the handoff: %+v; want refused by %d holds", limit, res, limit)
		}
	}
	// Another kind: readers refuse a Semaphore, with their count.
	for _, readers := range []int{1, 5, 17} {
		key := fmt.Sprintf("rw%d", readers)
		for i := range readers {
			mustAcquire(t, b, driver.AcquireRequest{Key: key, Token: fmt.Sprintf("r%d", i), Owner: "reader", TTL: 10 * time.Second, Mode: driver.Shared})
		}
		res := acquire(t, b, driver.AcquireRequest{Key: key, Token: "s", Owner: "s", TTL: 10 * time.Second, Mode: driver.Shared, Limit: 2})
		if res.Acquired || !res.Conflict || res.Shared != readers || res.HeldLimit != 0 || res.Holder != "reader" {
			t.Errorf("%d readers: a Semaphore(2) request got %+v; want a conflict with %d holds of limit 0", readers, res, readers)
		}
	}
}

// TestSemaphoreHoldsPastRequestLimit: a permit request that finds more live
// holds than its limit (the holds of a larger limit: the Semaphore's limit
// was changed, or they are another Semaphore's) counts them all: it is
// refused as a conflict with their count, their limit and the owner of the
// hold that expires last, except for the request that finds its own hold
// among them, which gets it back; a request of their limit at it is refused
// with their count, naming the hold that expires first.
func TestSemaphoreHoldsPastRequestLimit(t *testing.T) {
	b, rdb, _ := setup(t)
	ctx := t.Context()
	const key = "resized"
	permit := func(tok string, limit int) driver.AcquireRequest {
		return driver.AcquireRequest{Key: key, Token: tok, Owner: "owner-" + tok, TTL: 10 * time.Second,
			Mode: driver.Shared, Limit: limit, Fair: true, Wait: true, QueueTTL: 20 * time.Second, Handoff: true}
	}
	fences := map[string]uint64{}
	for i := range 5 {
		tok := fmt.Sprintf("p%d", i)
		fences[tok] = mustAcquire(t, b, permit(tok, 5)).Fence
		time.Sleep(2 * time.Millisecond) // each later hold expires later
	}
	for _, limit := range []int{1, 2, 3, 4} {
		res := acquire(t, b, permit(fmt.Sprintf("n%d", limit), limit))
		if res.Acquired || !res.Conflict || res.Shared != 5 || res.HeldLimit != 5 || res.Holder != "owner-p4" {
			t.Errorf("Semaphore(%d) beside 5 holds of Semaphore(5): %+v; want a conflict with 5 holds of limit 5, held by owner-p4", limit, res)
		}
		for _, tok := range []string{"p0", "p2", "p4"} {
			// Its own hold: a resent request, or a claim of a handed hold.
			if res := acquire(t, b, permit(tok, limit)); !res.Acquired || res.Fence != fences[tok] {
				t.Errorf("Semaphore(%d) request of %s, which holds a permit: %+v; want its hold back (fence %d)", limit, tok, res, fences[tok])
			}
		}
	}
	res := acquire(t, b, permit("late", 5))
	if res.Acquired || res.Conflict || res.Shared != 5 || res.Holder != "owner-p1" {
		// p0, p2 and p4 were given the request's TTL again above: p1
		// expires first.
		t.Errorf("Semaphore(5) request at its limit: %+v; want refused by 5 holds, held by owner-p1", res)
	}
	if n := rdb.ZCard(ctx, "dlock:{"+key+"}:s").Val(); n != 5 {
		t.Errorf("%d holds, want 5", n)
	}
}
