package chaos_test

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/locktest/chaos"
	"github.com/dlock-go/dlock/memlock"
)

// Run the stock decrement on your own store: replace memlock.New() by your
// backend (one per client, as separate processes would have), inject your
// faults while Run runs, then check the history.
func Example() {
	rec := chaos.NewRecorder()
	stock := chaos.NewResource(rec, true) // fenced: refuses stale fences
	stock.Init("sku-42", chaos.Value{Stock: 100})

	store := memlock.New()
	var workers []*chaos.Worker
	for i := range 3 {
		c := dlock.New(chaos.Observe(store, rec, fmt.Sprint("c", i)), dlock.WithTTL(2*time.Second))
		defer c.Close()
		workers = append(workers, &chaos.Worker{ID: i, Locks: c, Resource: stock, Sink: rec, Think: time.Millisecond})
	}
	chaos.Run(context.Background(), workers, []chaos.Target{{Name: "sku-42"}}, 150, 0)

	r := chaos.Check(rec.Events(), chaos.CheckOptions{})
	fmt.Println("violations:", r.Violations())
	fmt.Println("sold:", r.Names["sku-42"].Writes, "left:", r.Names["sku-42"].Final.Stock)
	// Output:
	// violations: 0
	// sold: 100 left: 0
}
