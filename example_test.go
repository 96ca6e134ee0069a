package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

func Example() {
	ctx := context.Background()
	c := dlock.New(memlock.New()) // redislock.New(rdb) in production
	defer c.Close()

	lease, err := c.Mutex("orders:42", dlock.WithTTL(10*time.Second)).Lock(ctx)
	if err != nil {
		fmt.Println("not obtained:", err)
		return
	}
	fmt.Println("holding", lease.Name(), "with fence", lease.Fence())

	// Another owner is turned away and told who holds the lock.
	_, err = c.Mutex("orders:42").TryLock(ctx)
	fmt.Println(errors.Is(err, dlock.ErrNotObtained))

	if err := lease.Unlock(ctx); err != nil {
		fmt.Println(err)
	}
	fmt.Println(lease.Err())
	// Output:
	// holding orders:42 with fence 1
	// true
	// dlock: lease released
}

func ExampleClient_Do() {
	c := dlock.New(memlock.New())
	defer c.Close()

	err := c.Do(context.Background(), "nightly-report", func(ctx context.Context) error {
		// ctx is cancelled if the lease is lost: stop writing then.
		fmt.Println("running the report")
		return nil
	}, dlock.WithTTL(30*time.Second))
	fmt.Println("err:", err)
	// Output:
	// running the report
	// err: <nil>
}

// The fenced write inside Do: fn's context carries the lease, and its fence
// goes with every write, so that the resource can refuse a holder whose
// lease ran out.
func ExampleLeaseFromContextByName() {
	c := dlock.New(memlock.New())
	defer c.Close()

	for range 2 {
		err := c.Do(context.Background(), "stock:42", func(ctx context.Context) error {
			lease, _ := dlock.LeaseFromContextByName(ctx, "stock:42")
			fmt.Println("write stock with fence", lease.Fence())
			return nil
		})
		if err != nil {
			fmt.Println(err)
		}
	}
	// Output:
	// write stock with fence 1
	// write stock with fence 2
}

func ExampleReentrant() {
	ctx := context.Background()
	c := dlock.New(memlock.New())
	defer c.Close()

	m := c.Mutex("account:7", dlock.Reentrant())
	outer, _ := m.Lock(ctx)
	inner, _ := m.Lock(ctx) // the same handle holds it: one more hold
	fmt.Println(outer.Fence() == inner.Fence())

	_ = inner.Unlock(ctx)
	_, err := c.Mutex("account:7").TryLock(ctx)
	fmt.Println("free after the inner Unlock:", err == nil)
	_ = outer.Unlock(ctx)
	_, err = c.Mutex("account:7").TryLock(ctx)
	fmt.Println("free after the outer Unlock:", err == nil)
	// Output:
	// true
	// free after the inner Unlock: false
	// free after the outer Unlock: true
}

func ExampleLease_Context() {
	ctx := context.Background()
	store := memlock.New()
	c := dlock.New(store)
	defer c.Close()

	lease, _ := c.Mutex("ledger", dlock.WithTTL(300*time.Millisecond)).Lock(ctx)
	work := lease.Context()

	// An operator breaks the lock; the next renewal notices.
	_, _, _ = store.ForceRelease(ctx, "ledger")

	<-work.Done()
	var lost *dlock.LostError
	if errors.As(context.Cause(work), &lost) {
		fmt.Println("stop writing:", lost.Reason)
	}
	// Output:
	// stop writing: no longer held on the store
}

// A lease that expires without a release keeps the lock out of reach for the
// lock-delay, so that a holder that was paused past its TTL has time to
// notice before someone else starts. A released lock is free at once.
func ExampleWithLockDelay() {
	ctx := context.Background()
	clock := memlock.NewManualClock(time.Now())
	store := memlock.New(memlock.WithClock(clock))
	paused := dlock.New(store, dlock.WithAutoRenew(false))
	other := dlock.New(store)
	defer paused.Close()
	defer other.Close()

	_, err := paused.Mutex("report", dlock.WithTTL(time.Second), dlock.WithLockDelay(5*time.Second)).Lock(ctx)
	fmt.Println("first holder:", err)

	clock.Advance(2 * time.Second) // the holder stalls past its TTL
	_, err = other.Mutex("report").TryLock(ctx)
	fmt.Println("expired, in the delay:", errors.Is(err, dlock.ErrNotObtained))

	clock.Advance(5 * time.Second) // the delay is over
	lease, err := other.Mutex("report").TryLock(ctx)
	fmt.Println("after the delay:", err)
	_ = lease.Unlock(ctx)
	// Output:
	// first holder: <nil>
	// expired, in the delay: true
	// after the delay: <nil>
}
