package peers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/bench/peers"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/bench"
	"github.com/dlock-go/dlock/internal/test/testserver"
)

// TestCompareEtcd runs dlock over etcdlock (plain and fair), the raw
// transaction loop and etcd's own concurrency.Mutex over the same workloads
// on one 3-member etcd cluster, and prints the table. It asserts only that
// every subject completed grants without errors.
func TestCompareEtcd(t *testing.T) {
	ws := workloads(t)
	srv := testserver.StartEtcdCluster(t, 3)
	newClient := func() (*clientv3.Client, error) {
		return clientv3.New(clientv3.Config{Endpoints: srv.Endpoints(), DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	}
	dlockOn := func(name string, opts ...dlock.Option) bench.Subject {
		return bench.Dlock(name, func(ctx context.Context, id int) (driver.Backend, func() error, error) {
			c, err := newClient()
			if err != nil {
				return nil, nil, err
			}
			return etcdlock.New(c), c.Close, nil
		}, opts...)
	}
	subjects := []bench.Subject{
		bench.RawEtcd(peers.SubjectEtcdRaw, newClient, dlock.DefaultTTL),
		dlockOn(peers.SubjectEtcdDlock),
		dlockOn(peers.SubjectEtcdDlockFair, dlock.Fair()),
		peers.EtcdMutex(peers.SubjectEtcdMutex, newClient),
	}
	rep := &bench.Report{Machine: bench.ThisMachine(), Started: time.Now(), Baselines: map[string]bench.Percentiles{},
		Store: "etcd 3.4 on loopback: 3 members"}
	var notRun notRunList
	for _, w := range ws {
		for _, s := range subjects {
			r, ok := runKind(t, s, w, &notRun)
			if !ok {
				continue
			}
			if r.Grants == 0 {
				t.Errorf("%s %s: no grant", s.Name, w.Label())
			}
			rep.Results = append(rep.Results, r)
		}
	}
	var out strings.Builder
	if err := rep.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	notRun.write(&out)
	fmt.Fprintf(&out, "\netcd-concurrency = concurrency.NewMutex on a Session of TTL %ds per worker\n", peers.EtcdSessionTTL)
	fmt.Print(out.String())
}
