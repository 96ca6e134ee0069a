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
