package redislock_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/redlock"
)

// A Redis that may evict keys can delete a held lock (a second holder gets
// in while the first lease reports nothing) or a fence counter (fences go
// back to 1): the Backend refuses to grant there unless told to accept it.
func TestEvictionPolicyRefused(t *testing.T) {
	srv := testserver.StartRedis(t)
	admin := srv.Client(t)
	for _, policy := range []string{"allkeys-lru", "volatile-ttl", "volatile-lru", "allkeys-random"} {
		if err := admin.ConfigSet(t.Context(), "maxmemory-policy", policy).Err(); err != nil {
			t.Fatal(err)
		}
		c := dlock.New(redislock.New(srv.Client(t)))
		_, err := c.Mutex("evict/" + policy).TryLock(t.Context())
		var ee *redislock.EvictionError
		if !errors.Is(err, redislock.ErrEviction) || !errors.As(err, &ee) || ee.Policy != policy {
			t.Errorf("%s: TryLock = %v, want an EvictionError naming the policy", policy, err)
		}
		_ = c.Close()

		allowed := dlock.New(redislock.New(srv.Client(t), redislock.WithEvictionAllowed()))
		l, err := allowed.Mutex("evict/" + policy).TryLock(t.Context())
		if err != nil {
			t.Errorf("%s with WithEvictionAllowed: TryLock = %v", policy, err)
		} else if err := l.Unlock(t.Context()); err != nil {
			t.Error(err)
		}
		_ = allowed.Close()
	}

	// Fixed by the operator: the next check (after a refusal, 10s later) or a
	// new Backend finds noeviction and grants.
	if err := admin.ConfigSet(t.Context(), "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	c := dlock.New(redislock.New(srv.Client(t)))
	defer c.Close()
	l, err := c.Mutex("evict/fixed").TryLock(t.Context())
	if err != nil {
		t.Fatalf("noeviction: TryLock = %v", err)
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// A Redis user that may not run CONFIG GET (managed Redis, or an ACL
// without it) gets one warning, and its locks work.
func TestEvictionPolicyUnreadable(t *testing.T) {
	srv := testserver.StartRedis(t)
	aclUser(t, "~* &* +@all -config", srv.Client(t))
	w := &warnings{}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "app", Password: "pw"})
	defer rdb.Close()
	c := dlock.New(redislock.New(rdb, redislock.WithLogger(slog.New(w))))
	defer c.Close()
	for i := range 3 {
		l, err := c.Mutex("evict/unreadable/" + strconv.Itoa(i)).TryLock(t.Context())
		if err != nil {
			t.Fatalf("TryLock without CONFIG rights: %v", err)
		}
		if err := l.Unlock(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if ws := w.matching("maxmemory-policy"); len(ws) != 1 {
		t.Errorf("warnings about the unreadable policy: %q, want one", ws)
	}
}

// Each node of a Cluster and of Redlock is checked.
func TestEvictionPolicyClusterAndRedlock(t *testing.T) {
	cl := testserver.StartCluster(t, 3)
	last := cl.Node(cl.Len() - 1).Client(t)
	if err := last.ConfigSet(t.Context(), "maxmemory-policy", "volatile-lru").Err(); err != nil {
		t.Fatal(err)
	}
	c := dlock.New(redislock.New(cl.Client(t)))
	defer c.Close()
	if _, err := c.Mutex("evict/cluster").TryLock(t.Context()); !errors.Is(err, redislock.ErrEviction) {
		t.Errorf("Cluster with one volatile-lru master: TryLock = %v, want ErrEviction", err)
	}

	var nodes []redis.UniversalClient
	for range 3 {
		nodes = append(nodes, testserver.StartRedis(t).Client(t))
	}
	for _, n := range nodes[:2] {
		if err := n.ConfigSet(t.Context(), "maxmemory-policy", "allkeys-lru").Err(); err != nil {
			t.Fatal(err)
		}
	}
	rl, err := redlock.New(nodes)
	if err != nil {
		t.Fatal(err)
	}
	rc := dlock.New(rl)
	defer rc.Close()
	// Redlock reads each node's policy beside its first acquires, so as
	// not to cost the node its answer: the refusal comes within a moment.
	var err2 error
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		var l *dlock.Lease
		if l, err2 = rc.Mutex("evict/redlock").TryLock(t.Context()); err2 == nil {
			if err := l.Unlock(t.Context()); err != nil {
				t.Fatal(err)
			}
			continue
		}
		break
	}
	if !errors.Is(err2, redislock.ErrEviction) {
		t.Errorf("Redlock with two allkeys-lru nodes of three: TryLock = %v, want ErrEviction", err2)
	}
	rl2, err := redlock.New(nodes, redlock.WithEvictionAllowed())
	if err != nil {
		t.Fatal(err)
	}
	rc2 := dlock.New(rl2)
	defer rc2.Close()
	l, err := rc2.Mutex("evict/redlock").TryLock(t.Context())
	if err != nil {
		t.Fatalf("Redlock with WithEvictionAllowed: %v", err)
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// At maxmemory with noeviction, Redis refuses writes that need memory. A
// renewal must not need one: plain leases and lock-delay leases renew alike
// (a lock-delay renewal used to HSET the lease's expiry, and was lost as
// "unreachable").
func TestRenewAtMaxmemory(t *testing.T) {
	srv := testserver.StartRedis(t)
	admin := srv.Client(t)
	c := dlock.New(redislock.New(srv.Client(t)), dlock.WithAutoRenew(false), dlock.WithTTL(2*time.Second))
	defer c.Close()
	plain, err := c.Mutex("oom/plain").Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	delayed, err := c.Mutex("oom/delay", dlock.WithLockDelay(time.Second)).Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// maxmemory 1 byte: everything that needs memory is refused (OOM).
	if err := admin.ConfigSet(t.Context(), "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = admin.ConfigSet(context.Background(), "maxmemory", "0").Err() }()
	if err := admin.Set(t.Context(), "oom/probe", "x", 0).Err(); err == nil {
		t.Fatal("Redis accepted a write at maxmemory 1: the test cannot show OOM")
	}
	for _, l := range []*dlock.Lease{plain, delayed} {
		if err := l.Refresh(t.Context()); err != nil {
			t.Errorf("Refresh of %q at maxmemory: %v", l.Name(), err)
		}
		if err := l.Err(); err != nil {
			t.Errorf("%q lost at maxmemory: %v", l.Name(), err)
		}
	}
	if err := admin.ConfigSet(t.Context(), "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	for _, l := range []*dlock.Lease{plain, delayed} {
		if err := l.Unlock(t.Context()); err != nil {
			t.Errorf("Unlock of %q: %v", l.Name(), err)
		}
	}
}
