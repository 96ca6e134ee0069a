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

// deafStore is a store that announces releases in principle, but whose
// notification stream cannot be opened.
type deafStore struct{ *memlock.Backend }

func (deafStore) Listen(context.Context, func(key, next string)) (driver.Listener, error) {
	return nil, errors.New("notifications are down")
}

// TestWaitPollsWhenNotificationsFail: when the notification stream cannot
// be opened, waiters are not woken by releases and must poll in earnest,
// not on the slow safety-net schedule of notified waiters (a fair head
// would otherwise sleep a third of its queue TTL, 1.7s, after a release).
func TestWaitPollsWhenNotificationsFail(t *testing.T) {
	t.Parallel()
	for _, fair := range []bool{false, true} {
		store := memlock.New()
		holder, waiter := dlock.New(store), dlock.New(deafStore{store})
		ctx := context.Background()
		h, err := holder.Mutex("k").Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var opts []dlock.Option
		if fair {
			opts = append(opts, dlock.Fair())
		}
		got := make(chan time.Time, 1)
		go func() {
			l, err := waiter.Mutex("k", opts...).Lock(ctxTimeout(t, 10*time.Second))
			if err != nil {
				t.Error(err)
				got <- time.Time{}
				return
			}
			got <- time.Now()
			_ = l.Unlock(ctx)
		}()
		time.Sleep(300 * time.Millisecond) // the waiter is waiting
		released := time.Now()
		if err := h.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		at := <-got
		if at.IsZero() {
			t.FailNow()
		}
		// Polled: the first polls are 5ms, 10ms, ... apart; 300ms after
		// the start a plain waiter polls every ~320ms at most.
		if d := at.Sub(released); d > time.Second {
			t.Errorf("fair=%v: the waiter got the lock %v after the release; want well under 1s", fair, d)
		}
		_ = holder.Close()
		_ = waiter.Close()
	}
}
