package redislock_test

// The scripts' fast paths (acquire.lua: a lock free of everything; release.lua:
// the last hold of a plain grant with nobody waiting) must answer as the
// full path would and leave the same state, and must not be taken when
// anything else is on the lock. These tests pin both down.

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// grantState is what a grant leaves in the lock hash, with the parts that
// differ from one grant to the next made comparable: the holder's token as
// "<token>", the acquired time checked and dropped, the request id checked
// and dropped, the TTL rounded to seconds.
func grantState(t *testing.T, rdb *redis.Client, name, token string) string {
	t.Helper()
	got, err := rdb.HGetAll(t.Context(), name).Result()
	if err != nil {
		t.Fatal(err)
	}
	serverMillis := time.Now().UnixMilli() // the test server runs on this machine's clock
	if at, err := strconv.ParseInt(got["at"], 10, 64); err != nil || at < serverMillis-5000 || at > serverMillis || got["at"] != strconv.FormatInt(at, 10) {
		t.Errorf("%s: acquired-at field %q, want the server's time in ms (about %d) in decimal", name, got["at"], serverMillis)
	}
	if got["rid"] == "" || strings.Contains(got["rid"], " ") {
		t.Errorf("%s: request id field %q, want one id", name, got["rid"])
	}
	delete(got, "at")
	delete(got, "rid")
	if v, ok := got[token]; ok {
		got["<token>"] = v
		delete(got, token)
	}
	keys := make([]string, 0, len(got))
	for k := range got {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var sb strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&sb, "%s=%s ", k, got[k])
	}
	fmt.Fprintf(&sb, "ttl=%ds", (pttl(t, rdb, name)+500*time.Millisecond)/time.Second)
	return sb.String()
}

// TestFastPathGrantLeavesTheFullPathsState: a grant on a free lock (the
// fast path) and a grant made where something else is on the lock (a
// writer intent of another token, which sends the script down its full
// path and does not refuse an exclusive grant) leave the same hash: fields,
// formats and TTL, with and without a lock-delay.
func TestFastPathGrantLeavesTheFullPathsState(t *testing.T) {
	b, rdb, _ := setup(t)
	for _, delay := range []time.Duration{0, 2 * time.Second} {
		t.Run(fmt.Sprint("delay=", delay), func(t *testing.T) {
			fast, full := "fast/"+delay.String(), "full/"+delay.String()
			// A writer waits on full: its intent is there, nothing holds it.
			reader, writer := newToken(t), newToken(t)
			mustAcquire(t, b, driver.AcquireRequest{Key: full, Token: reader, Owner: "reader", TTL: 10 * time.Second, Mode: driver.Shared})
			if res := acquire(t, b, driver.AcquireRequest{Key: full, Token: writer, Owner: "writer", TTL: 10 * time.Second, Wait: true, QueueTTL: 10 * time.Second}); res.Acquired || !res.Queued {
				t.Fatalf("writer behind a reader: %+v, want refused with an intent", res)
			}
			if !release(t, b, full, reader).Held {
				t.Fatal("the reader did not hold")
			}
			if !exists(t, rdb, "dlock:{"+full+"}:w") {
				t.Fatal("the writer's intent is gone; the full path would not be taken")
			}
			// Bring both fence counters to 41, so that both grants draw 42.
			for _, k := range []string{fast, full} {
				if err := rdb.Set(t.Context(), "dlock:{"+k+"}:fence", 41, 0).Err(); err != nil {
					t.Fatal(err)
				}
			}

			for _, k := range []string{fast, full} {
				tok := newToken(t)
				res := mustAcquire(t, b, driver.AcquireRequest{Key: k, Token: tok, Owner: "host-a|pid 1", TTL: 10 * time.Second, LockDelay: delay})
				if res.Fence != 42 || res.Holds != 1 || res.Overtook {
					t.Errorf("%s: grant %+v, want fence 42, one hold, no overtaking", k, res)
				}
				got := grantState(t, rdb, "dlock:{"+k+"}", tok)
				want := "<token>=1 fence=42 owner=host-a|pid 1 ttl=10s"
				if delay > 0 {
					want = "<token>=1 delay=2000 fence=42 owner=host-a|pid 1 ttl=12s"
				}
				if got != want {
					t.Errorf("%s: lock hash %s, want %s", k, got, want)
				}
				if res := release(t, b, k, tok); !res.Held || res.Remaining != 0 {
					t.Errorf("%s: release %+v, want held, none left", k, res)
				}
			}
		})
	}
}

// TestFastPathNotTakenWhenSomethingIsOnTheLock: with a fair queue entry, a
// live shared hold, a writer intent, an unclaimed handoff or an expired
// lease in its lock-delay on the lock, an acquire must be answered by the
// full path (a grant on a free lock would be wrong in each case), and a
// release must do the full path's work (hand over, announce to the head,
// remove the releasing token's own entry).
func TestFastPathNotTakenWhenSomethingIsOnTheLock(t *testing.T) {
	b, rdb, _ := setup(t)
	ttl := 10 * time.Second
	plain := func(key, tok string) driver.AcquireRequest {
		return driver.AcquireRequest{Key: key, Token: tok, Owner: "plain", TTL: ttl}
	}
	queue := func(key, tok string) driver.AcquireRequest {
		return driver.AcquireRequest{Key: key, Token: tok, Owner: "queued", TTL: ttl, Fair: true, Wait: true, QueueTTL: ttl, Handoff: true}
	}

	t.Run("queue entry", func(t *testing.T) {
		key, holder, head := "q/entry", newToken(t), newToken(t)
		short := plain(key, holder)
		short.TTL = 100 * time.Millisecond
		mustAcquire(t, b, short)
		if res := acquire(t, b, queue(key, head)); res.Acquired || res.Position != 1 {
			t.Fatalf("queued: %+v, want position 1", res)
		}
		// The holder's lease runs out (no release, so no handoff): the
		// lock is free with a live queue.
		time.Sleep(200 * time.Millisecond)
		// A fair request of another token is refused: promised to the head.
		if res := acquire(t, b, driver.AcquireRequest{Key: key, Token: newToken(t), Owner: "fair", TTL: ttl, Fair: true}); res.Acquired {
			t.Errorf("fair request before a live queue's head: %+v, want refused", res)
		}
		// A plain one is granted, and says it went before the queue.
		other := newToken(t)
		if res := mustAcquire(t, b, plain(key, other)); !res.Overtook {
			t.Errorf("plain grant before a live queue: %+v, want Overtook", res)
		}
		// Its release hands the lock to the head (the full path's work).
		if res := release(t, b, key, other); !res.Held {
			t.Fatalf("release: %+v", res)
		}
		if h, _ := rdb.HGet(t.Context(), "dlock:{"+key+"}", head).Result(); h != "1" {
			t.Errorf("after the release, the head holds %q, want a handoff grant", h)
		}
		if rid, _ := rdb.HGet(t.Context(), "dlock:{"+key+"}", "rid").Result(); rid != "ho" {
			t.Errorf("handoff grant's rid %q, want ho", rid)
		}
		// An unclaimed handoff: another plain request is refused, the
		// head's own request claims it.
		if res := acquire(t, b, plain(key, newToken(t))); res.Acquired {
			t.Errorf("plain request on an unclaimed handoff: %+v, want refused", res)
		}
		if res := mustAcquire(t, b, queue(key, head)); res.Holds != 1 {
			t.Errorf("head's claim: %+v", res)
		}
		release(t, b, key, head)
	})

	t.Run("shared hold", func(t *testing.T) {
		key, reader := "q/reader", newToken(t)
		mustAcquire(t, b, driver.AcquireRequest{Key: key, Token: reader, Owner: "reader", TTL: ttl, Mode: driver.Shared})
		if res := acquire(t, b, plain(key, newToken(t))); res.Acquired || res.Shared != 1 {
			t.Errorf("exclusive request with a live reader: %+v, want refused by one shared hold", res)
		}
		release(t, b, key, reader)
		// An expired hold left in the set (the set carries its latest
		// entry's expiry, so this takes writing by hand, as a hold whose
		// expiry was cut short would): granted, and pruned by the grant.
		s, si := "dlock:{"+key+"}:s", "dlock:{"+key+"}:si"
		if err := rdb.ZAdd(t.Context(), s, redis.Z{Score: 1, Member: "gone"}).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.HSet(t.Context(), si, "gone", "1 0 reader").Err(); err != nil {
			t.Fatal(err)
		}
		tok := newToken(t)
		if res := mustAcquire(t, b, plain(key, tok)); res.Overtook {
			t.Errorf("grant over an expired reader: %+v", res)
		}
		if exists(t, rdb, s) || exists(t, rdb, si) {
			t.Errorf("the expired reader outlives the grant that found it")
		}
		release(t, b, key, tok)
	})

	t.Run("own intent", func(t *testing.T) {
		key, reader, writer := "q/intent", newToken(t), newToken(t)
		mustAcquire(t, b, driver.AcquireRequest{Key: key, Token: reader, Owner: "reader", TTL: ttl, Mode: driver.Shared})
		req := plain(key, writer)
		req.Wait, req.QueueTTL = true, ttl
		if res := acquire(t, b, req); res.Acquired || !res.Queued {
			t.Fatalf("writer behind a reader: %+v, want an intent", res)
		}
		release(t, b, key, reader)
		// The writer's grant removes its own intent (the full path's
		// forget), which the fast path does not know of.
		mustAcquire(t, b, req)
		if exists(t, rdb, "dlock:{"+key+"}:w") {
			t.Errorf("the writer's intent outlives its grant")
		}
		release(t, b, key, writer)
	})

	t.Run("lock-delay", func(t *testing.T) {
		key, tok := "q/delay", newToken(t)
		req := plain(key, tok)
		req.TTL, req.LockDelay = 100*time.Millisecond, 5*time.Second
		mustAcquire(t, b, req)
		time.Sleep(200 * time.Millisecond) // the lease expired; the delay runs
		if res := acquire(t, b, plain(key, newToken(t))); res.Acquired {
			t.Errorf("request during the lock-delay: %+v, want refused", res)
		}
		// The late holder's release frees the lock, but reports that the
		// lease was gone: not the fast path's "released".
		if res := release(t, b, key, tok); res.Held {
			t.Errorf("release of an expired lease in its lock-delay: %+v, want not held", res)
		}
		if exists(t, rdb, "dlock:{"+key+"}") {
			t.Errorf("the lock-delay outlives the late holder's release")
		}
	})

	t.Run("release with an intent", func(t *testing.T) {
		// A release that leaves the lock to a waiting writer announces it to
		// every waiter; one with nobody waiting announces "next:" too. The
		// difference the test can see: the releasing token's own intent is
		// removed with its hold.
		key, holder, reader := "q/relintent", newToken(t), newToken(t)
		mustAcquire(t, b, driver.AcquireRequest{Key: key, Token: reader, Owner: "reader", TTL: ttl, Mode: driver.Shared})
		req := plain(key, holder)
		req.Wait, req.QueueTTL = true, ttl
		acquire(t, b, req) // refused: its intent is recorded
		release(t, b, key, reader)
		// The intent's owner is granted, then a plain grant of the same
		// token is held while its intent is back (written by hand, as a
		// second wait of that token would).
		mustAcquire(t, b, req)
		if err := rdb.HSet(t.Context(), "dlock:{"+key+"}:w", "t", holder, "o", "plain").Err(); err != nil {
			t.Fatal(err)
		}
		if res := release(t, b, key, holder); !res.Held || res.Remaining != 0 {
			t.Errorf("release: %+v, want held, none left", res)
		}
		if exists(t, rdb, "dlock:{"+key+"}:w") {
			t.Errorf("the releasing token's intent outlives its release")
		}
	})
}

// TestRecentReleasesStayBounded: the fast release puts its id in front of
// the lock's recent releases; after many releases the record is cut to its
// bound, keeps whole ids (at least 16), the newest first, and lives 15s
// after the latest.
func TestRecentReleasesStayBounded(t *testing.T) {
	b, rdb, _ := setup(t)
	key, recent := "recent/bounded", "dlock:{recent/bounded}:r"
	var last string
	for i := range 300 {
		tok := newToken(t)
		mustAcquire(t, b, driver.AcquireRequest{Key: key, Token: tok, Owner: "o", TTL: 10 * time.Second})
		if res := release(t, b, key, tok); !res.Held || res.Remaining != 0 {
			t.Fatalf("release %d: %+v", i, res)
		}
		ids, err := rdb.Get(t.Context(), recent).Result()
		if err != nil {
			t.Fatalf("recent releases after release %d: %v", i, err)
		}
		if len(ids) > 640+64 {
			t.Fatalf("recent releases after release %d: %d bytes, want them cut near 640", i, len(ids))
		}
		fields := strings.Fields(ids)
		if want := min(i+1, 16); len(fields) < want {
			t.Fatalf("recent releases after release %d: %d ids, want at least %d", i, len(fields), want)
		}
		if strings.Join(fields, " ") != ids {
			t.Fatalf("recent releases %q: want ids separated by one space", ids)
		}
		if i > 0 && fields[1] != last {
			t.Fatalf("recent releases %q: want the previous release's id %q second", ids, last)
		}
		last = fields[0]
	}
	if d := pttl(t, rdb, recent); d <= 14*time.Second || d > 15*time.Second {
		t.Errorf("recent releases PTTL = %v, want about 15s", d)
	}
}

// TestResentFastReleaseAmongOthers: a fast release whose answer was lost
// is sent again by go-redis; the resend finds its id among the recent
// releases (appended after many others, so the record has been cut) and
// answers "released", as the first run did, and a later release of
// another token is not taken for a resend.
func TestResentFastReleaseAmongOthers(t *testing.T) {
	srv := testserver.StartRedis(t)
	admin := srv.Client(t)
	proxy := startCutProxy(t, srv.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: proxy.addr(), PoolSize: 1, MaxRetries: 3})
	defer rdb.Close()
	if err := rdb.Ping(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	cut, other := redislock.New(rdb), redislock.New(admin)
	key := "resend/among"
	cycle := func(b *redislock.Backend) string {
		tok := newToken(t)
		mustAcquire(t, b, driver.AcquireRequest{Key: key, Token: tok, Owner: "o", TTL: 10 * time.Second})
		return tok
	}
	release(t, cut, key, cycle(cut)) // the scripts in the cache, through the proxy
	for range 100 {                  // more releases than the record keeps
		release(t, other, key, cycle(other))
	}
	tok := cycle(cut)
	proxy.armed.Store(true)
	res := release(t, cut, key, tok)
	proxy.armed.Store(false)
	if proxy.cuts.Load() != 1 {
		t.Fatal("the proxy did not cut the release's answer")
	}
	if !res.Held || res.Remaining != 0 {
		t.Errorf("resent release: %+v, want released, none left (the first run's answer)", res)
	}
	if exists(t, admin, "dlock:{"+key+"}") {
		t.Errorf("the lock is still held after the release")
	}
	// A release of a token that held nothing is still "not held".
	if res := release(t, other, key, newToken(t)); res.Held {
		t.Errorf("release of a token that never held: %+v, want not held", res)
	}
}

// TestQueueKeysExpireSoonAfterTheLatestEntry: the fair queue's three keys
// expire no sooner than the entry that expires last and at most a quarter
// of the QueueTTL of the request that wrote last after it, through entries
// that arrive and leave in any order (unqueue fits them again only when the
// entry that leaves was that one), and vanish with the last entry.
func TestQueueKeysExpireSoonAfterTheLatestEntry(t *testing.T) {
	b, rdb, _ := setup(t)
	key, holder := "q/expiry", newToken(t)
	mustAcquire(t, b, driver.AcquireRequest{Key: key, Token: holder, Owner: "holder", TTL: time.Minute})
	base := "dlock:{" + key + "}"
	queueKeys := []string{base + ":q", base + ":qe", base + ":qo"}
	// wantTTL checks the keys' TTL against want, the latest entry's time
	// to live, and want+slack.
	wantTTL := func(step string, want, slack time.Duration) {
		t.Helper()
		for _, k := range queueKeys {
			got := pttl(t, rdb, k)
			if want == 0 {
				if n, _ := rdb.Exists(t.Context(), k).Result(); n != 0 {
					t.Errorf("%s: %s exists (ttl %v), want it gone", step, k, got)
				}
				continue
			}
			if got > want+slack || got < want-2*time.Second {
				t.Errorf("%s: %s ttl %v, want %v to %v", step, k, got, want, want+slack)
			}
		}
	}
	enqueue := func(tok string, qttl time.Duration) {
		t.Helper()
		res := acquire(t, b, driver.AcquireRequest{Key: key, Token: tok, Owner: "w", TTL: time.Minute, Fair: true, Wait: true, QueueTTL: qttl, Handoff: true})
		if res.Acquired || res.Position == 0 {
			t.Fatalf("enqueue: %+v, want queued", res)
		}
	}
	withdraw := func(tok string) {
		t.Helper()
		if err := b.Withdraw(t.Context(), key, tok); err != nil {
			t.Fatal(err)
		}
	}
	a, long, mid := newToken(t), newToken(t), newToken(t)
	enqueue(a, 10*time.Second)
	wantTTL("one entry of 10s", 10*time.Second, 2500*time.Millisecond)
	enqueue(long, 40*time.Second)
	enqueue(mid, 25*time.Second)
	wantTTL("entries of 10s, 40s, 25s", 40*time.Second, 6250*time.Millisecond)
	withdraw(a) // the head, not the latest
	wantTTL("the head left", 40*time.Second, 6250*time.Millisecond)
	withdraw(long) // the latest
	wantTTL("the latest left", 25*time.Second, 0)
	enqueue(mid, 5*time.Second) // a refresh that shortens the latest entry
	wantTTL("the latest refreshed shorter", 5*time.Second, 1250*time.Millisecond)
	// The release hands the lock to the last entry: the queue is gone.
	if res := release(t, b, key, holder); !res.Held {
		t.Fatalf("release: %+v", res)
	}
	if h, _ := rdb.HGet(t.Context(), base, mid).Result(); h != "1" {
		t.Fatalf("after the release the head holds %q, want a handoff grant", h)
	}
	wantTTL("handed to the last entry", 0, 0)
	mustAcquire(t, b, driver.AcquireRequest{Key: key, Token: mid, Owner: "w", TTL: time.Minute, Fair: true, Wait: true, QueueTTL: time.Second, Handoff: true})
	release(t, b, key, mid)
}

// TestQueueJoinMovesKeysExpiryOnlyWhenNeeded: a join whose entry the
// queue's keys outlive by more than an eighth of its QueueTTL leaves their
// expiry as it is (a join costs no PEXPIREAT then), and a join whose entry
// would outlive them moves it past the entry.
func TestQueueJoinMovesKeysExpiryOnlyWhenNeeded(t *testing.T) {
	b, rdb, _ := setup(t)
	key := "q/stretch"
	mustAcquire(t, b, driver.AcquireRequest{Key: key, Token: newToken(t), Owner: "holder", TTL: time.Minute})
	base := "dlock:{" + key + "}"
	enqueue := func(tok string, qttl time.Duration) {
		t.Helper()
		res := acquire(t, b, driver.AcquireRequest{Key: key, Token: tok, Owner: "w", TTL: time.Minute, Fair: true, Wait: true, QueueTTL: qttl, Handoff: true})
		if res.Acquired || res.Position == 0 {
			t.Fatalf("enqueue: %+v, want queued", res)
		}
	}
	// expiry returns the keys' expiry (ms since the epoch), which the
	// three share.
	expiry := func() time.Duration {
		t.Helper()
		var at time.Duration
		for i, k := range []string{base + ":q", base + ":qe", base + ":qo"} {
			e, err := rdb.PExpireTime(t.Context(), k).Result()
			if err != nil {
				t.Fatal(err)
			}
			if i > 0 && e != at {
				t.Fatalf("%s expires at %v, the queue's other keys at %v", k, e, at)
			}
			at = e
		}
		return at
	}
	first, second, third := newToken(t), newToken(t), newToken(t)
	enqueue(first, 40*time.Second)
	before := expiry()
	time.Sleep(5 * time.Millisecond) // the next entry expires later than the first
	enqueue(second, 40*time.Second)
	if after := expiry(); after != before {
		t.Errorf("a join that the keys outlive moved their expiry from %v to %v", before, after)
	}
	enqueue(third, time.Minute)
	exp, err := rdb.ZScore(t.Context(), base+":qe", third).Result()
	if err != nil {
		t.Fatal(err)
	}
	if after := expiry(); after < time.Duration(exp)*time.Millisecond {
		t.Errorf("the keys expire at %v, before the latest entry (%v ms)", after, exp)
	}
}

// TestQueueJoinExpiresQueueBesideLeftOverOwners: a join that starts a
// queue gives its keys an expiry even when :qo outlived the queue before
// it with an expiry that would cover the entry (a release of a client
// before the handoff channel leaves fields of gone entries there).
func TestQueueJoinExpiresQueueBesideLeftOverOwners(t *testing.T) {
	b, rdb, _ := setup(t)
	key := "q/leftover"
	mustAcquire(t, b, driver.AcquireRequest{Key: key, Token: newToken(t), Owner: "holder", TTL: time.Minute})
	base := "dlock:{" + key + "}"
	if err := rdb.HSet(t.Context(), base+":qo", "\x00gone", "id").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.PExpire(t.Context(), base+":qo", 1200*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	res := acquire(t, b, driver.AcquireRequest{Key: key, Token: newToken(t), Owner: "w", TTL: time.Minute, Fair: true, Wait: true, QueueTTL: time.Second, Handoff: true})
	if res.Acquired || res.Position != 1 {
		t.Fatalf("join: %+v, want queued first", res)
	}
	for _, k := range []string{base + ":q", base + ":qe", base + ":qo"} {
		if d := pttl(t, rdb, k); d < 500*time.Millisecond || d > 1250*time.Millisecond {
			t.Errorf("%s expires in %v, want within the entry's 1s and a quarter", k, d)
		}
	}
}
