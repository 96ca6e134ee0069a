package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memlock"
)

// acquireCounter is a store that counts the acquire requests it is sent,
// and changes nothing else.
type acquireCounter struct {
	*memlock.Backend
	n atomic.Int64
}

func (s *acquireCounter) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	s.n.Add(1)
	return s.Backend.Acquire(ctx, req)
}

// TestLockJoinsItsClientsWaitersWithoutARequest: a Lock on a name for
// which its Client has a request under way or waiters joins them without
// a request of its own, so that a crowd of them, come at once or one by
// one, costs the store one request at a time; Fair ones are granted in the
// order they came, TryLock still asks the store once, and a reentrant
// handle that holds the lock still enters it at once.
func TestLockJoinsItsClientsWaitersWithoutARequest(t *testing.T) {
	const crowd, waiters = 30, 40
	for _, fair := range []bool{false, true} {
		t.Run(fmt.Sprintf("fair=%v", fair), func(t *testing.T) {
			store := &acquireCounter{Backend: memlock.New()}
			holder, c := dlock.New(store.Backend), dlock.New(store)
			defer holder.Close()
			defer c.Close()
			ctx := ctxTimeout(t, time.Minute)
			var opts []dlock.Option
			if fair {
				opts = append(opts, dlock.Fair())
			}
			held, err := holder.Mutex("k").Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// A reentrant handle of c holds another name, which its
			// Client's waiters wait for too.
			re := c.Mutex("r", dlock.Reentrant())
			r1, err := re.Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			rWait := make(chan error, 1)
			go func() {
				l, err := c.Mutex("r").Lock(ctx)
				if err == nil {
					err = l.Unlock(ctx)
				}
				rWait <- err
			}()

			// A crowd of waiters comes at once; then more, one by one,
			// each once the one before it waits.
			var mu sync.Mutex
			var order []int
			var wg sync.WaitGroup
			lock := func(i int, start <-chan struct{}) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					l, err := c.Mutex("k", opts...).Lock(ctx)
					if err != nil {
						t.Errorf("waiter %d: %v", i, err)
						return
					}
					mu.Lock()
					order = append(order, i)
					mu.Unlock()
					if err := l.Unlock(ctx); err != nil {
						t.Errorf("waiter %d: unlock: %v", i, err)
					}
				}()
			}
			before := store.n.Load()
			start := make(chan struct{})
			for i := range crowd {
				lock(i, start)
			}
			close(start)
			for dlock.WaitersOn(c, "k") < crowd {
				time.Sleep(time.Millisecond)
			}
			for i := crowd; i < waiters; i++ {
				lock(i, start)
				for dlock.WaitersOn(c, "k") < i+1 {
					time.Sleep(time.Millisecond)
				}
			}
			if n := store.n.Load() - before; n >= waiters/2 {
				t.Errorf("%d Locks of one Client waiting for a held name sent %d requests; want a few (one at a time)", waiters, n)
			}

			before = store.n.Load()
			if _, err := c.Mutex("k", opts...).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
				t.Errorf("TryLock of a held name: %v, want not obtained", err)
			}
			if n := store.n.Load() - before; n != 1 {
				t.Errorf("TryLock beside waiters sent %d requests, want 1", n)
			}
			for dlock.WaitersOn(c, "r") < 1 {
				time.Sleep(time.Millisecond)
			}
			r2, err := re.Lock(ctxTimeout(t, time.Second))
			if err != nil {
				t.Fatalf("reentrant Lock of a held name its Client waits for: %v, want entered", err)
			}
			_ = r2.Unlock(ctx)
			_ = r1.Unlock(ctx)
			if err := <-rWait; err != nil {
				t.Error(err)
			}

			if err := held.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			if len(order) != waiters {
				t.Fatalf("%d of %d waiters granted", len(order), waiters)
			}
			if !fair {
				return
			}
			// The crowd came at once, in no order; the others in turn.
			for i, w := range order[crowd:] {
				if w != crowd+i {
					t.Fatalf("grants in the order %v, want the crowd's (0 to %d) first, then the others' in the order they came", order, crowd-1)
				}
			}
		})
	}
}
