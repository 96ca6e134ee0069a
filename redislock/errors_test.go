package redislock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// acquireErr runs one Acquire of key on a Backend over rdb with ctx and
// returns its error, which must not be nil.
func acquireErr(t *testing.T, ctx context.Context, rdb redis.UniversalClient, key string) error {
	t.Helper()
	b := redislock.New(rdb, redislock.WithEvictionAllowed())
	_, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Token: newToken(t), Owner: "me", TTL: 10 * time.Second})
	if err == nil {
		t.Fatalf("Acquire(%q) succeeded, want an error", key)
	}
	return err
}

// checkTransient fails the test unless driver.IsTransient(err) is want.
func checkTransient(t *testing.T, what string, err error, want bool) {
	t.Helper()
	if got := driver.IsTransient(err); got != want {
		t.Errorf("%s: IsTransient(%v) = %v, want %v", what, err, got, want)
	}
}

// TestStoreErrorsThatMayHealAreTransient checks the classification of
// errors that real redis-servers give: a server that is down, a call that
// times out inside a live context, a running script (BUSY), a replica
// without its master (MASTERDOWN), a replica written to (READONLY) and a
// cluster node that serves no slot (CLUSTERDOWN) are transient.
func TestStoreErrorsThatMayHealAreTransient(t *testing.T) {
	t.Run("server killed", func(t *testing.T) {
		srv := testserver.StartRedis(t)
		rdb := srv.Client(t)
		srv.Kill(t)
		checkTransient(t, "connection refused", acquireErr(t, t.Context(), rdb, "down"), true)
	})
	t.Run("read timeout inside a live context", func(t *testing.T) {
		srv := testserver.StartRedis(t)
		admin := srv.Client(t)
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: 200 * time.Millisecond, MaxRetries: -1})
		defer rdb.Close()
		if err := rdb.Ping(t.Context()).Err(); err != nil { // dial before the pause
			t.Fatal(err)
		}
		if err := admin.Do(t.Context(), "CLIENT", "PAUSE", 3000, "ALL").Err(); err != nil {
			t.Fatal(err)
		}
		defer admin.Do(context.Background(), "CLIENT", "UNPAUSE")
		checkTransient(t, "read timeout", acquireErr(t, t.Context(), rdb, "paused"), true)
	})
	t.Run("BUSY", func(t *testing.T) {
		srv := testserver.StartRedis(t, "--busy-reply-threshold", "50")
		admin, looper := srv.Client(t), srv.Client(t)
		ran := make(chan error, 1)
		go func() { ran <- looper.Eval(context.Background(), "while true do end", nil).Err() }()
		defer func() {
			deadline := time.Now().Add(10 * time.Second)
			for admin.Do(context.Background(), "SCRIPT", "KILL").Err() != nil && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			<-ran
		}()
		b := redislock.New(srv.Client(t), redislock.WithEvictionAllowed())
		var err error
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			_, err = b.Acquire(t.Context(), driver.AcquireRequest{Key: "busy", Token: newToken(t), Owner: "me", TTL: 10 * time.Second})
			if err != nil && strings.Contains(err.Error(), "BUSY") {
				break
			}
		}
		checkTransient(t, "BUSY", err, true)
	})
	t.Run("MASTERDOWN", func(t *testing.T) {
		dead := testserver.StartRedis(t)
		port := dead.Addr()[len("127.0.0.1:"):]
		dead.Kill(t)
		srv := testserver.StartRedis(t)
		admin := srv.Client(t)
		if err := admin.ConfigSet(t.Context(), "replica-serve-stale-data", "no").Err(); err != nil {
			t.Fatal(err)
		}
		if err := admin.Do(t.Context(), "REPLICAOF", "127.0.0.1", port).Err(); err != nil {
			t.Fatal(err)
		}
		checkTransient(t, "replica without its master", acquireErr(t, t.Context(), srv.Client(t), "stale"), true)
	})
	t.Run("READONLY", func(t *testing.T) {
		master := testserver.StartRedis(t)
		port, _ := strconv.Atoi(master.Addr()[len("127.0.0.1:"):])
		srv := testserver.StartRedis(t, "--replicaof", "127.0.0.1", strconv.Itoa(port))
		checkTransient(t, "write on a replica", acquireErr(t, t.Context(), srv.Client(t), "ro"), true)
	})
	t.Run("CLUSTERDOWN", func(t *testing.T) {
		srv := testserver.StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
		checkTransient(t, "a cluster node without slots", acquireErr(t, t.Context(), srv.Client(t), "noslot"), true)
	})
}

// TestStoreErrorsThatWillNotHealAreNotTransient checks that credentials
// and rights refused, OOM, a foreign value and a call whose caller's
// context ended are not transient, on a real redis-server.
func TestStoreErrorsThatWillNotHealAreNotTransient(t *testing.T) {
	srv := testserver.StartRedis(t)
	admin := srv.Client(t)
	aclUser(t, "~* &* +@all -evalsha -eval", admin)

	wrongpass := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "app", Password: "nope", MaxRetries: -1})
	defer wrongpass.Close()
	checkTransient(t, "WRONGPASS", acquireErr(t, t.Context(), wrongpass, "auth"), false)

	noperm := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "app", Password: "pw", MaxRetries: -1})
	defer noperm.Close()
	checkTransient(t, "NOPERM", acquireErr(t, t.Context(), noperm, "perm"), false)

	if err := admin.Set(t.Context(), "dlock:{foreign}", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	ferr := acquireErr(t, t.Context(), admin, "foreign")
	if !errors.Is(ferr, redislock.ErrForeignValue) {
		t.Fatalf("Acquire over a foreign value = %v, want ErrForeignValue", ferr)
	}
	checkTransient(t, "WRONGTYPE", ferr, false)

	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	checkTransient(t, "cancelled by the caller", acquireErr(t, cancelled, admin, "cancelled"), false)

	// A caller whose deadline passes while the server is paused: its wait
	// is over, whatever the store does.
	bounded := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer bounded.Close()
	if err := bounded.Ping(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(t.Context(), "CLIENT", "PAUSE", 2000, "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	checkTransient(t, "the caller's deadline", acquireErr(t, ctx, bounded, "deadline"), false)
	if err := admin.Do(t.Context(), "CLIENT", "UNPAUSE").Err(); err != nil {
		t.Fatal(err)
	}

	if err := admin.ConfigSet(t.Context(), "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	defer admin.ConfigSet(context.Background(), "maxmemory", "0")
	checkTransient(t, "OOM", acquireErr(t, t.Context(), admin, "oom"), false)
}

// A host name that does not exist (the resolver's "no such host") will not
// heal while a wait lasts: a misspelled address is reported at once, not
// retried until the wait ends.
func TestUnknownHostIsNotTransient(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "no-such-host.invalid:6379", MaxRetries: -1})
	defer rdb.Close()
	checkTransient(t, "unknown host", acquireErr(t, t.Context(), rdb, "unknown-host"), false)
}
