package redislock_test

// The server work of each script path, counted: Redis runs scripts on one
// thread, so every command a script runs costs every client of the server.
// A count is deterministic (unlike a timing), so each path's count is
// asserted exactly: a script that grows fails here, and one that shrinks
// has its figure updated (and docs/REDIS.md's table with it).

import (
	"context"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// commandCounter reads a private server's INFO commandstats: the calls of
// every command, those that scripts run included, INFO itself left out.
type commandCounter struct {
	t   *testing.T
	rdb *redis.Client
}

func (c commandCounter) read() (map[string]uint64, uint64) {
	c.t.Helper()
	s, err := c.rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		c.t.Fatal(err)
	}
	m, total := map[string]uint64{}, uint64(0)
	for _, line := range strings.Split(s, "\n") {
		stat, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_")
		if !ok {
			continue
		}
		name, rest, _ := strings.Cut(stat, ":")
		if name == "info" {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				n, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					c.t.Fatal(err)
				}
				m[name] += n
				total += n
			}
		}
	}
	return m, total
}

// count runs f and checks that the server served want commands for it,
// script calls included, reporting the commands by name.
func (c commandCounter) count(path string, want uint64, f func()) {
	c.t.Helper()
	before, b := c.read()
	f()
	after, a := c.read()
	var got []string
	for name, n := range after {
		if d := n - before[name]; d > 0 {
			got = append(got, name+"="+strconv.FormatUint(d, 10))
		}
	}
	sort.Strings(got)
	if a-b != want {
		c.t.Errorf("%s: %d commands, want %d: %s", path, a-b, want, strings.Join(got, " "))
	} else {
		c.t.Logf("%s: %d commands: %s", path, a-b, strings.Join(got, " "))
	}
}

// TestScriptPathsCommandCounts counts the commands of each path of a grant:
// the uncontended acquire and release (one script call each), a fair
// waiter joining a queue and refreshing its entry, the release that hands
// the lock to the queue's head (each with and without a late-request
// record on the name), a renewal, a waiting writer's intent passed on to
// its next token, and the fair shared paths (a permit joining the queue;
// the release that hands over a permit, the lock to a batch of readers, or
// to a writer; a reader's release that lets nobody in). A release records
// the requests of the grant it deletes unless its Backend knows that each
// reached the server once: the releases that record go through other, a
// Backend that made none of the grants.
func TestScriptPathsCommandCounts(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := context.Background()
	b := redislock.New(srv.Client(t))
	other := redislock.New(srv.Client(t))
	c := commandCounter{t: t, rdb: srv.Client(t)}
	const key = "cost"
	plain := func(token string) driver.AcquireRequest {
		return driver.AcquireRequest{Key: key, Token: token, Owner: token, TTL: 10 * time.Second}
	}
	fair := func(token string) driver.AcquireRequest {
		r := plain(token)
		r.Fair, r.Wait, r.QueueTTL, r.Handoff = true, true, 5*time.Second, true
		return r
	}
	acquire := func(req driver.AcquireRequest, want bool) driver.AcquireResult {
		t.Helper()
		res, err := b.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if res.Acquired != want {
			t.Fatalf("%s: acquired %v, want %v", req.Token, res.Acquired, want)
		}
		return res
	}
	releaseBy := func(by *redislock.Backend, key, token string, fence uint64) {
		t.Helper()
		if _, err := by.ReleaseGrant(ctx, key, token, fence); err != nil {
			t.Fatal(err)
		}
	}
	release := func(token string, fence uint64) { t.Helper(); releaseBy(other, key, token, fence) }
	// Warm up: the scripts loaded, the eviction policy read.
	res := acquire(plain("warm"), true)
	if _, err := b.RenewGrant(ctx, key, "warm", res.Fence, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	releaseBy(other, key, "warm", res.Fence)
	if err := b.Withdraw(ctx, key, "warm"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.MoveIntent(ctx, key, "warm", "warm2", "warm2", time.Second); err != nil {
		t.Fatal(err)
	}

	c.count("uncontended acquire", 8, func() { res = acquire(plain("h0"), true) })
	c.count("uncontended release", 12, func() { release("h0", res.Fence) })
	res = acquire(plain("h1"), true)
	c.count("uncontended release, its request sent once", 7, func() { releaseBy(b, key, "h1", res.Fence) })

	res = acquire(plain("h2"), true)
	acquire(fair("w1"), false)
	acquire(fair("w2"), false)
	c.count("fair waiter joins a queue", 15, func() { acquire(fair("w3"), false) })
	c.count("fair waiter refreshes its entry", 13, func() { acquire(fair("w3"), false) })
	// A renewal that would not lengthen the lease (within the acquire's
	// millisecond) skips its PEXPIRE: a longer TTL makes the count exact.
	c.count("renewal", 4, func() {
		if ok, err := b.RenewGrant(ctx, key, "h2", res.Fence, 20*time.Second); err != nil || !ok {
			t.Fatalf("renew: %v %v", ok, err)
		}
	})
	acquire(fair("w4"), false)
	// The grant released records its request (late.lua); a handed one has
	// none to record, as in a queue's steady state. The head's expiry is
	// read with the queue's last two (which the removal of the head's entry
	// needs) when it is one of them.
	c.count("release with a queue of four, handed to its head", 23, func() { release("h2", res.Fence) })
	admin := srv.Client(t)
	hash := "dlock:{cost}" // the lock hash of key
	handFrom := func(path string, want uint64, from, to string) {
		t.Helper()
		fence := handedFence(t, admin, hash, from)
		c.count(path, want, func() { release(from, fence) })
		if fence == 0 || handedFence(t, admin, hash, to) != fence+1 {
			t.Errorf("the lock was not handed from %s to %s", from, to)
		}
	}
	handFrom("release of a handed grant, handed to the head of a queue of three", 19, "w1", "w2")
	handFrom("release of a handed grant, handed to the head of a queue of two", 18, "w2", "w3")
	// w4 is the last entry, so the queue's keys go.
	handFrom("release of a handed grant, handed to the queue's last entry", 19, "w3", "w4")

	// The same paths on a name without a late-request record (no release
	// recorded a request there: a queue's steady state, whose handed
	// grants record nothing), which they do not read or prune.
	quiet := func(req driver.AcquireRequest) driver.AcquireRequest {
		req.Key = "quiet"
		return req
	}
	c.count("uncontended acquire, no late-request record", 6, func() { res = acquire(quiet(plain("q1")), true) })
	acquire(quiet(fair("q2")), false)
	c.count("fair waiter joins a queue, no late-request record", 12, func() { acquire(quiet(fair("q3")), false) })
	c.count("fair waiter refreshes its entry, no late-request record", 10, func() { acquire(quiet(fair("q3")), false) })
	c.count("release with a queue of two, handed to its head, no late-request record", 20, func() {
		releaseBy(other, "quiet", "q1", res.Fence)
	})
	onceq := func(req driver.AcquireRequest) driver.AcquireRequest {
		req.Key = "onceq"
		return req
	}
	res = acquire(onceq(plain("o1")), true)
	acquire(onceq(fair("o2")), false)
	acquire(onceq(fair("o3")), false)
	c.count("release with a queue of two, handed to its head, its request sent once", 18, func() {
		releaseBy(b, "onceq", "o1", res.Fence)
	})
	// A queue whose head takes no handoff (driver.AcquireRequest.Handoff
	// false): the release names the head on the release channel.
	noHandoff := func(token string) driver.AcquireRequest {
		req := fair(token)
		req.Key, req.Handoff = "nohandoff", false
		return req
	}
	first := plain("n0")
	first.Key = "nohandoff"
	res = acquire(first, true)
	acquire(noHandoff("n1"), false)
	acquire(noHandoff("n2"), false)
	c.count("release with a queue whose head takes no handoff, no late-request record", 15, func() {
		releaseBy(other, "nohandoff", "n0", res.Fence)
	})
	// n0's release recorded its request: the next release prunes the
	// record.
	res = acquire(noHandoff("n1"), true)
	c.count("release with a queue whose head takes no handoff", 17, func() {
		releaseBy(other, "nohandoff", "n1", res.Fence)
	})
	res = acquire(noHandoff("n2"), true)
	acquire(noHandoff("n3"), false)
	c.count("release with a queue whose head takes no handoff, its request sent once", 13, func() {
		releaseBy(b, "nohandoff", "n2", res.Fence)
	})
	// A waiter that gives up leaves the queue (Withdraw), on a name
	// without a late-request record.
	leaving := func(token string) driver.AcquireRequest {
		req := fair(token)
		req.Key = "leave"
		return req
	}
	holder := plain("v0")
	holder.Key = "leave"
	acquire(holder, true)
	acquire(leaving("v1"), false)
	acquire(leaving("v2"), false)
	c.count("withdraw from a queue, no late-request record", 15, func() {
		if err := b.Withdraw(ctx, "leave", "v2"); err != nil {
			t.Fatal(err)
		}
	})
	// v2's withdrawal is recorded: the next one prunes the record.
	acquire(leaving("v3"), false)
	c.count("withdraw from a queue", 17, func() {
		if err := b.Withdraw(ctx, "leave", "v3"); err != nil {
			t.Fatal(err)
		}
	})
	lone := plain("l1")
	lone.Key = "lone"
	res = acquire(lone, true)
	c.count("uncontended release, no late-request record", 10, func() {
		releaseBy(other, "lone", "l1", res.Fence)
	})
	// A head whose entry expires last (it refreshed after the others
	// joined, or asked for a longer QueueTTL): the queue's keys are fitted
	// to the entry that then expires last (three PEXPIREATs).
	latest := func(token string, queueTTL time.Duration) driver.AcquireRequest {
		req := fair(token)
		req.Key, req.QueueTTL = "latest", queueTTL
		return req
	}
	first = plain("e0")
	first.Key = "latest"
	res = acquire(first, true)
	acquire(latest("e1", 20*time.Second), false)
	acquire(latest("e2", 5*time.Second), false)
	acquire(latest("e3", 5*time.Second), false)
	c.count("release with a queue of three whose head expires last, handed to it, no late-request record", 23, func() {
		releaseBy(other, "latest", "e0", res.Fence)
	})
	if handedFence(t, admin, "dlock:{latest}", "e1") != res.Fence+1 {
		t.Errorf("the lock was not handed from e0 to e1")
	}

	// Fair shared requests (RWMutex and Semaphore with Fair), on names
	// without a late-request record: a release hands a freed permit to the
	// queue's head, a writer's release the readers at the head, and the
	// last reader's release a queued writer the lock. Their grants are
	// released by the Backend that made them (nothing to record).
	fairShared := func(key, token string, limit int) driver.AcquireRequest {
		req := fair(token)
		req.Key, req.Mode, req.Limit = key, driver.Shared, limit
		return req
	}
	sharedHeld := func(key, token string) bool {
		t.Helper()
		_, err := admin.ZScore(ctx, "dlock:{"+key+"}:s", token).Result()
		return err == nil
	}
	acquire(fairShared("fsem", "p1", 2), true)
	acquire(fairShared("fsem", "p2", 2), true)
	acquire(fairShared("fsem", "p3", 2), false)
	c.count("fair permit joins a queue, no late-request record", 14, func() { acquire(fairShared("fsem", "p4", 2), false) })
	c.count("release of a permit, handed to the head of a queue of two, no late-request record", 24, func() {
		if _, err := b.Release(ctx, "fsem", "p1"); err != nil {
			t.Fatal(err)
		}
	})
	if !sharedHeld("fsem", "p3") || sharedHeld("fsem", "p4") {
		t.Error("the permit was not handed to the queue's head alone")
	}
	// More holds than one command reads whole (smallLimit, 16): they are
	// counted, and their ends read, one by one.
	for i := range 17 {
		acquire(fairShared("fsem17", "b"+strconv.Itoa(i), 17), true)
	}
	acquire(fairShared("fsem17", "w1", 17), false)
	c.count("fair permit joins a queue past 16 holds, no late-request record", 18, func() { acquire(fairShared("fsem17", "w2", 17), false) })
	for _, n := range []int{1, 3} {
		key := "frw" + strconv.Itoa(n)
		first := fair("x" + strconv.Itoa(n))
		first.Key = key
		res = acquire(first, true)
		var readers []string
		for i := range n {
			readers = append(readers, key+"r"+strconv.Itoa(i))
			acquire(fairShared(key, readers[i], 0), false)
		}
		want := map[int]uint64{1: 22, 3: 43}[n]
		path := map[int]string{1: "the queued reader", 3: "the three queued readers"}[n]
		c.count("writer's release, handed to "+path+", no late-request record", want, func() {
			releaseBy(b, key, first.Token, res.Fence)
		})
		for _, r := range readers {
			if !sharedHeld(key, r) {
				t.Errorf("reader %s was not handed a hold", r)
			}
		}
	}
	// frw1's reader holds; a writer queues behind it.
	qw := fair("y1")
	qw.Key = "frw1"
	acquire(qw, false)
	c.count("last reader's release, handed to a queued writer, no late-request record", 28, func() {
		if _, err := b.Release(ctx, "frw1", "frw1r0"); err != nil {
			t.Fatal(err)
		}
	})
	if handedFence(t, admin, "dlock:{frw1}", "y1") == 0 {
		t.Error("the lock was not handed to the queued writer")
	}
	// A reader's release with another reader left, a writer at the head:
	// nobody waiting can come in, and nothing is announced.
	acquire(fairShared("frwb", "b1", 0), true)
	acquire(fairShared("frwb", "b2", 0), true)
	bw := fair("bw")
	bw.Key = "frwb"
	acquire(bw, false)
	c.count("reader's release, another reader left and a writer at the head (announces nothing), no late-request record", 19, func() {
		if _, err := b.Release(ctx, "frwb", "b1"); err != nil {
			t.Fatal(err)
		}
	})
	if handedFence(t, admin, "dlock:{frwb}", "bw") != 0 {
		t.Error("the writer was handed the lock beside a reader")
	}

	// A waiting writer's intent passed to its next token
	// (driver.IntentMover), on names without a late-request record: from
	// the writer's intent, and from its grant.
	move := func(path string, want uint64, key, from, to string) {
		t.Helper()
		c.count(path, want, func() {
			if ok, err := b.MoveIntent(ctx, key, from, to, to, 5*time.Second); err != nil || !ok {
				t.Fatalf("MoveIntent(%s → %s) = %v, %v", from, to, ok, err)
			}
		})
	}
	reader := plain("m0")
	reader.Key, reader.Mode = "move", driver.Shared
	acquire(reader, true)
	writer := plain("m1")
	writer.Key, writer.Wait, writer.QueueTTL = "move", true, 5*time.Second
	acquire(writer, false)
	move("writer intent moved to the next token, no late-request record", 5, "move", "m1", "m2")
	granted := plain("g1")
	granted.Key = "granted"
	acquire(granted, true)
	move("writer intent given by a grant to the next token, no late-request record", 7, "granted", "g1", "g2")
}

// handedFence returns the fence of the grant that token holds, handed to it
// by a release (0 when it holds none).
func handedFence(t *testing.T, rdb *redis.Client, key, token string) uint64 {
	t.Helper()
	h, err := rdb.HMGet(context.Background(), key, token, "fence").Result()
	if err != nil {
		t.Fatal(err)
	}
	if h[0] == nil || h[1] == nil {
		return 0
	}
	f, err := strconv.ParseUint(h[1].(string), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return f
}
