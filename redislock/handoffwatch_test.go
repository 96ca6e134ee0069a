package redislock_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// An observer of an election on a third Client is woken by every release
// it hears (Election.Observe, waitHub.watchers). A resignation that hands
// the leadership to a queued Fair campaigner was announced on the release
// channel, which the observer hears; announced on the new leader's own
// handoff channel alone, it reaches no observer elsewhere, which then sees
// the new leader only at its safety-net read (observeSafetyNet, 2 s).
func TestObserverSeesHandedLeaderAtOnce(t *testing.T) {
	_, rdb, srv := setup(t)
	newClient := func() *dlock.Client {
		c := dlock.New(redislock.New(srv.Client(t)), dlock.WithTTL(10*time.Second))
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	leaderC, nextC, obsC := newClient(), newClient(), newClient()
	ctx := t.Context()

	ld, err := leaderC.Election("e", dlock.Fair()).Campaign(ctx, "v1")
	if err != nil {
		t.Fatal(err)
	}
	seen, err := obsC.Election("e").Observe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	recv := func() dlock.LeaderInfo {
		t.Helper()
		select {
		case li := <-seen:
			return li
		case <-time.After(5 * time.Second):
			t.Fatal("no leader observed in 5s")
		}
		return dlock.LeaderInfo{}
	}
	if got := recv(); got.Value != "v1" {
		t.Fatalf("first observed %+v, want v1", got)
	}
	type res struct {
		ld  *dlock.Leadership
		err error
	}
	won := make(chan res, 1)
	go func() {
		l, err := nextC.Election("e", dlock.Fair()).Campaign(ctx, "v2")
		won <- res{l, err}
	}()
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if n, _ := rdb.HLen(ctx, "dlock:{e}:qo").Result(); n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second campaigner did not queue with a handoff")
		}
	}
	time.Sleep(50 * time.Millisecond) // the observer is asleep on its notification
	resigned := time.Now()
	if err := ld.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-won
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer func() { _ = r.ld.Resign(context.Background()) }()
	for {
		got := recv()
		if got.Value == "v2" {
			break
		}
	}
	took := time.Since(resigned)
	t.Logf("the observer saw the handed leader %v after the resignation", took)
	if took > 300*time.Millisecond {
		t.Errorf("the observer on a third Client saw the new leader after %v; want at once (the handoff used to be announced to every subscriber)", took)
	}
}

// A Redis user whose channel rule covers the release channels alone
// ("&dlock:*:rel", dlock:{name}:rel) is notified as before the handoff
// channels: they end in ":rel" too (dlock:{name}:ho:<id>:rel), so the rule
// covers them, and a refused one would disable the Client's notifications
// altogether.
func TestNarrowChannelRuleCoversHandoffChannels(t *testing.T) {
	srv := testserver.StartRedis(t)
	if err := srv.Client(t).Do(t.Context(), "ACL", "SETUSER", "app", "on", ">pw", "~*", "+@all", "resetchannels", "&dlock:*:rel").Err(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "app", Password: "pw"})
	defer rdb.Close()
	l, err := redislock.New(rdb).Listen(t.Context(), func(string, string) {})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	err = l.Subscribe(ctx, "x")
	if errors.Is(err, driver.ErrNotifyRefused) {
		t.Errorf("Subscribe with the channel rule &dlock:*:rel = %v; want it to succeed", err)
	} else if err != nil {
		t.Fatal(err)
	}
}

// A Subscribe that gives up while Redis has not yet confirmed leaves
// neither channel behind; a later one holds both, and Unsubscribe drops
// both.
func TestSubscribeGiveUpLeavesNoChannel(t *testing.T) {
	b, rdb, _ := setup(t)
	l, err := b.Listen(t.Context(), func(string, string) {})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	subscribe(t, l, "warm") // the pub/sub connection is up
	rel, ho := "dlock:{k}:rel", redislock.HandoffChannel(b, "k")
	num := func() (int64, int64) {
		m, err := rdb.PubSubNumSub(t.Context(), rel, ho).Result()
		if err != nil {
			t.Fatal(err)
		}
		return m[rel], m[ho]
	}
	if err := rdb.ClientPause(t.Context(), 300*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := l.Subscribe(short, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Subscribe during a pause = %v, want DeadlineExceeded", err)
	}
	eventually(t, "both channels dropped after the pause", func() bool {
		time.Sleep(50 * time.Millisecond)
		a, h := num()
		return a == 0 && h == 0
	})
	subscribe(t, l, "k")
	if a, h := num(); a != 1 || h != 1 {
		t.Fatalf("after Subscribe: NUMSUB rel=%d handoff=%d, want 1 1", a, h)
	}
	if err := l.Unsubscribe(t.Context(), "k"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "both channels dropped after Unsubscribe", func() bool {
		a, h := num()
		return a == 0 && h == 0
	})
}

// On a Cluster the handoff channel follows the key's slot to its new
// master, and a handoff after the move reaches the head.
func TestClusterHandoffAfterSlotMove(t *testing.T) {
	b, c := setupCluster(t)
	holder := redislock.New(c.Client(t))
	k := keysPerNode(t, c, 1)[0][0]
	h := listenTo(t, b, k)
	c.MoveSlot(t, c.Slot(t, lockKey(k)), 1)
	ho := redislock.HandoffChannel(b, k)
	eventually(t, "the handoff channel is subscribed on the new master", func() bool {
		m, err := c.Node(1).Client(t).PubSubShardNumSub(t.Context(), ho).Result()
		return err == nil && m[ho] == 1
	})
	holderTok, headTok := newToken(t), newToken(t)
	mustAcquire(t, holder, driver.AcquireRequest{Key: k, Token: holderTok, Owner: "holder", TTL: 10 * time.Second})
	if res := acquire(t, b, driver.AcquireRequest{Key: k, Token: headTok, Owner: "head", TTL: 10 * time.Second,
		Fair: true, Wait: true, QueueTTL: 5 * time.Second, Handoff: true}); !res.Queued {
		t.Fatalf("head: %+v, want queued", res)
	}
	release(t, holder, k, holderTok)
	waitHeard(t, h, k+" "+headTok+"\x00")
}

// A Listener that watches a key (driver.HandoffWatcher) hears the handoffs
// of the key to other Backends' entries, on one node and on a Cluster, and
// no longer after Unwatch.
func TestWatchHearsOthersHandoffs(t *testing.T) {
	run := func(t *testing.T, holder, head, watcher *redislock.Backend, k string) {
		h := &heard{}
		l, err := watcher.Listen(t.Context(), h.fn)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if err := l.Subscribe(t.Context(), k); err != nil {
			t.Fatal(err)
		}
		w := l.(driver.HandoffWatcher)
		if err := w.Watch(t.Context(), k); err != nil {
			t.Fatal(err)
		}
		handOnce := func() string {
			holderTok, headTok := newToken(t), newToken(t)
			mustAcquire(t, holder, driver.AcquireRequest{Key: k, Token: holderTok, Owner: "holder", TTL: 10 * time.Second})
			if res := acquire(t, head, driver.AcquireRequest{Key: k, Token: headTok, Owner: "head", TTL: 10 * time.Second,
				Fair: true, Wait: true, QueueTTL: 5 * time.Second, Handoff: true}); !res.Queued {
				t.Fatalf("head: %+v, want queued", res)
			}
			release(t, holder, k, holderTok)
			return headTok
		}
		tok := handOnce()
		waitHeard(t, h, k+" "+tok+"\x00")
		if err := w.Unwatch(t.Context(), k); err != nil {
			t.Fatal(err)
		}
		release(t, head, k, tok)
		tok = handOnce()
		time.Sleep(200 * time.Millisecond)
		for _, m := range h.all() {
			if strings.HasPrefix(m, k+" "+tok+"\x00") {
				t.Fatalf("heard %q after Unwatch", m)
			}
		}
	}
	t.Run("node", func(t *testing.T) {
		holder, _, srv := setup(t)
		run(t, holder, redislock.New(srv.Client(t)), redislock.New(srv.Client(t)), "k")
	})
	t.Run("cluster", func(t *testing.T) {
		b, c := setupCluster(t)
		run(t, b, redislock.New(c.Client(t)), redislock.New(c.Client(t)), keysPerNode(t, c, 1)[1][0])
	})
}

// During a rolling upgrade, a client of the version before the handoff
// channel (testdata/prehid: its release and common scripts) hands the lock
// to a new client's entry on the release channel, which the new client
// still subscribes: the head hears it. The old script deletes the entry's
// owner but not its handoff id ("\0" + token), which stays in :qo until
// the queue empties (it expires with the queue's keys, at most a quarter of
// a QueueTTL after its latest entry): a field per such handoff, for the
// length of the upgrade (docs/REDIS.md).
func TestOldReleaseHandsOffToNewEntry(t *testing.T) {
	holder, rdb, srv := setup(t)
	head, next := redislock.New(srv.Client(t)), redislock.New(srv.Client(t))
	headHeard := listenTo(t, head, "k")
	oldRelease, err := os.ReadFile("testdata/prehid/release.lua")
	if err != nil {
		t.Fatal(err)
	}
	oldCommon, err := os.ReadFile("testdata/prehid/common.lua")
	if err != nil {
		t.Fatal(err)
	}
	holderTok, headTok, nextTok := newToken(t), newToken(t), newToken(t)
	mustAcquire(t, holder, driver.AcquireRequest{Key: "k", Token: holderTok, Owner: "holder", TTL: 10 * time.Second})
	for _, w := range []struct {
		b   *redislock.Backend
		tok string
	}{{head, headTok}, {next, nextTok}} {
		if res := acquire(t, w.b, driver.AcquireRequest{Key: "k", Token: w.tok, Owner: "w", TTL: 10 * time.Second,
			Fair: true, Wait: true, QueueTTL: 5 * time.Second, Handoff: true}); !res.Queued {
			t.Fatalf("waiter: %+v, want queued", res)
		}
	}
	if _, err := redislock.ReleaseWithScripts(t.Context(), holder, "k", holderTok, string(oldRelease), string(oldCommon)); err != nil {
		t.Fatal(err)
	}
	if owner, _ := rdb.HGet(t.Context(), "dlock:{k}", "owner").Result(); owner != "w" {
		t.Fatalf("the old release did not hand the lock to the head (owner %q)", owner)
	}
	waitHeard(t, headHeard, "k "+headTok+"\x00")
	fields, _ := rdb.HKeys(t.Context(), "dlock:{k}:qo").Result()
	pttl, _ := rdb.PTTL(t.Context(), "dlock:{k}:qo").Result()
	t.Logf(":qo after the old release: %q, expiring in %v", fields, pttl)
	if pttl <= 0 || pttl > 5*time.Second+5*time.Second/4 {
		t.Errorf(":qo expires in %v; want with the queue's keys (within its 5s QueueTTL and a quarter)", pttl)
	}
}
