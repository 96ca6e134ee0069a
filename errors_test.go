package dlock_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/memlock"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/redlock"
	"github.com/dlock-go/dlock/sqllock"
)

// brokenStore is a backend whose store works until breakdown is called,
// and fails every request after it with an error that will not heal.
type brokenStore struct {
	name    string
	backend func(t *testing.T) (b driver.Backend, breakdown func())
}

// redisDenyAll makes every command but AUTH fail with NOPERM for the
// default user of rdb's server: a store that answers, and refuses.
func redisDenyAll(t *testing.T, rdb *redis.Client) {
	t.Helper()
	if err := rdb.Do(t.Context(), "ACL", "SETUSER", "default", "-@all", "+auth").Err(); err != nil {
		t.Fatal(err)
	}
}

var brokenStores = []brokenStore{
	{"memlock", func(*testing.T) (driver.Backend, func()) {
		b := memlock.New()
		return b, func() { b.SetUnavailable(errors.New("store down")) }
	}},
	{"redislock", func(t *testing.T) (driver.Backend, func()) {
		srv := testserver.StartRedis(t)
		rdb := srv.Client(t)
		return redislock.New(rdb), func() { redisDenyAll(t, srv.Client(t)) }
	}},
	{"redlock", func(t *testing.T) (driver.Backend, func()) {
		var nodes []redis.UniversalClient
		var srvs []*testserver.Redis
		for range 3 {
			srv := testserver.StartRedis(t)
			srvs = append(srvs, srv)
			nodes = append(nodes, srv.Client(t))
		}
		b, err := redlock.New(nodes)
		if err != nil {
			t.Fatal(err)
		}
		return b, func() {
			for _, srv := range srvs {
				redisDenyAll(t, srv.Client(t))
			}
		}
	}},
	{"sqllock", func(t *testing.T) (driver.Backend, func()) {
		db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "locks.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		b := sqllock.NewSQLite(db)
		return b, func() {
			if _, err := db.Exec("DROP TABLE dlock_locks"); err != nil {
				t.Fatal(err)
			}
		}
	}},
}

// TestStoreErrorsSayOperationAndNameOnce: an error of Lock, TryLock,
// Refresh or Unlock on a store that fails names the operation and the
// lock's name once, each layer's prefix at most once, and still matches
// what it wraps.
func TestStoreErrorsSayOperationAndNameOnce(t *testing.T) {
	t.Parallel()
	for _, s := range brokenStores {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			backend, breakdown := s.backend(t)
			c := dlock.New(backend)
			t.Cleanup(func() { c.Close() })
			ctx := t.Context()
			lease, err := c.Mutex("held-name", dlock.WithTTL(time.Minute)).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			breakdown()

			check := func(op, name string, err error) {
				t.Helper()
				if err == nil {
					t.Fatalf("%s on a broken store: no error", op)
				}
				msg := err.Error()
				t.Logf("%s: %s", op, msg)
				for _, once := range []string{op + " ", `"` + name + `"`, "dlock:", s.name + ":", "redislock:", "sqllock:"} {
					if n := len(regexp.MustCompile(`\b`+regexp.QuoteMeta(once)).FindAllString(msg, -1)); n > 1 {
						t.Errorf("%s: %q appears %d times in %q", op, once, n, msg)
					}
				}
				if !strings.HasPrefix(msg, "dlock: "+op+` "`+name+`": `) {
					t.Errorf("%s: %q does not begin with the operation and the name", op, msg)
				}
				if errors.Is(err, dlock.ErrNotObtained) || errors.Is(err, dlock.ErrInvalid) {
					t.Errorf("%s: %q matches a sentinel of another failure", op, msg)
				}
			}
			_, err = c.Mutex("other-name").TryLock(ctx)
			check("acquire", "other-name", err)
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err = c.Mutex("waited-name").Lock(wctx)
			cancel()
			check("acquire", "waited-name", err)
			check("refresh", "held-name", lease.Refresh(ctx))
			check("unlock", "held-name", lease.Unlock(ctx))
		})
	}
}

// TestWaitEndedByStoreErrorsSaysNameOnce: a Lock whose wait ends while the
// store fails in a way that may heal names the lock once, and says the
// store's error without the layers that name the lock again.
func TestWaitEndedByStoreErrorsSaysNameOnce(t *testing.T) {
	t.Parallel()
	store := memlock.New()
	c := dlock.New(store)
	t.Cleanup(func() { c.Close() })
	down := driver.Transient(errors.New("store down"))
	store.SetUnavailable(down)
	_, err := c.Mutex("waited-name", dlock.WithWait(300*time.Millisecond)).Lock(t.Context())
	if err == nil {
		t.Fatal("Lock on a store that is down: no error")
	}
	msg := err.Error()
	if n := strings.Count(msg, `"waited-name"`); n != 1 {
		t.Errorf("the name appears %d times in %q, want once", n, msg)
	}
	if !strings.Contains(msg, "the store failed at the last attempt: memory: store down") {
		t.Errorf("%q does not give the store's error", msg)
	}
	if !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, down) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("%q does not match ErrNotObtained, the store's error and the deadline", msg)
	}
}
