package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memlock"
)

// wrappedStore is a memlock store whose notification streams wrap
// changes, to inject a fault.
type wrappedStore struct {
	*memlock.Backend
	wrap func(driver.Listener) driver.Listener
}

func (s wrappedStore) Listen(ctx context.Context, fn func(key, next string)) (driver.Listener, error) {
	l, err := s.Backend.Listen(ctx, fn)
	if err != nil {
		return nil, err
	}
	return s.wrap(l), nil
}

// stuckStore is a memlock store whose Subscribe calls never get their
// confirmation, as when the connection they were written on failed and the
// subscription waits to be made again on a master that is down.
func stuckStore(store *memlock.Backend) wrappedStore {
	return wrappedStore{store, func(l driver.Listener) driver.Listener { return stuckListener{l} }}
}

type stuckListener struct{ driver.Listener }

func (stuckListener) Subscribe(ctx context.Context, key string) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestWaitPollsWhenSubscribeHangs checks that a waiter whose subscription
// is never confirmed gives up on it after subscribeWait and polls: it gets
// the lock soon after the holder releases it, not when its own context
// ends.
func TestWaitPollsWhenSubscribeHangs(t *testing.T) {
	const wait = 3 * time.Second
	defer dlock.SetSubscribeWait(wait)()
	for _, fair := range []bool{false, true} {
		store := memlock.New()
		holder, waiter := dlock.New(store), dlock.New(stuckStore(store))
		ctx := context.Background()
		h, err := holder.Mutex("k").Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var opts []dlock.Option
		if fair {
			opts = append(opts, dlock.Fair())
		}
		const patience = 30 * time.Second
		got := make(chan error, 1)
		go func() {
			wctx, cancel := context.WithTimeout(ctx, patience)
			defer cancel()
			l, err := waiter.Mutex("k", opts...).Lock(wctx)
			if err == nil {
				err = l.Unlock(ctx)
			}
			got <- err
		}()
		// Past the first subscription's wait, and within the pause before
		// the next: the waiter polls.
		time.Sleep(wait + time.Second)
		released := time.Now()
		if err := h.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Errorf("fair=%v: Lock: %v", fair, err)
			}
			// Polling (every 500ms at most), not trying to subscribe
			// again before each attempt, which would take until the
			// second subscription's wait ends, 2s after the release.
			if d := time.Since(released); d > time.Second {
				t.Errorf("fair=%v: the waiter got the lock %v after the release", fair, d)
			}
		case <-time.After(patience / 2):
			t.Fatalf("fair=%v: the waiter still waits %v after the release: its subscription held it", fair, patience/2)
		}
		if err := errors.Join(holder.Close(), waiter.Close()); err != nil {
			t.Fatal(err)
		}
	}
}
