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
	fmt.Println("write amsterdam with fence", both.Fence("stock:amsterdam"))
	fmt.Println("write berlin with fence", both.Fence("stock:berlin"))

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
	// write amsterdam with fence 1
	// write berlin with fence 1
	// not obtained: stock:berlin
	// athens free: true
	// dlock: lease released
}
