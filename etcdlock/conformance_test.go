package etcdlock_test

import (
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/locktest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestConformance runs the locktest suite on one etcd member. The cases
// share the server, each in a namespace of its own (a fresh store); each
// Client gets an etcd client of its own, as separate processes would. A
// case that kills the store gets it restarted after it.
func TestConformance(t *testing.T) {
	srv := testserver.StartEtcd(t)
	runConformance(t, srv)
}

// TestConformanceCluster runs the suite on a 3-member cluster, each
// backend's client on every member.
func TestConformanceCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("the 3-member suite is long; the single member runs in -short")
	}
	srv := testserver.StartEtcdCluster(t, 3)
	runConformance(t, srv)
}

var cases atomic.Int64

func runConformance(t *testing.T, srv *testserver.Etcd) {
	admin := srv.Client(t)
	locktest.Run(t, func(t *testing.T) *locktest.Store {
		ns := "locktest" + strconv.FormatInt(cases.Add(1), 10) + "/"
		t.Cleanup(func() {
			// After a Kill: the next case needs the store back.
			srv.StartAll(t)
		})
		return &locktest.Store{
			NewBackend: func(t *testing.T) driver.Backend {
				return etcdlock.New(srv.Client(t), etcdlock.WithNamespace(ns))
			},
			Delete: func(t *testing.T, key string) {
				dir := ns + key + "\x00"
				resp, err := admin.Txn(t.Context()).Then(
					clientv3.OpDelete(dir+"e"),
					clientv3.OpDelete(dir+"s\x00", clientv3.WithPrefix()),
				).Commit()
				if err != nil {
					t.Fatalf("delete lock %q: %v", key, err)
				}
				n := resp.Responses[0].GetResponseDeleteRange().Deleted + resp.Responses[1].GetResponseDeleteRange().Deleted
				if n < 1 {
					t.Fatalf("delete lock %q: nothing to delete", key)
				}
			},
			Leftovers: func(t *testing.T, key string) []string {
				resp, err := admin.Get(t.Context(), ns+key+"\x00", clientv3.WithPrefix(), clientv3.WithKeysOnly())
				if err != nil {
					t.Fatalf("leftovers of %q: %v", key, err)
				}
				var left []string
				for _, kv := range resp.Kvs {
					// Kept on purpose, expiring by themselves: the records
					// of released (r) and withdrawn (x) tokens (3s).
					k := string(kv.Key)
					if !strings.HasPrefix(k, ns+key+"\x00r\x00") && !strings.HasPrefix(k, ns+key+"\x00x\x00") {
						left = append(left, strconv.Quote(k))
					}
				}
				return left
			},
			Kill: func(t *testing.T) { srv.KillAll(t) },
			// A grant's fence is a revision of the whole cluster.
			RevisionFences: true,
		}
	})
}
