package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// A channel rule that covers the release channels but not the
// handoff channels (&dlock:{*}:rel: braces are literal in ACL globs) has
// the release channel confirmed and the handoff channel refused. Subscribe
// fails with ErrNotifyRefused, and neither channel stays subscribed.
func TestRefusedHandoffChannelLeavesNoChannel(t *testing.T) {
	srv := testserver.StartRedis(t)
	admin := srv.Client(t)
	if err := admin.Do(t.Context(), "ACL", "SETUSER", "app", "on", ">pw", "~*", "+@all", "resetchannels", "&dlock:{*}:rel").Err(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "app", Password: "pw"})
	defer rdb.Close()
	b := redislock.New(rdb)
	l, err := b.Listen(t.Context(), func(string, string) {})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	err = l.Subscribe(ctx, "x")
	if !errors.Is(err, driver.ErrNotifyRefused) {
		t.Fatalf("Subscribe = %v, want ErrNotifyRefused", err)
	}
	if !strings.Contains(err.Error(), "&dlock:*") {
		t.Errorf("refusal %q does not name the rule &dlock:*", err)
	}
	noChannelLeft(t, admin, "no channel left after the refusal")
	// Unsubscribe after the failed Subscribe: nothing was counted.
	if err := l.Unsubscribe(t.Context(), "x"); err == nil || !strings.HasPrefix(err.Error(), `redislock: unsubscribe "x": `) {
		t.Errorf("Unsubscribe after a failed Subscribe = %v, want a wrapped not-subscribed error", err)
	}
}

// Close during a Subscribe that waits for its confirmation
// (server paused) fails it with ErrClosed, and a later Unsubscribe does
// nothing; no channel is left on the server once the listener is closed.
func TestCloseDuringSubscribe(t *testing.T) {
	b, rdb, _ := setup(t)
	l, err := b.Listen(t.Context(), func(string, string) {})
	if err != nil {
		t.Fatal(err)
	}
	subscribe(t, l, "warm")
	if err := rdb.ClientPause(t.Context(), 300*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- l.Subscribe(t.Context(), "k") }()
	time.Sleep(50 * time.Millisecond)
	_ = l.Close()
	if err := <-errc; !errors.Is(err, redis.ErrClosed) {
		t.Fatalf("Subscribe during Close = %v, want ErrClosed", err)
	}
	if err := l.Unsubscribe(t.Context(), "k"); err != nil {
		t.Errorf("Unsubscribe after Close = %v, want nil", err)
	}
	noChannelLeft(t, rdb, "no channel left after Close")
}

// Lock names containing "}" and ":ho:" never make two channels
// of different keys (or of a key) equal.
func TestChannelNamesDistinct(t *testing.T) {
	b, _, _ := setup(t)
	hid := strings.TrimSuffix(strings.TrimPrefix(redislock.HandoffChannel(b, "x"), "dlock:{x}:ho:"), ":rel")
	keys := []string{"x", "x}", "x}:ho", "x}:ho:" + hid, "x}:ho:" + hid + ":rel", "x:ho", "x}:rel", "ho", "x}:ho:rel"}
	seen := map[string]string{}
	for _, k := range keys {
		for _, ch := range []string{"dlock:{" + k + "}:rel", redislock.HandoffChannel(b, k), "dlock:{" + k + "}:ho:rel"} {
			if o, ok := seen[ch]; ok {
				t.Errorf("channel %q of key %q is also %q's", ch, k, o)
			}
			seen[ch] = k
		}
	}
}

// With the narrow channel rule &NS:*:rel (minimal ACL
// otherwise), a handoff reaches the head on its handoff channel and an
// observer on the watch channel: the script's PUBLISH of both (a pcall,
// which would fail silently) is allowed. On one node, in a custom
// namespace, and on a Cluster (SPUBLISH).
func TestNarrowRuleHandoffEndToEnd(t *testing.T) {
	narrow := func(ns string) string {
		return strings.Replace(strings.Replace(minimalACL, "~dlock:*", "~"+ns+":*", 1), "&dlock:*", "&"+ns+":*:rel", 1)
	}
	run := func(t *testing.T, ns string, newClient func() redis.UniversalClient) {
		opt := redislock.WithNamespace(ns)
		holder, head, watcher := redislock.New(newClient(), opt), redislock.New(newClient(), opt), redislock.New(newClient(), opt)
		headHeard := listenTo(t, head, "k")
		wh := &heard{}
		wl, err := watcher.Listen(t.Context(), wh.fn)
		if err != nil {
			t.Fatal(err)
		}
		defer wl.Close()
		if err := wl.(driver.HandoffWatcher).Watch(t.Context(), "k"); err != nil {
			t.Fatalf("Watch with %s: %v", "&"+ns+":*:rel", err)
		}
		holderTok, headTok := newToken(t), newToken(t)
		mustAcquire(t, holder, driver.AcquireRequest{Key: "k", Token: holderTok, Owner: "holder", TTL: 10 * time.Second, Fair: true})
		res := acquire(t, head, driver.AcquireRequest{Key: "k", Token: headTok, Owner: "head", TTL: 10 * time.Second,
			Fair: true, Wait: true, QueueTTL: 5 * time.Second, Handoff: true})
		if res.Acquired || !res.Queued {
			t.Fatalf("the head's request: %+v; want queued", res)
		}
		if _, err := holder.Release(t.Context(), "k", holderTok); err != nil {
			t.Fatal(err)
		}
		waitHeard(t, headHeard, "k "+headTok+"\x00")
		waitHeard(t, wh, "k "+headTok+"\x00")
	}
	for _, ns := range []string{"dlock", "app:x"} {
		t.Run("node/"+ns, func(t *testing.T) {
			srv := testserver.StartRedis(t)
			aclUser(t, narrow(ns), srv.Client(t))
			run(t, ns, func() redis.UniversalClient {
				rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "app", Password: "pw"})
				t.Cleanup(func() { _ = rdb.Close() })
				return rdb
			})
		})
	}
	t.Run("cluster", func(t *testing.T) {
		cl := testserver.StartCluster(t, 3)
		var nodes []*redis.Client
		for i := range cl.Len() {
			nodes = append(nodes, cl.Node(i).Client(t))
		}
		aclUser(t, narrow("dlock"), nodes...)
		run(t, "dlock", func() redis.UniversalClient {
			rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), Username: "app", Password: "pw"})
			t.Cleanup(func() { _ = rdb.Close() })
			return rdb
		})
	})
}

// Subscribes whose ctx ends at every point of pair (between
// the two joins, during the Cluster's homing of either channel, between
// the two awaits) leave no channel behind, and the counts stay right: a
// later Subscribe holds both channels and its Unsubscribe drops both.
func TestGiveUpAnywhereLeavesNoChannel(t *testing.T) {
	check := func(t *testing.T, b *redislock.Backend, chans func() []string) {
		l, err := b.Listen(t.Context(), func(string, string) {})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		subscribe(t, l, "warm")
		l.Unsubscribe(t.Context(), "warm")
		failed, other := 0, map[string]int{}
		for i := range 300 {
			ctx, cancel := context.WithTimeout(t.Context(), time.Duration(i%60)*10*time.Microsecond)
			err := l.Subscribe(ctx, "k")
			cancel()
			if err == nil {
				if err := l.Unsubscribe(t.Context(), "k"); err != nil {
					t.Fatalf("Unsubscribe: %v", err)
				}
			} else {
				if !errors.Is(err, context.DeadlineExceeded) {
					other[strings.SplitN(err.Error(), "127.0.0.1", 2)[0]]++
				}
				failed++
			}
		}
		t.Logf("%d of 300 Subscribes gave up; errors not wrapping ctx.Err(): %v", failed, other)
		eventually(t, "no channel left", func() bool {
			time.Sleep(20 * time.Millisecond)
			return len(chans()) == 0
		})
		subscribe(t, l, "k")
		if got := chans(); len(got) != 2 {
			t.Errorf("channels after Subscribe: %q, want the release and handoff channels", got)
		}
		if err := l.Unsubscribe(t.Context(), "k"); err != nil {
			t.Fatal(err)
		}
		eventually(t, "no channel left after Unsubscribe", func() bool { return len(chans()) == 0 })
		if err := l.Unsubscribe(t.Context(), "k"); err == nil || !strings.HasPrefix(err.Error(), `redislock: unsubscribe "k": `) {
			t.Errorf("second Unsubscribe = %v, want a wrapped not-subscribed error", err)
		}
	}
	t.Run("node", func(t *testing.T) {
		b, rdb, _ := setup(t)
		check(t, b, func() []string {
			chs, err := rdb.PubSubChannels(t.Context(), "*").Result()
			if err != nil {
				t.Fatal(err)
			}
			return chs
		})
	})
	t.Run("cluster", func(t *testing.T) {
		cl := testserver.StartCluster(t, 3)
		b := redislock.New(cl.Client(t))
		check(t, b, func() []string {
			var all []string
			for i := range cl.Len() {
				chs, err := cl.Node(i).Client(t).PubSubShardChannels(t.Context(), "*").Result()
				if err != nil {
					t.Fatal(err)
				}
				all = append(all, chs...)
			}
			return all
		})
	})
}

// A Subscribe whose SUBSCRIBE cannot be written before its
// deadline fails with an error wrapping the deadline, and leaves no channel
// on the server: go-redis subscribes the channel again after reconnecting,
// and the listener unsubscribes what nobody holds.
func TestFailedSubscribeWriteLeavesNoChannel(t *testing.T) {
	b, rdb, _ := setup(t)
	l, err := b.Listen(t.Context(), func(string, string) {})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	subscribe(t, l, "warm")
	if err := l.Unsubscribe(t.Context(), "warm"); err != nil {
		t.Fatal(err)
	}
	failed := 0
	for i := range 200 {
		key := fmt.Sprint("k", i)
		ctx, cancel := context.WithTimeout(t.Context(), time.Duration(i%40)*10*time.Microsecond)
		err := l.Subscribe(ctx, key)
		cancel()
		switch {
		case err == nil:
			if err := l.Unsubscribe(t.Context(), key); err != nil {
				t.Fatal(err)
			}
		case errors.Is(err, context.DeadlineExceeded):
			failed++
		default:
			t.Errorf("Subscribe(%s) = %v, want an error wrapping its deadline", key, err)
		}
	}
	t.Logf("%d of 200 Subscribes ran out of time", failed)
	if failed == 0 {
		t.Fatal("no Subscribe failed: the test did not exercise a failed write")
	}
	// Whatever connection the failed writes broke, the listener is back.
	subscribe(t, l, "probe")
	if err := l.Unsubscribe(t.Context(), "probe"); err != nil {
		t.Fatal(err)
	}
	noChannelLeft(t, rdb, "no channel left on the server")
}

// noChannelLeft waits until the server rdb has no pub/sub channel left,
// and fails the test, naming what and one channel left, when it has not.
func noChannelLeft(t *testing.T, rdb redis.UniversalClient, what string) {
	t.Helper()
	eventually(t, what, func() bool {
		chs, err := rdb.PubSubChannels(t.Context(), "*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(chs) > 0 {
			t.Logf("left on the server: %d, e.g. %q", len(chs), chs[0])
		}
		return len(chs) == 0
	})
}
