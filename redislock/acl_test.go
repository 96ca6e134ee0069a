package redislock_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// warnings is a slog handler that keeps the messages of warnings.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	msg := r.Message
	r.Attrs(func(a slog.Attr) bool {
		msg += " " + a.Key + "=" + a.Value.String()
		return true
	})
	w.msgs = append(w.msgs, msg)
	return nil
}
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }

func (w *warnings) matching(s string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, m := range w.msgs {
		if strings.Contains(m, s) {
			out = append(out, m)
		}
	}
	return out
}

// aclUser makes the Redis user "app" with password "pw" and the given rules
// on every node (rdbs), as an operator would.
func aclUser(t *testing.T, rules string, rdbs ...*redis.Client) {
	t.Helper()
	args := []any{"ACL", "SETUSER", "app", "reset", "on", ">pw"}
	for _, r := range strings.Fields(rules) {
		args = append(args, r)
	}
	for _, rdb := range rdbs {
		if err := rdb.Do(t.Context(), args...).Err(); err != nil {
			t.Fatalf("ACL SETUSER: %v", err)
		}
	}
}

// checkWaitsWithoutPubSub runs a holder, a waiter and a third Client on
// clients made by newClient, whose Redis user may not use the release
// channels: a Lock of a free lock returns, a waiter gets the lock soon after
// the holder's Unlock (by polling), Unlock reports the release, and each
// Client warns once about the missing rule.
func checkWaitsWithoutPubSub(t *testing.T, newClient func() redis.UniversalClient) {
	w := &warnings{}
	log := slog.New(w)
	a := dlock.New(redislock.New(newClient()), dlock.WithLogger(log))
	defer a.Close()
	b := dlock.New(redislock.New(newClient()), dlock.WithLogger(log))
	defer b.Close()

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for _, fair := range []bool{false, true} {
		name := "acl/plain"
		var opts []dlock.Option
		if fair {
			name, opts = "acl/fair", []dlock.Option{dlock.Fair()}
		}
		held, err := a.Mutex(name, opts...).Lock(ctx)
		if err != nil {
			t.Fatalf("Lock of a free lock: %v", err)
		}
		got := make(chan error, 1)
		go func() {
			l, err := b.Mutex(name, opts...).Lock(ctx)
			if err == nil {
				err = l.Unlock(ctx)
			}
			got <- err
		}()
		time.Sleep(300 * time.Millisecond) // the waiter subscribes (and is refused) and waits
		if err := held.Unlock(ctx); err != nil {
			t.Fatalf("Unlock whose release could not be announced: %v", err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Fatalf("waiter: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the waiter did not get the lock within 5s of the release")
		}
	}
	// A Client whose subscriptions are refused says so once, naming the rule.
	if ws := w.matching("refuses release notifications"); len(ws) != 1 {
		t.Errorf("warnings about refused notifications: %q, want exactly one", ws)
	} else if !strings.Contains(ws[0], "&dlock:*") {
		t.Errorf("the warning does not name the missing channel rule: %q", ws[0])
	}
}

// A Redis 7 user made the usual way (ACL SETUSER app on >pw ~* +@all) may
// not use any channel (acl-pubsub-default resetchannels): dlock must not
// hang, and a release must still be a release.
func TestWithoutPubSubRights(t *testing.T) {
	srv := testserver.StartRedis(t)
	aclUser(t, "~* +@all resetchannels", srv.Client(t))
	checkWaitsWithoutPubSub(t, func() redis.UniversalClient {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "app", Password: "pw"})
		t.Cleanup(func() { _ = rdb.Close() })
		return rdb
	})

	// The listener itself reports the refusal as driver.ErrNotifyRefused.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "app", Password: "pw"})
	defer rdb.Close()
	l, err := redislock.New(rdb).Listen(t.Context(), func(string, string) {})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := l.Subscribe(ctx, "x"); !errors.Is(err, driver.ErrNotifyRefused) {
		t.Fatalf("Subscribe without channel rights = %v, want driver.ErrNotifyRefused", err)
	}
}

func TestWithoutPubSubRightsCluster(t *testing.T) {
	cl := testserver.StartCluster(t, 3)
	var nodes []*redis.Client
	for i := range cl.Len() {
		nodes = append(nodes, cl.Node(i).Client(t))
	}
	aclUser(t, "~* +@all resetchannels", nodes...)
	checkWaitsWithoutPubSub(t, func() redis.UniversalClient {
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), Username: "app", Password: "pw"})
		t.Cleanup(func() { _ = rdb.Close() })
		return rdb
	})
}

// minimalACL is the ACL that docs/REDIS.md gives for dlock's Redis user:
// keys and channels of the default namespace, the commands the client
// sends, and the commands its scripts run.
const minimalACL = "~dlock:* &dlock:* " +
	"+evalsha +eval +subscribe +unsubscribe +ssubscribe +sunsubscribe +ping +scan +wait " +
	"+hello +auth +cluster|slots +cluster|shards +config|get " +
	"+publish +spublish +del +exists +get +set +incr +time +pexpire +pexpireat +pttl " +
	"+hdel +hexists +hget +hgetall +hincrby +hmget +hset " +
	"+zadd +zcard +zcount +zrange +zrangebyscore +zrank +zrem +zremrangebyrank +zremrangebyscore +zscore"

// The ACL docs/REDIS.md gives is enough: locks of every kind, waits woken
// by the release (no polling, no warning), listing and inspecting.
func TestMinimalACL(t *testing.T) {
	srv := testserver.StartRedis(t)
	aclUser(t, minimalACL, srv.Client(t))
	w := &warnings{}
	newClient := func() *dlock.Client {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "app", Password: "pw"})
		t.Cleanup(func() { _ = rdb.Close() })
		c := dlock.New(redislock.New(rdb), dlock.WithLogger(slog.New(w)))
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	a, b := newClient(), newClient()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for _, opts := range [][]dlock.Option{nil, {dlock.Fair()}, {dlock.Reentrant(), dlock.WithLockDelay(time.Second)}} {
		held, err := a.Mutex("acl/min", opts...).Lock(ctx)
		if err != nil {
			t.Fatalf("Lock: %v", err)
		}
		if err := held.Refresh(ctx); err != nil {
			t.Fatalf("Refresh: %v", err)
		}
		got := make(chan error, 1)
		// Left to polling or the holder's TTL, the waiter would wait an hour.
		slow := dlock.WithRetry(dlock.ExponentialBackoff(time.Hour, time.Hour))
		go func() {
			l, err := b.Mutex("acl/min", append(opts, slow)...).Lock(ctx)
			if err == nil {
				err = l.Unlock(ctx)
			}
			got <- err
		}()
		time.Sleep(200 * time.Millisecond)
		if err := held.Unlock(ctx); err != nil {
			t.Fatalf("Unlock: %v", err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Fatalf("waiter: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the waiter was not woken by the release")
		}
	}
	rw := a.RWMutex("acl/rw")
	r, err := rw.RLock(ctx)
	if err != nil {
		t.Fatalf("RLock: %v", err)
	}
	if _, err := a.Semaphore("acl/sem", 2).Acquire(ctx); err != nil {
		t.Fatalf("Semaphore.Acquire: %v", err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "app", Password: "pw"})
	defer rdb.Close()
	if infos, err := redislock.New(rdb).List(ctx, "acl/"); err != nil || len(infos) != 2 {
		t.Errorf("List = %v, %v; want the read lock and the semaphore", infos, err)
	}
	if err := r.Unlock(ctx); err != nil {
		t.Fatalf("RUnlock: %v", err)
	}
	if ws := w.matching(""); len(ws) > 0 {
		t.Errorf("warnings with the documented ACL: %q", ws)
	}
}
