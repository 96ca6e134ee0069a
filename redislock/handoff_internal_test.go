package redislock

// A release that deleted an exclusive grant hands the lock over without
// looking for the lock hash or live shared holds. These tests check the invariant it rests on (no live shared hold while the lock
// hash exists) on a real redis-server, with a release script instrumented to
// count every freed handoff that the previous check would have refused.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
)

// instrumentRelease makes the package's release script count, in
// L..":probe", the freed handoffs that found the lock hash or a live
// shared hold (what handOff once looked for), and in
// L..":probefreed" and L..":probeho" the freed handoffs tried and made:
// those of handOff and those of release.lua's handoff fast path. It
// swaps package variables (restored at cleanup): the tests that call it
// must not run in parallel with others.
func instrumentRelease(t *testing.T) {
	t.Helper()
	const probe = `redis.call('INCR', L .. ':probefreed')
  if redis.call('EXISTS', L) == 1 or redis.call('ZCOUNT', S, string.format('(%d', now()), '+inf') > 0 then
    redis.call('INCR', L .. ':probe')
  end
`
	src := lateLua + withCommon(releaseLua)
	// replace puts with in place of the only occurrence of at in src.
	replace := func(what, at, with string) {
		t.Helper()
		if strings.Count(src, at) != 1 {
			t.Fatalf("%s changed", what)
		}
		src = strings.Replace(src, at, with, 1)
	}
	const sig = "local function handOff(L, F, S, SI, W, Q, QE, QO, freed, token, noW, hasL, pre)\n"
	replace("handOff's signature", sig, sig+"  if freed then "+probe+"  end\n")
	const grant = "    local fence = grantHead(L, F, head, o[1], exp)\n"
	replace("handOff's grant", grant+"    if not noW", grant+"    if freed then redis.call('INCR', L .. ':probeho') end\n    if not noW")
	// The fast path's grant is a freed handoff, checked once it has
	// deleted the releasing grant.
	const fast = "    redis.call('DEL', L)\n    done(recent, h[2])\n"
	replace("the handoff fast path", fast+grant, fast+"    "+probe+grant+"    redis.call('INCR', L .. ':probeho')\n")
	oldScript, oldSHA := releaseScript, releaseSHA
	releaseScript = redis.NewScript(src)
	releaseSHA = releaseScript.Hash()
	t.Cleanup(func() { releaseScript, releaseSHA = oldScript, oldSHA })
}

// bothHeld reports, atomically, whether the lock hash exists beside a live
// shared hold.
var bothHeld = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZCOUNT', KEYS[2], string.format('(%d', now), '+inf')`)

// TestFreedHandoffInstrumentationFires checks that the instrumentation
// sees a forged state (a live shared hold beside an exclusive grant, which
// no script makes; a server clock stepped back could) and shows what the
// shortcut does with it: the release hands the lock to the queue's head
// while the shared hold is live. It does so on both ways a release hands
// over: release.lua's handoff fast path, taken by a release of a grant
// whose requests reached the server once, and handOff, taken by one that
// records the requests of the grant it deletes (a Backend that did not
// make the grant sends it).
func TestFreedHandoffInstrumentationFires(t *testing.T) {
	instrumentRelease(t)
	srv := testserver.StartRedis(t)
	rdb := srv.Client(t)
	b, other := New(rdb), New(rdb)
	ctx := t.Context()
	releases := map[string]func(key string, fence uint64) error{
		"recording requests":    func(key string, fence uint64) error { _, err := other.ReleaseGrant(ctx, key, "w1", fence); return err },
		"of requests sent once": func(key string, fence uint64) error { _, err := b.ReleaseGrant(ctx, key, "w1", fence); return err },
	}
	for name, release := range releases {
		key := "k " + name
		L := b.lockKey(key)
		res, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "w1", Owner: "w1", TTL: 10 * time.Second})
		if err != nil || !res.Acquired {
			t.Fatal(res, err)
		}
		fence := res.Fence
		res, err = b.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "w2", Owner: "w2", TTL: 10 * time.Second,
			Fair: true, Wait: true, QueueTTL: 10 * time.Second, Handoff: true})
		if err != nil || res.Acquired {
			t.Fatal(res, err)
		}
		// Forge a live reader beside w1's grant.
		ms := time.Now().Add(10 * time.Second).UnixMilli()
		rdb.ZAdd(ctx, L+":s", redis.Z{Score: float64(ms), Member: "r1"})
		rdb.HSet(ctx, L+":si", "r1", "1 0 r1")
		if err := release(key, fence); err != nil {
			t.Fatal(err)
		}
		n, _ := rdb.Get(ctx, L+":probe").Int()
		both, _ := bothHeld.Run(ctx, rdb, []string{L, L + ":s"}).Int()
		t.Logf("release %s, forged state: freed handoffs with a live shared hold: %d; lock hash beside live shared holds after the release: %d (owner %q)",
			name, n, both, rdb.HGet(ctx, L, "owner").Val())
		if n != 1 || both != 1 {
			t.Fatalf("release %s: instrumentation did not fire: %d %d", name, n, both)
		}
	}
}

// TestNoExclusiveBesideShared drives readers, semaphore permits (plain,
// and fair with handoff) and exclusive requests (fair with handoff, plain,
// lock-delay, reentrant) with short TTLs, late releases, renewals and
// abandoned waits on one server, and checks that no freed handoff finds a
// live shared hold, that the lock hash never sits beside a live shared
// hold, and that a semaphore never has more live permits than its limit.
func TestNoExclusiveBesideShared(t *testing.T) {
	instrumentRelease(t)
	srv := testserver.StartRedis(t)
	rdb := srv.Client(t)
	b := New(rdb)
	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Second)
	defer cancel()

	keys := []struct {
		name  string
		limit int
	}{{"rw", 0}, {"sem", 2}}
	var violations, checks, grants, sharedGrants, handed atomic.Int64
	check := func(key string) {
		L := b.lockKey(key)
		n, err := bothHeld.Run(context.Background(), rdb, []string{L, L + ":s"}).Int()
		if err != nil {
			return
		}
		checks.Add(1)
		if key == "sem" {
			if live := rdb.ZCount(context.Background(), L+":s", fmt.Sprintf("(%d", time.Now().UnixMilli()+5), "+inf").Val(); live > 2 {
				violations.Add(1)
				t.Errorf("%s: %d live permits of 2: %v", key, live, rdb.ZRangeWithScores(context.Background(), L+":s", 0, -1).Val())
			}
		}
		if n > 0 {
			violations.Add(1)
			t.Errorf("%s: lock hash %v beside %d live shared holds %v", key, rdb.HGetAll(context.Background(), L).Val(), n,
				rdb.ZRangeWithScores(context.Background(), L+":s", 0, -1).Val())
		}
	}
	ms := func(lo, hi int) time.Duration { return time.Duration(lo+rand.IntN(hi-lo+1)) * time.Millisecond }
	var wg sync.WaitGroup
	var seq atomic.Int64
	tok := func(p string) string { return fmt.Sprintf("%s%d", p, seq.Add(1)) }

	for _, k := range keys {
		key, limit := k.name, k.limit
		// Shared holders.
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					tk := tok("r")
					res, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Token: tk, Owner: tk, TTL: ms(10, 80),
						Mode: driver.Shared, Limit: limit, Wait: rand.IntN(2) == 0, QueueTTL: 200 * time.Millisecond})
					check(key)
					if err != nil || !res.Acquired {
						time.Sleep(ms(0, 5))
						continue
					}
					sharedGrants.Add(1)
					time.Sleep(ms(0, 60))
					if rand.IntN(3) == 0 {
						b.Renew(ctx, key, tk, ms(10, 80))
						check(key)
						time.Sleep(ms(0, 60))
					}
					if rand.IntN(4) != 0 { // some are never released
						b.Release(ctx, key, tk)
					}
					check(key)
				}
			}()
		}
		// Fair waiters that accept a handoff, shared and exclusive; some give
		// up without a word.
		for _, mode := range []driver.Mode{driver.Shared, driver.Exclusive} {
			prefix, hold, count := "h", 100, &grants // an exclusive hold at times past its TTL
			if mode == driver.Shared {
				prefix, hold, count = "f", 60, &sharedGrants
			}
			for range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for ctx.Err() == nil {
						tk := tok(prefix)
						req := driver.AcquireRequest{Key: key, Token: tk, Owner: tk, Mode: mode,
							Fair: true, Wait: true, Handoff: true}
						if mode == driver.Shared {
							req.Limit = limit
						}
						deadline := time.Now().Add(ms(20, 400))
						got := false
						for ctx.Err() == nil && time.Now().Before(deadline) {
							req.TTL, req.QueueTTL = ms(10, 80), ms(30, 150)
							res, err := b.Acquire(ctx, req)
							check(key)
							if err == nil && res.Acquired {
								got = true
								break
							}
							time.Sleep(ms(0, 8))
						}
						if !got {
							if rand.IntN(2) == 0 {
								b.Release(ctx, key, tk) // withdraws, or ends a handed grant or hold
							}
							continue
						}
						count.Add(1)
						time.Sleep(ms(0, hold))
						b.Release(ctx, key, tk)
						check(key)
					}
				}()
			}
		}
		// Plain, lock-delay and reentrant exclusive requests.
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					tk := tok("x")
					req := driver.AcquireRequest{Key: key, Token: tk, Owner: tk, TTL: ms(10, 60),
						Wait: rand.IntN(2) == 0, QueueTTL: 100 * time.Millisecond, Fair: rand.IntN(8) == 0}
					switch rand.IntN(3) {
					case 0:
						req.LockDelay = ms(5, 50)
					case 1:
						req.Reentrant = true
					}
					res, err := b.Acquire(ctx, req)
					check(key)
					if err != nil || !res.Acquired {
						time.Sleep(ms(0, 10))
						if rand.IntN(3) == 0 {
							b.Release(ctx, key, tk)
						}
						continue
					}
					grants.Add(1)
					if req.Reentrant && rand.IntN(2) == 0 {
						b.Acquire(ctx, req)
						check(key)
						b.Release(ctx, key, tk)
					}
					time.Sleep(ms(0, 90)) // past TTL (and into the lock-delay) at times
					if rand.IntN(3) == 0 {
						b.RenewGrant(ctx, key, tk, res.Fence, ms(10, 60))
						time.Sleep(ms(0, 40))
					}
					b.ReleaseGrant(ctx, key, tk, res.Fence)
					check(key)
				}
			}()
		}
	}
	// A sampler between the workers' scripts.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			for _, k := range keys {
				check(k.name)
			}
			time.Sleep(200 * time.Microsecond)
		}
	}()
	wg.Wait()
	for _, k := range keys {
		L := b.lockKey(k.name)
		n, _ := rdb.Get(context.Background(), L+":probe").Int()
		if n > 0 {
			t.Errorf("%s: %d freed handoffs found the lock hash or a live shared hold", k.name, n)
		}
		ho, _ := rdb.Get(context.Background(), L+":probeho").Int()
		fr, _ := rdb.Get(context.Background(), L+":probefreed").Int()
		t.Logf("%s: freed handoff calls %d, granted %d", k.name, fr, ho)
		handed.Add(int64(ho))
	}
	if handed.Load() == 0 {
		t.Error("no freed handoff ran: the test exercised nothing")
	}
	fences, _ := rdb.Get(context.Background(), b.fenceKey("rw")).Int()
	t.Logf("exclusive grants %d, shared grants %d, checks %d, violations %d, fence counter (rw) %d",
		grants.Load(), sharedGrants.Load(), checks.Load(), violations.Load(), fences)
}

// TestFreedHandoffScenarios walks the paths one at a time: a late release in the lock-delay (freed), a reader refused in the
// delay, a release whose grant expired and a reader came in (not freed),
// and a handed grant that expired with its queue entry before a reader.
func TestFreedHandoffScenarios(t *testing.T) {
	instrumentRelease(t)
	srv := testserver.StartRedis(t)
	rdb := srv.Client(t)
	b := New(rdb)
	ctx := t.Context()
	bg := context.Background()
	must := func(req driver.AcquireRequest, want bool, what string) driver.AcquireResult {
		t.Helper()
		res, err := b.Acquire(ctx, req)
		if err != nil || res.Acquired != want {
			t.Fatalf("%s: %+v, %v; want acquired %v", what, res, err, want)
		}
		return res
	}
	both := func(key string) int {
		L := b.lockKey(key)
		n, err := bothHeld.Run(bg, rdb, []string{L, L + ":s"}).Int()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	waiter := func(key, tk string) driver.AcquireRequest {
		return driver.AcquireRequest{Key: key, Token: tk, Owner: tk, TTL: time.Second,
			Fair: true, Wait: true, QueueTTL: 2 * time.Second, Handoff: true}
	}
	reader := func(key, tk string, ttl time.Duration) driver.AcquireRequest {
		return driver.AcquireRequest{Key: key, Token: tk, Owner: tk, TTL: ttl, Mode: driver.Shared, Wait: true, QueueTTL: time.Second}
	}

	t.Run("lock-delay", func(t *testing.T) {
		key := "delay"
		must(driver.AcquireRequest{Key: key, Token: "a", Owner: "a", TTL: 50 * time.Millisecond, LockDelay: 2 * time.Second}, true, "holder")
		must(waiter(key, "w"), false, "waiter")
		time.Sleep(100 * time.Millisecond) // lease over, delay running
		must(reader(key, "r", 5*time.Second), false, "reader in the delay")
		if _, err := b.Release(ctx, key, "a"); err != nil { // late: DEL L, freed
			t.Fatal(err)
		}
		if got := rdb.HGet(bg, b.lockKey(key), "owner").Val(); got != "w" {
			t.Fatalf("handed to %q, want w", got)
		}
		if n := both(key); n != 0 {
			t.Fatalf("exclusive beside %d shared", n)
		}
	})

	t.Run("expired-then-reader", func(t *testing.T) {
		key := "exp"
		must(driver.AcquireRequest{Key: key, Token: "a", Owner: "a", TTL: 10 * time.Second}, true, "holder")
		must(waiter(key, "w"), false, "waiter")
		// The holder's lease runs out now (L gone by its TTL), however long
		// the calls above took.
		if err := rdb.PExpire(bg, b.lockKey(key), time.Millisecond).Err(); err != nil {
			t.Fatal(err)
		}
		for rdb.Exists(bg, b.lockKey(key)).Val() != 0 {
			time.Sleep(time.Millisecond)
		}
		// The waiter's intent is no writer intent (fair entries are not), so a reader gets in.
		must(reader(key, "r", 5*time.Second), true, "reader after expiry")
		if _, err := b.Release(ctx, key, "a"); err != nil { // holds nothing: not freed
			t.Fatal(err)
		}
		if n := both(key); n != 0 {
			t.Fatalf("exclusive beside %d shared", n)
		}
		if ex := rdb.Exists(bg, b.lockKey(key)).Val(); ex != 0 {
			t.Fatalf("the lock was handed over beside a live reader")
		}
	})

	t.Run("handed-expired-then-reader", func(t *testing.T) {
		key := "ho"
		must(driver.AcquireRequest{Key: key, Token: "a", Owner: "a", TTL: time.Second}, true, "holder")
		req := waiter(key, "w")
		must(req, false, "waiter")
		must(waiter(key, "w2"), false, "second waiter")
		if _, err := b.Release(ctx, key, "a"); err != nil { // freed: handed to w
			t.Fatal(err)
		}
		if got := rdb.HGet(bg, b.lockKey(key), "rid").Val(); got != "ho" {
			t.Fatalf("rid %q, want ho", got)
		}
		// w never claims, and the grant expires with w's entry (here now).
		if err := rdb.PExpire(bg, b.lockKey(key), time.Millisecond).Err(); err != nil {
			t.Fatal(err)
		}
		for rdb.Exists(bg, b.lockKey(key)).Val() != 0 {
			time.Sleep(time.Millisecond)
		}
		must(reader(key, "r", 5*time.Second), true, "reader after the handed grant expired")
		// w's late release and w2's retry must not put an exclusive grant beside r.
		if _, err := b.Release(ctx, key, "w"); err != nil {
			t.Fatal(err)
		}
		must(waiter(key, "w2"), false, "second waiter beside the reader")
		if n := both(key); n != 0 {
			t.Fatalf("exclusive beside %d shared", n)
		}
	})

	t.Run("reentrant-late", func(t *testing.T) {
		key := "re"
		req := driver.AcquireRequest{Key: key, Token: "a", Owner: "a", TTL: 10 * time.Second, Reentrant: true, LockDelay: 10 * time.Second}
		must(req, true, "first")
		must(req, true, "re-entry")
		must(waiter(key, "w"), false, "waiter")
		// The lease runs out now and the lock-delay runs: the key lives
		// delay ms past the lease.
		if err := rdb.PExpire(bg, b.lockKey(key), 10*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
		must(req, false, "re-entry in the delay")
		must(reader(key, "r", 5*time.Second), false, "reader in the delay")
		if _, err := b.Release(ctx, key, "a"); err != nil { // expired path: DEL L, freed, holds 2
			t.Fatal(err)
		}
		if n := both(key); n != 0 {
			t.Fatalf("exclusive beside %d shared", n)
		}
	})

	for _, key := range []string{"delay", "exp", "ho", "re"} {
		if n, _ := rdb.Get(bg, b.lockKey(key)+":probe").Int(); n != 0 {
			t.Errorf("%s: %d freed handoffs found a live shared hold", key, n)
		}
	}
}
