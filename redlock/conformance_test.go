package redlock_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/locktest"
	"github.com/dlock-go/dlock/redlock"
)

// TestConformance runs the locktest suite against three fresh redis-servers
// per case. Each Client gets go-redis clients of its own, one per node, as
// separate processes would.
func TestConformance(t *testing.T) {
	locktest.Run(t, func(t *testing.T) *locktest.Store {
		servers := startNodes(t, 3)
		admins := make([]*redis.Client, len(servers))
		for i, srv := range servers {
			admins[i] = srv.Client(t)
		}
		var mu sync.Mutex
		var backends []*redlock.Backend
		return &locktest.Store{
			// NewBackend connects to every node before it returns (see
			// newBackend), as a process would at startup: a first call that
			// must also dial and handshake can take longer than the 50ms
			// node timeout on a loaded machine.
			NewBackend: func(t *testing.T) driver.Backend {
				b := newBackend(t, servers)
				mu.Lock()
				backends = append(backends, b)
				mu.Unlock()
				return b
			},
			// Delete removes the lock from every node, as an operator
			// would. It first lets acquires that returned once a quorum
			// had granted finish on the other nodes, so that a late grant
			// cannot land after the delete; a grant is on at least a
			// quorum of nodes.
			Delete: func(t *testing.T, key string) {
				mu.Lock()
				for _, b := range backends {
					redlock.WaitIdle(b)
				}
				mu.Unlock()
				deleted := 0
				for i, admin := range admins {
					n, err := admin.Del(t.Context(), "dlock:{"+key+"}").Result()
					if err != nil {
						t.Fatalf("node %d: DEL lock %q: %v", i, key, err)
					}
					deleted += int(n)
				}
				if deleted < 2 {
					t.Fatalf("lock %q deleted on %d nodes, want at least a quorum (2)", key, deleted)
				}
			},
			// Leftovers first lets releases that returned once a quorum had
			// answered finish on the other nodes.
			Leftovers: func(t *testing.T, key string) []string {
				mu.Lock()
				for _, b := range backends {
					redlock.WaitIdle(b)
				}
				mu.Unlock()
				var left []string
				for i, admin := range admins {
					keys, err := admin.Keys(t.Context(), "dlock:{"+key+"}*").Result()
					if err != nil {
						t.Fatalf("node %d: KEYS: %v", i, err)
					}
					for _, k := range keys {
						if !strings.HasSuffix(k, ":fence") && !strings.HasSuffix(k, ":r") && !strings.HasSuffix(k, ":late") { // kept on purpose: the fence counter; recent releases (15s); late-request records (5s)
							left = append(left, servers[i].Addr()+" "+k)
						}
					}
				}
				return left
			},
			Kill: func(t *testing.T) {
				for _, srv := range servers {
					srv.Kill(t)
				}
			},
		}
	})
}
