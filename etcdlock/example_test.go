package etcdlock_test

import (
	"context"
	"fmt"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
)

// A lock on a 3-member etcd cluster. The example is compiled, not run: it
// needs the cluster.
func ExampleNew() {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{"etcd1:2379", "etcd2:2379", "etcd3:2379"},
		DialTimeout: 5 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close() // after the dlock Client: deferred first, runs last

	c := dlock.New(etcdlock.New(cli, etcdlock.WithNamespace("billing/")))
	defer c.Close()

	ctx := context.Background()
	lease, err := c.Mutex("nightly-report", dlock.WithWait(time.Minute)).Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Unlock(ctx)
	// The fence is the holder key's create revision: pass it to the
	// resource, which refuses writes with a smaller one.
	fmt.Println("holding with fence", lease.Fence())
}
