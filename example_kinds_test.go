package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

// A user may take part in at most three group buys at a time: a semaphore of
// three permits per user. Each permit is a lease of its own; a crashed
// process's permit comes back when its lease expires.
func ExampleClient_Semaphore() {
	ctx := context.Background()
	c := dlock.New(memlock.New()) // redislock.New(rdb) or sqllock.New(db, ...) in production
	defer c.Close()

	limit := c.Semaphore("group-buys:user:7", 3, dlock.WithTTL(30*time.Second))
	var joined []*dlock.Lease
	for range 3 {
		permit, err := limit.TryAcquire(ctx)
		if err != nil {
			fmt.Println(err)
			return
		}
		joined = append(joined, permit)
	}
	_, err := limit.TryAcquire(ctx)
	var busy *dlock.NotObtainedError
	if errors.As(err, &busy) {
		fmt.Printf("fourth group buy refused: %d of %d in use\n", busy.Shared, busy.Permits)
	}

	_ = joined[0].Unlock(ctx) // the user leaves one group buy
	permit, err := limit.TryAcquire(ctx)
	fmt.Println("joins another:", err == nil, "fence above the others:", permit.Fence() > joined[2].Fence())
	// Output:
	// fourth group buy refused: 3 of 3 in use
	// joins another: true fence above the others: true
}

// Many readers or one writer. A waiting writer keeps new readers out, so a
// stream of readers cannot starve it.
func ExampleClient_RWMutex() {
	ctx := context.Background()
	c := dlock.New(memlock.New())
	defer c.Close()

	prices := c.RWMutex("prices")
	r1, _ := prices.RLock(ctx)
	r2, _ := prices.RLock(ctx)
	fmt.Println("two readers at once:", r1.Err() == nil && r2.Err() == nil)

	written := make(chan *dlock.Lease)
	go func() {
		w, err := prices.Lock(ctx) // waits for both readers
		if err != nil {
			fmt.Println(err)
		}
		written <- w
	}()

	// Once the writer waits, a new reader is turned away.
	for {
		r, err := prices.TryRLock(ctx)
		if err == nil {
			_ = r.Unlock(ctx) // the writer has not asked yet
		}
		var busy *dlock.NotObtainedError
		if errors.As(err, &busy) && busy.WriterWaiting {
			fmt.Println("new reader refused: a writer is waiting")
			break
		}
		time.Sleep(time.Millisecond)
	}
	_ = r1.Unlock(ctx)
	_ = r2.Unlock(ctx)
	w := <-written
	fmt.Println("writer's fence above the readers':", w.Fence() > r2.Fence())
	_ = w.Unlock(ctx)
	// Output:
	// two readers at once: true
	// new reader refused: a writer is waiting
	// writer's fence above the readers': true
}

// Fair locks grant in arrival order and wake only the waiter at the head.
func ExampleFair() {
	ctx := context.Background()
	store := memlock.New()
	holder := dlock.New(store)
	defer holder.Close()
	first, _ := holder.Mutex("batch", dlock.Fair()).Lock(ctx)

	var (
		mu    sync.Mutex
		order []string
		wg    sync.WaitGroup
	)
	for _, who := range []string{"ann", "bob", "cid"} {
		c := dlock.New(store)
		defer c.Close()
		queued := make(chan struct{})
		var once sync.Once
		m := c.Mutex("batch", dlock.Fair(), dlock.WithOnBusy(func(*dlock.NotObtainedError) {
			once.Do(func() { close(queued) }) // refused once: now in the queue
		}))
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := m.Lock(ctx)
			if err != nil {
				fmt.Println(err)
				return
			}
			mu.Lock()
			order = append(order, who)
			mu.Unlock()
			_ = l.Unlock(ctx)
		}()
		<-queued // let each one arrive before the next
	}
	_ = first.Unlock(ctx)
	wg.Wait()
	fmt.Println(order)
	// Output:
	// [ann bob cid]
}

// stock is a resource that takes writes only with a fence at least as high
// as the last it accepted: the fenced write of the seeds' stock decrement,
// like UPDATE stock SET qty = ?, fence = ? WHERE item = ? AND fence <= ?.
type stock struct {
	mu    sync.Mutex
	qty   int
	fence uint64
}

func (s *stock) read() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.qty
}

// write stores qty if fence is not older than the last accepted one.
func (s *stock) write(qty int, fence uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fence < s.fence {
		return false
	}
	s.qty, s.fence = qty, fence
	return true
}

// Decrement stock under a lock, with a fenced write: a holder whose lease ran
// out while it was paused cannot overwrite the work of the next holder.
func Example_stockDecrement() {
	ctx := context.Background()
	clock := memlock.NewManualClock(time.Now())
	store := memlock.New(memlock.WithClock(clock))
	slow := dlock.New(store, dlock.WithAutoRenew(false))
	fast := dlock.New(store)
	defer slow.Close()
	defer fast.Close()
	item := &stock{qty: 10}

	// The first buyer locks, reads 10, then stalls past its TTL.
	a, _ := slow.Mutex("stock:sku-1", dlock.WithTTL(time.Second)).Lock(ctx)
	seen := item.read()
	clock.Advance(2 * time.Second)

	// The second buyer gets the lock and sells one: 9 left.
	b, _ := fast.Mutex("stock:sku-1").Lock(ctx)
	fmt.Println("second buyer writes:", item.write(item.read()-1, b.Fence()))
	_ = b.Unlock(ctx)

	// The first buyer wakes up and writes its stale 10-1: refused.
	fmt.Println("stale buyer writes:", item.write(seen-1, a.Fence()))
	fmt.Println("stock:", item.read())
	// Output:
	// second buyer writes: true
	// stale buyer writes: false
	// stock: 9
}
