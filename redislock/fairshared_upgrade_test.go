package redislock_test

// Clients of this version and of the one before fair shared requests
// (testdata/prefairshared: its acquire, release, common and late scripts)
// share a Redis during a rolling upgrade: the older scripts know only
// exclusive queue entries and handoffs, and must neither grant a fair
// shared entry an exclusive lock nor let a grant break the lock's kind.

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// prevScripts reads the scripts of the version before fair shared requests.
func prevScripts(t *testing.T) redislock.Scripts {
	t.Helper()
	read := func(name string) string {
		b, err := os.ReadFile("testdata/prefairshared/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	return redislock.Scripts{Acquire: read("acquire.lua"), Release: read("release.lua"),
		Common: read("common.lua"), Late: read("late.lua")}
}

// oldAcquire runs req as a client of the version before would.
func oldAcquire(t *testing.T, b *redislock.Backend, old redislock.Scripts, req driver.AcquireRequest) driver.AcquireResult {
	t.Helper()
	res, err := redislock.AcquireWithScripts(t.Context(), b, req, old)
	if err != nil {
		t.Fatalf("old acquire of %s: %v", req.Token, err)
	}
	return res
}

// oldRelease releases token's grant as a client of the version before
// would.
func oldRelease(t *testing.T, b *redislock.Backend, old redislock.Scripts, key, token string, fence uint64) {
	t.Helper()
	if n, err := redislock.ReleaseGrantWithScripts(t.Context(), b, key, token, fence, old); err != nil || n != 0 {
		t.Fatalf("old release of %s: %d, %v; want 0", token, n, err)
	}
}

// queueTokens returns the tokens of key's fair queue, head first.
func queueTokens(t *testing.T, rdb *redis.Client, key string) []string {
	t.Helper()
	toks, err := rdb.ZRange(t.Context(), "dlock:{"+key+"}:q", 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	return toks
}

// lockState reads, in one script, the fields of key's lock hash and the
// tokens of its live shared holds.
var lockState = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {redis.call('HKEYS', KEYS[1]), redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. now, '+inf')}`)

// checkKind fails the test when key's holds break its kind: an exclusive
// grant beside live shared holds, an exclusive grant to a token of a shared
// request (shared), or, with limit, more live shared holds than limit. It
// returns the live shared holds.
func checkKind(t *testing.T, rdb *redis.Client, key string, limit int, shared map[string]bool, step string) []string {
	t.Helper()
	v, err := lockState.Run(t.Context(), rdb, []string{"dlock:{" + key + "}", "dlock:{" + key + "}:s"}).Slice()
	if err != nil {
		t.Fatal(err)
	}
	var fields, live []string
	for _, f := range v[0].([]any) {
		fields = append(fields, f.(string))
	}
	for _, s := range v[1].([]any) {
		live = append(live, s.(string))
	}
	if len(fields) > 0 && len(live) > 0 {
		t.Errorf("%s: an exclusive grant (%q) beside live shared holds %q", step, fields, live)
	}
	for _, f := range fields {
		if shared[f] {
			t.Errorf("%s: the shared request %s holds an exclusive grant", step, f)
		}
	}
	if limit > 0 && len(live) > limit {
		t.Errorf("%s: %d live permits, limit %d: %q", step, len(live), limit, live)
	}
	return live
}

// An older client's release of a writer, with new fair readers at the
// queue's head, knows no shared handoff: it hands them nothing and no
// exclusive grant either (their owners are under fields it does not read),
// and names the head on the release channel; the head reader then gets in
// by its own request, which hands the reader behind it a hold.
func TestOldReleaseNamesFairReaderHeadOnReleaseChannel(t *testing.T) {
	srv := testserver.StartRedis(t)
	const name = "upgrade-rw"
	old := prevScripts(t)
	rdb := srv.Client(t)
	inner := redislock.New(srv.Client(t))
	writer := redislock.New(srv.Client(t))
	wtok := newToken(t)
	res := oldAcquire(t, writer, old, driver.AcquireRequest{Key: name, Token: wtok, Owner: "old writer", TTL: 10 * time.Second})
	if !res.Acquired {
		t.Fatalf("old writer: %+v", res)
	}
	ps := rdb.PSubscribe(t.Context(), "dlock:{"+name+"}:*")
	t.Cleanup(func() { _ = ps.Close() })
	if _, err := ps.Receive(t.Context()); err != nil {
		t.Fatal(err)
	}
	opts := []dlock.Option{dlock.Fair(), dlock.WithTTL(3 * time.Second)}
	read := func(c *dlock.Client) func(context.Context) (*dlock.Lease, error) {
		return c.RWMutex(name, opts...).RLock
	}
	r1 := startWaiter(t, srv, inner, name, 1, read)
	r2 := startWaiter(t, srv, inner, name, 2, read)
	q := queueTokens(t, rdb, name)
	if len(q) != 2 {
		t.Fatalf("queue %q; want the two readers", q)
	}
	n1 := r1.b.acquires.Load()
	oldRelease(t, writer, old, name, wtok, res.Fence)
	if n, err := rdb.Exists(t.Context(), "dlock:{"+name+"}").Result(); err != nil || n != 0 {
		t.Errorf("the old release left an exclusive grant (EXISTS %d, %v)", n, err)
	}
	// Every message of the release comes before this one (one connection,
	// published in order).
	if err := rdb.Publish(t.Context(), "dlock:{"+name+"}:end", "").Err(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for {
		m, err := ps.ReceiveMessage(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(m.Channel, ":end") {
			break
		}
		got = append(got, strings.TrimPrefix(m.Channel, "dlock:{"+name+"}")+" "+m.Payload)
	}
	// The head's own grant may have come before the marker, handing the
	// reader behind it a hold on that reader's handoff channel.
	if len(got) == 0 || got[0] != ":rel next:"+q[0] || slices.ContainsFunc(got[1:], func(m string) bool {
		return !strings.HasPrefix(m, ":ho:") || !strings.Contains(m, " next:"+q[1]+"\x00")
	}) {
		t.Errorf("published %q; want %q first (the old release), then at most a handoff to %s", got, ":rel next:"+q[0], q[1])
	}
	var leases []*dlock.Lease
	for i, r := range []*fairWaiter{r1, r2} {
		l := <-r.out
		if l == nil {
			t.FailNow()
		}
		leases = append(leases, l)
		if want := i == 1; r.handed.Load() != want {
			t.Errorf("reader %d handed its hold: %v, want %v (the head by its own request, the next by the head's grant)", i+1, r.handed.Load(), want)
		}
	}
	if r1.b.acquires.Load() == n1 {
		t.Error("the head reader got in without a request of its own")
	}
	if live := checkKind(t, rdb, name, 0, map[string]bool{q[0]: true, q[1]: true}, "readers in"); len(live) != 2 {
		t.Errorf("live shared holds %q; want both readers", live)
	}
	for _, l := range leases {
		if err := l.Unlock(t.Context()); err != nil {
			t.Error(err)
		}
	}
}

// An older client's queue pruning (its acquire's enqueue, its release)
// deletes an expired entry's owner and channel fields but not a fair shared
// entry's own field: it leaves at most byte 1 + token fields of tokens no
// longer queued in the queue's owners, which expire with the queue's keys
// and go when the queue does, and the queue goes on handing the lock over.
func TestOldQueuePruneLeavesOnlyExpiringSharedFields(t *testing.T) {
	srv := testserver.StartRedis(t)
	const name = "upgrade-prune"
	old := prevScripts(t)
	rdb := srv.Client(t)
	b := redislock.New(srv.Client(t))
	ctx := t.Context()
	qo := "dlock:{" + name + "}:qo"
	fair := func(token string, mode driver.Mode, queueTTL time.Duration) driver.AcquireRequest {
		return driver.AcquireRequest{Key: name, Token: token, Owner: "o " + token, TTL: 10 * time.Second, Mode: mode,
			Fair: true, Wait: true, QueueTTL: queueTTL, Handoff: true}
	}
	holder := newToken(t)
	hres := mustAcquire(t, b, driver.AcquireRequest{Key: name, Token: holder, Owner: "holder", TTL: 10 * time.Second})
	readers := []string{newToken(t), newToken(t)}
	for _, r := range readers {
		if res := acquire(t, b, fair(r, driver.Shared, 300*time.Millisecond)); !res.Queued {
			t.Fatalf("reader: %+v, want queued", res)
		}
	}
	w1, w2 := newToken(t), newToken(t)
	if res := oldAcquire(t, b, old, fair(w1, driver.Exclusive, 5*time.Second)); !res.Queued {
		t.Fatalf("old writer: %+v, want queued", res)
	}
	// The readers' entries expire by the server's clock.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		n, err := rdb.ZCount(ctx, "dlock:{"+name+"}:qe", "-inf", "+inf").Result()
		if err != nil {
			t.Fatal(err)
		}
		exp, err := rdb.ZScore(ctx, "dlock:{"+name+"}:qe", readers[1]).Result()
		if err != nil || n != 3 {
			t.Fatalf("queue's expiries: %d entries, %v", n, err)
		}
		tm, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if float64(tm.UnixMilli()) > exp {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the readers' entries never expired")
		}
	}
	// checkFields fails the test unless every field of the queue's owners
	// is a live entry's, or byte 1 + a token no longer queued, and the
	// owners expire when the queue does.
	checkFields := func(step string) {
		t.Helper()
		queued := map[string]bool{}
		for _, tok := range queueTokens(t, rdb, name) {
			queued[tok] = true
		}
		fields, err := rdb.HKeys(ctx, qo).Result()
		if err != nil {
			t.Fatal(err)
		}
		var stale []string
		for _, f := range fields {
			tok := strings.TrimLeft(f, "\x00\x01")
			switch {
			case queued[tok]:
			case strings.HasPrefix(f, "\x01") && len(f) == len(tok)+1:
				stale = append(stale, tok)
			default:
				t.Errorf("%s: the queue's owners keep %q of a token no longer queued", step, f)
			}
		}
		t.Logf("%s: fields of gone shared entries left: %d", step, len(stale))
		pipe := rdb.Pipeline()
		qt := pipe.PExpireTime(ctx, "dlock:{"+name+"}:q")
		ot := pipe.PExpireTime(ctx, qo)
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		if qt.Val() <= 0 || ot.Val() != qt.Val() {
			t.Errorf("%s: the queue's owners expire at %v, the queue at %v; want the same time", step, ot.Val(), qt.Val())
		}
	}
	// An older client's enqueue prunes the expired readers.
	if res := oldAcquire(t, b, old, fair(w2, driver.Exclusive, 5*time.Second)); !res.Queued || res.Position != 2 {
		t.Fatalf("second old writer: %+v, want queued second", res)
	}
	checkFields("after an old enqueue's prune")
	// An older client's release hands the lock to the live head.
	oldRelease(t, b, old, name, holder, hres.Fence)
	f1 := handedFence(t, rdb, "dlock:{"+name+"}", w1)
	if f1 == 0 {
		t.Fatal("the old release did not hand the lock to the old writer at the head")
	}
	checkFields("after an old release")
	// This version's release hands it to the last entry: the queue's keys,
	// its owners with them, go.
	if _, err := b.ReleaseGrant(ctx, name, w1, f1); err != nil {
		t.Fatal(err)
	}
	if handedFence(t, rdb, "dlock:{"+name+"}", w2) == 0 {
		t.Fatal("the release did not hand the lock to the last entry")
	}
	if n, err := rdb.Exists(ctx, qo).Result(); err != nil || n != 0 {
		t.Errorf("the queue's owners outlive the queue (EXISTS %d, %v)", n, err)
	}
}

// An older client's acquires beside fair shared entries of this version
// keep the lock's kind: its plain reader is kept out by a queued writer's
// intent (one that a release gave the writer it stopped at too), its fair writer
// queues behind the fair readers and is handed the lock when the last of
// them leaves, and its plain permits stay within the limit with the permits
// handed to fair entries; no fair shared entry gets an exclusive grant.
func TestOldAcquiresBesideFairSharedEntriesKeepKind(t *testing.T) {
	srv := testserver.StartRedis(t)
	old := prevScripts(t)
	rdb := srv.Client(t)
	b := redislock.New(srv.Client(t))
	ctx := t.Context()
	shared := map[string]bool{}
	req := func(key, token string, mode driver.Mode, limit int, fair bool) driver.AcquireRequest {
		if mode == driver.Shared {
			shared[token] = true
		}
		r := driver.AcquireRequest{Key: key, Token: token, Owner: "o " + token, TTL: 10 * time.Second, Mode: mode, Limit: limit,
			Wait: true, QueueTTL: 5 * time.Second}
		if fair {
			r.Fair, r.Handoff = true, true
		}
		return r
	}
	want := func(res driver.AcquireResult, acquired bool, what string) driver.AcquireResult {
		t.Helper()
		if res.Acquired != acquired {
			t.Fatalf("%s: %+v, want acquired %v", what, res, acquired)
		}
		return res
	}
	handed := func(key, token string) bool {
		t.Helper()
		s, err := rdb.ZScore(ctx, "dlock:{"+key+"}:s", token).Result()
		return err == nil && s > 0 || handedFence(t, rdb, "dlock:{"+key+"}", token) > 0
	}

	t.Run("rw", func(t *testing.T) {
		const key = "upgrade-kind-rw"
		check := func(step string) []string { t.Helper(); return checkKind(t, rdb, key, 0, shared, step) }
		r0, w1, r2, r3, ow, or := newToken(t), newToken(t), newToken(t), newToken(t), newToken(t), newToken(t)
		g0 := want(acquire(t, b, req(key, r0, driver.Shared, 0, true)), true, "first fair reader")
		want(acquire(t, b, req(key, w1, driver.Exclusive, 0, true)), false, "fair writer")
		want(acquire(t, b, req(key, r2, driver.Shared, 0, true)), false, "fair reader behind the writer")
		want(acquire(t, b, req(key, r3, driver.Shared, 0, true)), false, "second fair reader behind the writer")
		if res := want(oldAcquire(t, b, old, req(key, or, driver.Shared, 0, false)), false, "old plain reader"); !res.WriterWaiting {
			t.Errorf("old plain reader: %+v; want refused by the queued writer's intent", res)
		}
		if res := want(oldAcquire(t, b, old, req(key, ow, driver.Exclusive, 0, true)), false, "old fair writer"); res.Position != 4 {
			t.Errorf("old fair writer: %+v; want queued fourth", res)
		}
		check("queued")
		if _, err := b.ReleaseGrant(ctx, key, r0, g0.Fence); err != nil {
			t.Fatal(err)
		}
		f1 := handedFence(t, rdb, "dlock:{"+key+"}", w1)
		if f1 == 0 {
			t.Fatal("the first reader's release did not hand the lock to the fair writer")
		}
		check("the writer handed the lock")
		want(oldAcquire(t, b, old, req(key, or, driver.Shared, 0, false)), false, "old plain reader beside the writer")
		if _, err := b.ReleaseGrant(ctx, key, w1, f1); err != nil {
			t.Fatal(err)
		}
		if live := check("the readers handed the lock"); !slices.Contains(live, r2) || !slices.Contains(live, r3) || len(live) != 2 {
			t.Fatalf("live shared holds %q; want the two queued readers", live)
		}
		// The release that handed the readers their holds stopped at the
		// old writer, which now waits for them: it gave that writer a
		// writer intent, which keeps plain readers out.
		if res := want(oldAcquire(t, b, old, req(key, or, driver.Shared, 0, false)), false, "old plain reader beside readers"); !res.WriterWaiting {
			t.Errorf("old plain reader beside readers: %+v; want refused by the old writer's intent", res)
		}
		check("old plain reader kept out")
		want(oldAcquire(t, b, old, req(key, ow, driver.Exclusive, 0, true)), false, "old fair writer beside readers")
		r5 := newToken(t)
		if res := want(acquire(t, b, req(key, r5, driver.Shared, 0, true)), false, "fair reader behind the old writer"); res.Position != 2 {
			t.Errorf("fair reader behind the old writer: %+v; want queued second", res)
		}
		if _, err := b.Release(ctx, key, r2); err != nil {
			t.Fatal(err)
		}
		check("a reader released")
		if handed(key, ow) {
			t.Fatal("the old writer was handed the lock beside a live reader")
		}
		if _, err := b.Release(ctx, key, r3); err != nil {
			t.Fatal(err)
		}
		if !handed(key, ow) {
			t.Fatal("the last reader's release did not hand the lock to the old writer")
		}
		check("old writer handed the lock")
		want(acquire(t, b, req(key, r5, driver.Shared, 0, true)), false, "fair reader beside the old writer")
		gw := want(oldAcquire(t, b, old, req(key, ow, driver.Exclusive, 0, true)), true, "old writer claims its grant")
		oldRelease(t, b, old, key, ow, gw.Fence)
		check("old writer released")
		if handed(key, r5) {
			t.Fatal("the old release handed the reader a hold")
		}
		want(acquire(t, b, req(key, r5, driver.Shared, 0, true)), true, "the head reader by its own request")
		check("head reader in")
	})

	t.Run("semaphore", func(t *testing.T) {
		const key = "upgrade-kind-sem"
		const limit = 2
		check := func(step string) []string { t.Helper(); return checkKind(t, rdb, key, limit, shared, step) }
		o1, p2, p3, p4, o5 := newToken(t), newToken(t), newToken(t), newToken(t), newToken(t)
		g1 := want(oldAcquire(t, b, old, req(key, o1, driver.Shared, limit, false)), true, "old plain permit")
		g2 := want(acquire(t, b, req(key, p2, driver.Shared, limit, true)), true, "fair permit")
		want(acquire(t, b, req(key, p3, driver.Shared, limit, true)), false, "fair permit beyond the limit")
		want(acquire(t, b, req(key, p4, driver.Shared, limit, true)), false, "second fair permit beyond the limit")
		want(oldAcquire(t, b, old, req(key, o5, driver.Shared, limit, false)), false, "old plain permit beyond the limit")
		check("full")
		// The old release hands nothing over and wakes every waiter; a
		// plain permit may take the one freed, as plain requests go before
		// a queue.
		oldRelease(t, b, old, key, o1, g1.Fence)
		if handed(key, p3) {
			t.Fatal("the old release handed a permit")
		}
		want(oldAcquire(t, b, old, req(key, o5, driver.Shared, limit, false)), true, "old plain permit, one free")
		check("old permit in")
		want(acquire(t, b, req(key, p3, driver.Shared, limit, true)), false, "the head, the permits taken")
		if _, err := b.ReleaseGrant(ctx, key, p2, g2.Fence); err != nil {
			t.Fatal(err)
		}
		if !handed(key, p3) || handed(key, p4) {
			t.Fatal("the release did not hand one permit to the head")
		}
		check("permit handed")
		want(oldAcquire(t, b, old, req(key, o1, driver.Shared, limit, false)), false, "old plain permit, none free")
		if _, err := b.Release(ctx, key, o5); err != nil {
			t.Fatal(err)
		}
		if !handed(key, p4) {
			t.Fatal("the old permit's release did not hand its permit to the head")
		}
		check("second permit handed")
	})

	t.Run("one permit", func(t *testing.T) {
		// An older release that leaves the lock free of holds, with a fair
		// permit at the head, names it on the release channel and grants
		// it nothing.
		const key = "upgrade-kind-one"
		check := func(step string) []string { t.Helper(); return checkKind(t, rdb, key, 1, shared, step) }
		o1, p2 := newToken(t), newToken(t)
		g1 := want(oldAcquire(t, b, old, req(key, o1, driver.Shared, 1, false)), true, "old plain permit")
		want(acquire(t, b, req(key, p2, driver.Shared, 1, true)), false, "fair permit")
		oldRelease(t, b, old, key, o1, g1.Fence)
		check("old release")
		if handed(key, p2) {
			t.Fatal("the old release handed the permit")
		}
		want(acquire(t, b, req(key, p2, driver.Shared, 1, true)), true, "the head by its own request")
		check("head in")
	})
}
