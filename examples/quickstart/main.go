// Command quickstart shows dlock's behaviour in one process on the in-memory
// store: two workers take turns on one lock, each grant with a higher fence,
// and a lease that is broken behind its holder's back is reported to it.
//
//	go run ./examples/quickstart
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

func main() {
	ctx := context.Background()
	store := memlock.New()
	c := dlock.New(store, dlock.WithTTL(300*time.Millisecond))
	defer c.Close()

	// Two workers take turns; the second waits and is woken by the release.
	var wg sync.WaitGroup
	for _, worker := range []string{"worker-a", "worker-b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := c.Do(ctx, "orders:42", func(ctx context.Context) error {
				fmt.Printf("%s holds orders:42\n", worker)
				time.Sleep(100 * time.Millisecond)
				return nil
			}, dlock.WithMetadata(worker))
			if err != nil {
				log.Fatal(err)
			}
		}()
	}
	wg.Wait()

	// Every grant carries a larger fence than the one before.
	lease, err := c.Mutex("orders:42").Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("third grant: fence %d, owner %s\n", lease.Fence(), lease.Owner())

	// An operator breaks the lock. The next renewal (every TTL/3) notices and
	// the holder is told through Done, Err and Context.
	if _, _, err := store.ForceRelease(ctx, "orders:42"); err != nil {
		log.Fatal(err)
	}
	<-lease.Done()
	var lost *dlock.LostError
	if errors.As(lease.Err(), &lost) {
		fmt.Printf("holder told: lease lost, %s\n", lost.Reason)
	}
	fmt.Println("unlock after the loss:", lease.Unlock(ctx))
}
