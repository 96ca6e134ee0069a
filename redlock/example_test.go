package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/redlock"
)

// Example locks a name on three independent Redis nodes and writes a result
// guarded by the lease's fence. It needs the three servers, so it is
// compiled but not run by go test.
func Example() {
	ctx := context.Background()
	var nodes []redis.UniversalClient
	for _, addr := range []string{"redis-a:6379", "redis-b:6379", "redis-c:6379"} {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		defer rdb.Close()
		nodes = append(nodes, rdb)
	}
	backend, err := redlock.New(nodes, redlock.WithNodeTimeout(20*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	// Connect to the nodes now, so that the first lock does not pay for it.
	if err := backend.Ping(ctx); err != nil {
		log.Fatal(err)
	}
	client := dlock.New(backend)
	defer client.Close()

	lease, err := client.Mutex("report:today", dlock.WithTTL(30*time.Second)).Lock(ctx)
	var quorum *redlock.QuorumError
	switch {
	case errors.As(err, &quorum):
		log.Fatalf("only %d of %d nodes answered: %v", quorum.OK, quorum.Nodes, err)
	case err != nil:
		log.Fatal(err)
	}
	defer lease.Unlock(ctx)

	// The resource checks the fence, so a holder that was paused past its
	// lease cannot overwrite the work of the next one.
	store := redis.NewClient(&redis.Options{Addr: "resource:6379"})
	defer store.Close()
	err = redislock.FencedSet(lease.Context(), store, "report:today:data", lease.Fence(), "…")
	if errors.Is(err, redislock.ErrStaleFence) {
		fmt.Println("a newer holder has written; dropping this result")
	}
}
