package memlock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

func ExampleNew() {
	ctx := context.Background()
	c := dlock.New(memlock.New())
	defer c.Close()

	lease, err := c.Mutex("job").TryLock(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("fence", lease.Fence())
	_ = lease.Unlock(ctx)

	lease, _ = c.Mutex("job").TryLock(ctx)
	fmt.Println("fence", lease.Fence())
	_ = lease.Unlock(ctx)
	// Output:
	// fence 1
	// fence 2
}

// A ManualClock tests expiry without sleeping: the store's clock moves, the
// lease runs out on the store, and the next owner gets a higher fence.
func ExampleManualClock() {
	ctx := context.Background()
	clock := memlock.NewManualClock(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
	c := dlock.New(memlock.New(memlock.WithClock(clock)))
	defer c.Close()

	first, _ := c.Mutex("batch", dlock.WithTTL(time.Minute), dlock.WithAutoRenew(false)).TryLock(ctx)
	clock.Advance(2 * time.Minute)

	second, err := c.Mutex("batch").TryLock(ctx)
	fmt.Println("second owner:", err == nil, "fence", second.Fence())
	fmt.Println("first can renew:", first.Refresh(ctx) == nil)
	fmt.Println(errors.Is(first.Err(), dlock.ErrLost))
	// Output:
	// second owner: true fence 2
	// first can renew: false
	// true
}

// Semaphore permits expire by the store's clock too: the permit of a holder
// that stopped renewing comes back once a ManualClock passes its TTL.
func ExampleManualClock_semaphore() {
	ctx := context.Background()
	clock := memlock.NewManualClock(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
	c := dlock.New(memlock.New(memlock.WithClock(clock)))
	defer c.Close()

	pool := c.Semaphore("gpu", 1, dlock.WithTTL(time.Minute), dlock.WithAutoRenew(false))
	first, _ := pool.TryAcquire(ctx)
	_, err := pool.TryAcquire(ctx)
	var busy *dlock.NotObtainedError
	if errors.As(err, &busy) {
		fmt.Printf("%d of %d permits in use; one comes back in %v\n", busy.Shared, busy.Permits, busy.HolderTTL)
	}

	clock.Advance(2 * time.Minute)
	second, err := pool.TryAcquire(ctx)
	fmt.Println("second permit:", err == nil, "fence", second.Fence(), "after", first.Fence())
	// Output:
	// 1 of 1 permits in use; one comes back in 1m0s
	// second permit: true fence 2 after 1
}

// SetUnavailable simulates a store outage, to test how code reacts to a lease
// that can no longer be renewed.
func ExampleBackend_SetUnavailable() {
	ctx := context.Background()
	store := memlock.New()
	c := dlock.New(store)
	defer c.Close()

	lease, _ := c.Mutex("sync", dlock.WithTTL(200*time.Millisecond)).Lock(ctx)
	store.SetUnavailable(errors.New("connection refused"))

	<-lease.Done() // before Deadline, while the store might still hold it
	var lost *dlock.LostError
	errors.As(lease.Err(), &lost)
	fmt.Println(lost.Reason, "-", time.Now().Before(lease.Deadline()))
	// Output:
	// store unreachable until the lease ran out - true
}
