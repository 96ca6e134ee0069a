package redislock_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redislock"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// toxiproxy's links (the tests' proxies) end a moment after their
		// proxy or toxic is removed; they are the test rig's, not dlock's.
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).Start.func1"),
	)
}

// setup starts a redis-server and returns a Backend on it and a plain client
// for looking at what the backend stored.
func setup(t *testing.T, opts ...redislock.Option) (*redislock.Backend, *redis.Client, *testserver.Redis) {
	t.Helper()
	srv := testserver.StartRedis(t)
	rdb := srv.Client(t)
	return redislock.New(rdb, opts...), rdb, srv
}

// newToken returns an owner token as the dlock client makes them: 32 hex digits.
func newToken(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func acquire(t *testing.T, b *redislock.Backend, req driver.AcquireRequest) driver.AcquireResult {
	t.Helper()
	res, err := b.Acquire(t.Context(), req)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", req.Key, err)
	}
	return res
}

func mustAcquire(t *testing.T, b *redislock.Backend, req driver.AcquireRequest) driver.AcquireResult {
	t.Helper()
	res := acquire(t, b, req)
	if !res.Acquired {
		t.Fatalf("Acquire(%q) = %+v, want acquired", req.Key, res)
	}
	return res
}

func release(t *testing.T, b *redislock.Backend, key, token string) driver.ReleaseResult {
	t.Helper()
	res, err := b.Release(t.Context(), key, token)
	if err != nil {
		t.Fatalf("Release(%q): %v", key, err)
	}
	return res
}

func renew(t *testing.T, b *redislock.Backend, key, token string, ttl time.Duration) bool {
	t.Helper()
	held, err := b.Renew(t.Context(), key, token, ttl)
	if err != nil {
		t.Fatalf("Renew(%q): %v", key, err)
	}
	return held
}

func pttl(t *testing.T, rdb *redis.Client, name string) time.Duration {
	t.Helper()
	d, err := rdb.PTTL(t.Context(), name).Result()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func exists(t *testing.T, rdb *redis.Client, name string) bool {
	t.Helper()
	n, err := rdb.Exists(t.Context(), name).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// eventually polls cond every 10ms until it holds or 5s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		<-tick.C
	}
}

func TestAcquireFreeLockStoresGrant(t *testing.T) {
	b, rdb, _ := setup(t)
	tok := newToken(t)

	res := mustAcquire(t, b, driver.AcquireRequest{Key: "orders:42", Token: tok, Owner: "host-a|pid 1", TTL: 10 * time.Second})
	if res.Fence != 1 || res.Holds != 1 {
		t.Errorf("first grant: fence %d, holds %d; want 1, 1", res.Fence, res.Holds)
	}

	got, err := rdb.HGetAll(t.Context(), "dlock:{orders:42}").Result()
	if err != nil {
		t.Fatal(err)
	}
	serverMillis := time.Now().UnixMilli() // the test server runs on this machine's clock
	if at, err := strconv.ParseInt(got["at"], 10, 64); err != nil || at < serverMillis-5000 || at > serverMillis {
		t.Errorf("acquired-at field %q, want the server's time in ms (about %d)", got["at"], serverMillis)
	}
	delete(got, "at")
	// The request's id, by which a resent acquire is recognised.
	if got["rid"] == "" || strings.Contains(got["rid"], " ") {
		t.Errorf("request id field %q, want one id", got["rid"])
	}
	delete(got, "rid")
	want := map[string]string{tok: "1", "owner": "host-a|pid 1", "fence": "1"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("lock hash = %v, want %v", got, want)
	}
	if d := pttl(t, rdb, "dlock:{orders:42}"); d <= 9*time.Second || d > 10*time.Second {
		t.Errorf("PTTL = %v, want about 10s", d)
	}
	if n, _ := rdb.Get(t.Context(), "dlock:{orders:42}:fence").Int(); n != 1 {
		t.Errorf("fence counter = %d, want 1", n)
	}
	if d := pttl(t, rdb, "dlock:{orders:42}:fence"); d != -1 {
		t.Errorf("fence counter PTTL = %v, want -1 (no expiry)", d)
	}
}

func TestWithNamespace(t *testing.T) {
	b, rdb, _ := setup(t, redislock.WithNamespace("billing"))
	mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: newToken(t), Owner: "o", TTL: time.Second})
	if !exists(t, rdb, "billing:{k}") || !exists(t, rdb, "billing:{k}:fence") {
		t.Error("keys are not under the namespace billing")
	}
	if exists(t, rdb, "dlock:{k}") {
		t.Error("default namespace used despite WithNamespace")
	}
}

func TestAcquireHeldLockReportsHolder(t *testing.T) {
	b, _, _ := setup(t)
	mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: newToken(t), Owner: "alice", TTL: 10 * time.Second})

	for _, reentrant := range []bool{false, true} {
		res := acquire(t, b, driver.AcquireRequest{Key: "k", Token: newToken(t), Owner: "bob", TTL: time.Second, Reentrant: reentrant})
		if res.Acquired {
			t.Fatalf("reentrant=%v: another token acquired a held lock", reentrant)
		}
		if res.Holder != "alice" {
			t.Errorf("reentrant=%v: Holder = %q, want alice", reentrant, res.Holder)
		}
		if res.HolderTTL <= 9*time.Second || res.HolderTTL > 10*time.Second {
			t.Errorf("reentrant=%v: HolderTTL = %v, want about 10s", reentrant, res.HolderTTL)
		}
		if res.Fence != 0 || res.Holds != 0 {
			t.Errorf("reentrant=%v: refused acquire reports fence %d, holds %d", reentrant, res.Fence, res.Holds)
		}
	}
}

func TestReentrantHoldsAreCounted(t *testing.T) {
	b, rdb, _ := setup(t)
	tok := newToken(t)
	req := driver.AcquireRequest{Key: "k", Token: tok, Owner: "o", TTL: time.Second, Reentrant: true}

	first := mustAcquire(t, b, req)
	req.TTL = 10 * time.Second
	second := mustAcquire(t, b, req)
	if second.Holds != 2 || second.Fence != first.Fence {
		t.Errorf("reentrant acquire = %+v, want holds 2 and the first grant's fence %d", second, first.Fence)
	}
	if d := pttl(t, rdb, "dlock:{k}"); d <= 9*time.Second {
		t.Errorf("reentrant acquire left PTTL %v, want it reset to about 10s", d)
	}

	if got := release(t, b, "k", tok); got != (driver.ReleaseResult{Held: true, Remaining: 1}) {
		t.Errorf("first release = %+v, want held with 1 remaining", got)
	}
	if !renew(t, b, "k", tok, time.Second) {
		t.Error("renew refused while one hold remains")
	}
	if got := release(t, b, "k", tok); got != (driver.ReleaseResult{Held: true, Remaining: 0}) {
		t.Errorf("last release = %+v, want held with 0 remaining", got)
	}
	if exists(t, rdb, "dlock:{k}") {
		t.Error("lock hash still exists after the last release")
	}
	if !exists(t, rdb, "dlock:{k}:fence") {
		t.Error("fence counter was deleted by release")
	}
	if got := release(t, b, "k", tok); got.Held {
		t.Errorf("release of a released lock = %+v, want not held", got)
	}
}

func TestNonReentrantTokenCannotAcquireTwice(t *testing.T) {
	b, _, _ := setup(t)
	req := driver.AcquireRequest{Key: "k", Token: newToken(t), Owner: "alice", TTL: time.Second}
	mustAcquire(t, b, req)

	res := acquire(t, b, req)
	if res.Acquired {
		t.Fatal("a non-reentrant acquire by the holder's token was granted")
	}
	if res.Holder != "alice" {
		t.Errorf("Holder = %q, want alice", res.Holder)
	}
}

func TestOtherTokenCannotRenewOrRelease(t *testing.T) {
	b, rdb, _ := setup(t)
	tok := newToken(t)
	mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: tok, Owner: "o", TTL: 10 * time.Second})
	other := newToken(t)

	if renew(t, b, "k", other, time.Minute) {
		t.Error("Renew by another token reported held")
	}
	if got := release(t, b, "k", other); got.Held {
		t.Errorf("Release by another token = %+v, want not held", got)
	}
	if d := pttl(t, rdb, "dlock:{k}"); d > 10*time.Second {
		t.Errorf("another token's renew changed the TTL to %v", d)
	}
	if n, _ := rdb.HGet(t.Context(), "dlock:{k}", tok).Int(); n != 1 {
		t.Errorf("holder's count = %d after another token's release, want 1", n)
	}
}

func TestRenew(t *testing.T) {
	b, rdb, _ := setup(t)
	tok := newToken(t)
	mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: tok, Owner: "o", TTL: time.Second})

	if !renew(t, b, "k", tok, time.Minute) {
		t.Fatal("holder's renew refused")
	}
	if d := pttl(t, rdb, "dlock:{k}"); d <= 59*time.Second {
		t.Errorf("PTTL after renew = %v, want about 1m", d)
	}

	if err := rdb.Del(t.Context(), "dlock:{k}").Err(); err != nil {
		t.Fatal(err)
	}
	if renew(t, b, "k", tok, time.Minute) {
		t.Error("renew after the key was deleted reported held")
	}
	if exists(t, rdb, "dlock:{k}") {
		t.Error("renew of a deleted lock recreated it")
	}
}

func TestExpiredLockIsGrantedAgainWithLargerFence(t *testing.T) {
	b, rdb, _ := setup(t)
	first := mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: newToken(t), Owner: "o", TTL: 20 * time.Millisecond})
	eventually(t, "the lease expires", func() bool { return !exists(t, rdb, "dlock:{k}") })

	second := mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: newToken(t), Owner: "o2", TTL: time.Second})
	if second.Fence <= first.Fence {
		t.Errorf("fence after expiry = %d, want > %d", second.Fence, first.Fence)
	}
}

func TestFencesStrictlyIncrease(t *testing.T) {
	b, rdb, _ := setup(t)
	var last uint64
	for i := range 1000 {
		tok := newToken(t)
		res := mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: tok, Owner: "o", TTL: time.Second})
		if res.Fence <= last {
			t.Fatalf("grant %d: fence %d after %d", i, res.Fence, last)
		}
		last = res.Fence
		if got := release(t, b, "k", tok); !got.Held {
			t.Fatalf("grant %d: release = %+v", i, got)
		}
	}
	if n, _ := rdb.Get(t.Context(), "dlock:{k}:fence").Uint64(); n != last {
		t.Errorf("fence counter = %d, want %d", n, last)
	}
}

// countingHook counts the commands and pipelines a go-redis client sends.
type countingHook struct {
	mu        sync.Mutex
	commands  []string // single commands, by name
	pipelines [][]string
}

func (h *countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		h.commands = append(h.commands, cmd.Name())
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (h *countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		names := make([]string, len(cmds))
		for i, c := range cmds {
			names[i] = c.Name()
		}
		h.mu.Lock()
		h.pipelines = append(h.pipelines, names)
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

func (h *countingHook) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.commands, h.pipelines = nil, nil
}

// commandCalls returns the calls count of one command in INFO commandstats.
func commandCalls(t *testing.T, rdb *redis.Client, name string) int {
	t.Helper()
	info, err := rdb.Info(t.Context(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^cmdstat_` + name + `:calls=(\d+)`).FindStringSubmatch(info)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

func TestRenewBatchIsOnePipelineWithOrderedResults(t *testing.T) {
	srv := testserver.StartRedis(t)
	rdb := srv.Client(t)
	backendClient := srv.Client(t)
	hook := &countingHook{}
	backendClient.AddHook(hook)
	b := redislock.New(backendClient)

	// Every third lease is not held: released, or renewed with a wrong token.
	reqs := make([]driver.RenewRequest, 300)
	want := make([]bool, len(reqs))
	for i := range reqs {
		key := fmt.Sprintf("lease-%03d", i)
		tok := newToken(t)
		mustAcquire(t, b, driver.AcquireRequest{Key: key, Token: tok, Owner: "o", TTL: time.Second})
		reqs[i] = driver.RenewRequest{Key: key, Token: tok, TTL: time.Minute}
		want[i] = true
		switch i % 6 {
		case 2:
			release(t, b, key, tok)
			want[i] = false
		case 5:
			reqs[i].Token = newToken(t)
			want[i] = false
		}
	}
	renew(t, b, reqs[0].Key, reqs[0].Token, time.Second) // loads the script: no NOSCRIPT retry below
	hook.reset()
	if err := rdb.ConfigResetStat(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}

	results := b.RenewBatch(t.Context(), reqs)
	hook.mu.Lock()
	if len(hook.commands) != 0 || len(hook.pipelines) != 1 || len(hook.pipelines[0]) != len(reqs) {
		t.Errorf("RenewBatch sent commands %v and pipelines %v, want one pipeline of %d", hook.commands, hook.pipelines, len(reqs))
	}
	hook.mu.Unlock()

	if len(results) != len(reqs) {
		t.Fatalf("RenewBatch returned %d results for %d requests", len(results), len(reqs))
	}
	for i, r := range results {
		if r.Err != nil || r.Held != want[i] {
			t.Errorf("result %d (%s) = %+v, want held=%v", i, reqs[i].Key, r, want[i])
		}
		if want[i] {
			if d := pttl(t, rdb, "dlock:{"+reqs[i].Key+"}"); d <= 59*time.Second {
				t.Errorf("%s: PTTL %v after renew, want about 1m", reqs[i].Key, d)
			}
		}
	}
	if n := commandCalls(t, rdb, "evalsha"); n != len(reqs) {
		t.Errorf("server ran EVALSHA %d times, want %d", n, len(reqs))
	}
}

func TestRenewBatchEmpty(t *testing.T) {
	b, _, _ := setup(t)
	if got := b.RenewBatch(t.Context(), nil); len(got) != 0 {
		t.Errorf("RenewBatch(nil) = %v, want no results", got)
	}
}

func TestScriptCacheFlushFallsBackToEval(t *testing.T) {
	b, rdb, _ := setup(t)
	flush := func() {
		t.Helper()
		if err := rdb.ScriptFlush(t.Context()).Err(); err != nil {
			t.Fatal(err)
		}
	}

	flush()
	tok := newToken(t)
	mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: tok, Owner: "o", TTL: time.Second})

	flush()
	other := newToken(t)
	mustAcquire(t, b, driver.AcquireRequest{Key: "k2", Token: other, Owner: "o", TTL: time.Second})
	if err := rdb.ConfigResetStat(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	flush()
	results := b.RenewBatch(t.Context(), []driver.RenewRequest{
		{Key: "k", Token: tok, TTL: time.Minute},
		{Key: "k2", Token: newToken(t), TTL: time.Minute},
		{Key: "k2", Token: other, TTL: time.Minute},
	})
	for i, want := range []bool{true, false, true} {
		if results[i].Err != nil || results[i].Held != want {
			t.Errorf("after SCRIPT FLUSH, result %d = %+v, want held=%v", i, results[i], want)
		}
	}
	// One EVAL puts the script back; the other two follow it as EVALSHA.
	if n := commandCalls(t, rdb, "eval"); n != 1 {
		t.Errorf("server ran EVAL %d times after NOSCRIPT, want 1", n)
	}
	// The next batch needs no fallback.
	b.RenewBatch(t.Context(), []driver.RenewRequest{{Key: "k", Token: tok, TTL: time.Minute}})
	if n := commandCalls(t, rdb, "eval"); n != 1 {
		t.Errorf("EVAL ran again (%d calls) although the script was cached", n)
	}

	// A large batch after a flush sends the script once, not once per
	// lease (after a restart, 100,000 leases would otherwise send 300 MB).
	var big []driver.RenewRequest
	for i := range 500 {
		k := fmt.Sprintf("big-%d", i)
		tk := newToken(t)
		mustAcquire(t, b, driver.AcquireRequest{Key: k, Token: tk, Owner: "o", TTL: time.Minute})
		big = append(big, driver.RenewRequest{Key: k, Token: tk, TTL: time.Minute})
	}
	flush()
	if err := rdb.ConfigResetStat(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	for i, r := range b.RenewBatch(t.Context(), big) {
		if r.Err != nil || !r.Held {
			t.Fatalf("after SCRIPT FLUSH, renewal %d of 500 = %+v, want held", i, r)
		}
	}
	if n := commandCalls(t, rdb, "eval"); n != 1 {
		t.Errorf("a batch of 500 after SCRIPT FLUSH ran EVAL %d times, want 1", n)
	}

	flush()
	if got := release(t, b, "k", tok); !got.Held {
		t.Errorf("release after SCRIPT FLUSH = %+v", got)
	}
}

// TestStoreErrorsNameTheStore: a Backend's errors say the store and its
// address once (go-redis's dial error says the address), and leave the
// operation and the key to the caller (the dlock Client names them).
func TestStoreErrorsNameTheStore(t *testing.T) {
	srv := testserver.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	b := redislock.New(rdb)
	srv.Kill(t)

	ctx := t.Context()
	_, acquireErr := b.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: newToken(t), Owner: "o", TTL: time.Second})
	_, renewErr := b.Renew(ctx, "k", newToken(t), time.Second)
	_, releaseErr := b.Release(ctx, "k", newToken(t))
	batch := b.RenewBatch(ctx, []driver.RenewRequest{{Key: "k", Token: newToken(t), TTL: time.Second}})
	for _, err := range []error{acquireErr, renewErr, releaseErr, batch[0].Err} {
		if err == nil || !strings.HasPrefix(err.Error(), "redis: ") || strings.Count(err.Error(), srv.Addr()) != 1 ||
			strings.Contains(err.Error(), `"k"`) {
			t.Errorf("error = %v, want it to name redis and %s once, without the key", err, srv.Addr())
		}
	}
}

func TestWrongTypeIsAnError(t *testing.T) {
	b, rdb, _ := setup(t)
	if err := rdb.Set(t.Context(), "dlock:{k}", "not a hash", 0).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := b.Acquire(t.Context(), driver.AcquireRequest{Key: "k", Token: newToken(t), Owner: "o", TTL: time.Second})
	if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Errorf("Acquire on a string key: err = %v, want a WRONGTYPE error", err)
	}
}

func TestReleaseAcquireRunsTheReleaseFirstAfterScriptFlush(t *testing.T) {
	b, rdb, _ := setup(t)
	ctx := t.Context()
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// The acquire's script is back in the server's cache, the release's
	// is not: the pipeline's release fails with NOSCRIPT while its
	// acquire runs.
	a, next := newToken(t), newToken(t)
	first := mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: a, Owner: "a", TTL: time.Minute})
	res, err := b.ReleaseAcquire(ctx, "k", a, first.Fence, driver.AcquireRequest{
		Key: "k", Token: next, Owner: "next", TTL: time.Minute, Wait: true, QueueTTL: 10 * time.Second,
	})
	if err != nil || res.AcquireErr != nil {
		t.Fatalf("ReleaseAcquire: %v, %v", err, res.AcquireErr)
	}
	if !res.Release.Held {
		t.Errorf("release = %+v, want a's hold released", res.Release)
	}
	if !res.Acquire.Acquired {
		t.Errorf("acquire = %+v, want granted: it runs after the release that freed the lock", res.Acquire)
	}
}
