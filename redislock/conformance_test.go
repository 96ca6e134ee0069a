package redislock_test

import (
	"strings"
	"testing"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/locktest"
	"github.com/dlock-go/dlock/redislock"
)

// TestConformance runs the locktest suite against a fresh redis-server per
// case; each Client gets a go-redis client of its own, as separate processes
// would.
func TestConformance(t *testing.T) {
	locktest.Run(t, func(t *testing.T) *locktest.Store {
		srv := testserver.StartRedis(t)
		admin := srv.Client(t)
		return &locktest.Store{
			NewBackend: func(t *testing.T) driver.Backend { return redislock.New(srv.Client(t)) },
			Delete: func(t *testing.T, key string) {
				if n, err := admin.Del(t.Context(), holdKeys(key)...).Result(); err != nil || n < 1 {
					t.Fatalf("DEL lock %q = %d, %v", key, n, err)
				}
			},
			Leftovers: func(t *testing.T, key string) []string {
				keys, err := admin.Keys(t.Context(), "dlock:{"+key+"}*").Result()
				if err != nil {
					t.Fatalf("KEYS: %v", err)
				}
				var left []string
				for _, k := range keys {
					if !strings.HasSuffix(k, ":fence") && !strings.HasSuffix(k, ":r") && !strings.HasSuffix(k, ":late") { // kept on purpose: the fence counter; recent releases (15s); the late-request record (5s)
						left = append(left, k)
					}
				}
				return left
			},
			Kill: func(t *testing.T) { srv.Kill(t) },
		}
	})
}

// holdKeys returns the keys that hold key's lock in the default namespace:
// the exclusive holder's hash and the shared holds' set and details.
func holdKeys(key string) []string {
	return []string{lockKey(key), lockKey(key) + ":s", lockKey(key) + ":si"}
}
