package dlock_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

// Moving stock between two warehouses locks both, all or nothing, in an
// order every caller shares, and fences each write with its own name's
// fence.
func ExampleMulti() {
	ctx := context.Background()
	c := dlock.New(memlock.New())
	defer c.Close()

	both, err := c.Multi([]string{"stock:berlin", "stock:amsterdam"}).Lock(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("holding", both.Names())
	for _, name := range []string{"stock:amsterdam", "stock:berlin"} {
		fence, ok := both.Fence(name) // ok is false for a name not held
		fmt.Println("write", name, "with fence", fence, ok)
	}
	if _, ok := both.Fence("stock:berln"); !ok {
		fmt.Println("stock:berln is not held")
	}

	// Someone else asking for an overlapping set waits, or with TryLock is
	// refused: it took athens, found berlin held, and gave athens back.
	_, err = c.Multi([]string{"stock:berlin", "stock:athens"}).TryLock(ctx)
	var no *dlock.NotObtainedError
	if errors.As(err, &no) {
		fmt.Println("not obtained:", no.Name)
	}
	athens, err := c.Mutex("stock:athens").TryLock(ctx)
	fmt.Println("athens free:", err == nil)
	_ = athens.Unlock(ctx)

	if err := both.Unlock(ctx); err != nil {
		fmt.Println(err)
	}
	fmt.Println(both.Err())
	// Output:
	// holding [stock:amsterdam stock:berlin]
	// write stock:amsterdam with fence 1 true
	// write stock:berlin with fence 1 true
	// stock:berln is not held
	// not obtained: stock:berlin
	// athens free: true
	// dlock: lease released
}

// An all-at-once multi-lock holds every name or none at every instant:
// while it waits for berlin, amsterdam stays free for others, and once
// berlin is released it takes both in one atomic step.
func ExampleClient_MultiAtOnce() {
	ctx := context.Background()
	c := dlock.New(memlock.New())
	defer c.Close()

	berlin, err := c.Mutex("stock:berlin").Lock(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}

	refused := make(chan string, 1)
	got := make(chan *dlock.MultiLease, 1)
	go func() {
		both, err := c.MultiAtOnce([]string{"stock:amsterdam", "stock:berlin"},
			dlock.WithOnBusy(func(e *dlock.NotObtainedError) {
				select {
				case refused <- e.Name:
				default:
				}
			})).Lock(ctx)
		if err != nil {
			fmt.Println(err)
		}
		got <- both
	}()
	fmt.Println("waiting for", <-refused)

	// The waiter holds nothing: amsterdam is free meanwhile.
	amsterdam, err := c.Mutex("stock:amsterdam").TryLock(ctx)
	fmt.Println("amsterdam free while it waits:", err == nil)
	_ = amsterdam.Unlock(ctx)

	_ = berlin.Unlock(ctx)
	both := <-got
	fmt.Println("holding", both.Names())
	f, ok := both.Fence("stock:berlin")
	fmt.Println("berlin's fence:", f, ok)
	_ = both.Unlock(ctx)
	// Output:
	// waiting for stock:berlin
	// amsterdam free while it waits: true
	// holding [stock:amsterdam stock:berlin]
	// berlin's fence: 2 true
}
