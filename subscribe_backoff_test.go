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

// TestSecondLockDoesNotPaySubscribeWaitAgain checks that a Client whose
// store never confirms a subscription does not pay subscribeWait again at
// every Lock that has to wait. The group's failedAt lives only as long as
// the group: the next Lock on the name (a new group) subscribes again and
// sits out subscribeWait, deaf to the release meanwhile.
func TestSecondLockDoesNotPaySubscribeWaitAgain(t *testing.T) {
	defer dlock.SetSubscribeWait(2 * time.Second)()
	store := memlock.New()
	holder, waiter := dlock.New(store), dlock.New(stuckStore(store))
	defer func() {
		if err := errors.Join(holder.Close(), waiter.Close()); err != nil {
			t.Error(err)
		}
	}()
	ctx := context.Background()
	for round := 1; round <= 2; round++ {
		h, err := holder.Mutex("k").Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan time.Time, 1)
		go func() {
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			l, err := waiter.Mutex("k").Lock(wctx)
			if err != nil {
				t.Error(err)
			} else if err := l.Unlock(ctx); err != nil {
				t.Error(err)
			}
			got <- time.Now()
		}()
		time.Sleep(200 * time.Millisecond) // the waiter waits
		released := time.Now()
		if err := h.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		took := (<-got).Sub(released)
		// Round 1 pays the first failed subscription (up to 2s); the
		// store is known not to confirm from then on.
		if round == 2 && took > time.Second {
			t.Errorf("round %d: the waiter got the lock %v after the release (subscribeWait 2s): its new group subscribed again, deaf meanwhile, though the name's last subscription had failed moments before", round, took.Round(time.Millisecond))
		}
	}
}

// TestObserveNotSlowedByHungSubscribe checks that an election
// observer on a store that never confirms subscriptions sees a change of
// leader at the polled pace. observe calls listenOrPoll at every turn of
// its loop and has no failedAt: each turn sits out subscribeWait before it
// reads the leader.
func TestObserveNotSlowedByHungSubscribe(t *testing.T) {
	defer dlock.SetSubscribeWait(2 * time.Second)()
	store := memlock.New()
	leader, watcher := dlock.New(store, dlock.WithTTL(10*time.Second)), dlock.New(stuckStore(store))
	defer func() {
		if err := errors.Join(leader.Close(), watcher.Close()); err != nil {
			t.Error(err)
		}
	}()
	ld, err := leader.Election("e").Campaign(t.Context(), "v1")
	if err != nil {
		t.Fatal(err)
	}
	seen, err := watcher.Election("e").Observe(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got := recvLeader(t, seen); got.Value != "v1" {
		t.Fatalf("first observed = %+v, want v1", got)
	}
	time.Sleep(100 * time.Millisecond)
	resigned := time.Now()
	if err := ld.Resign(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := recvLeader(t, seen); got.Fence != 0 {
		t.Fatalf("observed after the resignation = %+v, want no leader", got)
	}
	if took := time.Since(resigned); took > time.Second {
		t.Errorf("resignation observed after %v; a polling observer reads every <=500ms, but each turn of observe waits subscribeWait (2s) for a subscription first", took.Round(time.Millisecond))
	}
}

// watchStuckStore is a memlock store whose stream confirms Subscribe but
// never confirms a Watch (driver.HandoffWatcher), as when its connection
// fails between the two.
func watchStuckStore(store *memlock.Backend) wrappedStore {
	return wrappedStore{store, func(l driver.Listener) driver.Listener { return watchStuckListener{l} }}
}

type watchStuckListener struct{ driver.Listener }

func (watchStuckListener) Watch(ctx context.Context, key string) error {
	<-ctx.Done()
	return ctx.Err()
}

func (watchStuckListener) Unwatch(ctx context.Context, key string) error { return nil }

// TestObserveWatchHangBounded checks that an observer whose Watch is
// never confirmed still reports the leader. watchHandoffs calls Watch with
// Observe's ctx alone, unbounded by subscribeWait unlike Subscribe: the
// observer never reads the leader.
func TestObserveWatchHangBounded(t *testing.T) {
	defer dlock.SetSubscribeWait(500 * time.Millisecond)()
	store := memlock.New()
	leader, watcher := dlock.New(store, dlock.WithTTL(10*time.Second)), dlock.New(watchStuckStore(store))
	defer func() {
		if err := errors.Join(leader.Close(), watcher.Close()); err != nil {
			t.Error(err)
		}
	}()
	if _, err := leader.Election("e").Campaign(t.Context(), "v1"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	seen, err := watcher.Election("e").Observe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-seen:
		if got.Value != "v1" {
			t.Fatalf("first observed = %+v, want v1", got)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Observe reported no leader within 3s: stuck in Watch, which subscribeWait does not bound")
	}
}

// TestSecondUserDoesNotWaitTwoSubscribeWaits: an election observer and a
// waiter of one Client on one name, on a store that never confirms. The
// second to listen waits, unbounded by subscribeWait, for the first's
// Subscribe (listen's <-done), and when that fails subscribes itself:
// deaf for up to twice subscribeWait.
func TestSecondUserDoesNotWaitTwoSubscribeWaits(t *testing.T) {
	defer dlock.SetSubscribeWait(time.Second)()
	store := memlock.New()
	holder, waiter := dlock.New(store), dlock.New(stuckStore(store))
	defer func() {
		if err := errors.Join(holder.Close(), waiter.Close()); err != nil {
			t.Error(err)
		}
	}()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	h, err := holder.Mutex("k").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := waiter.Election("k").Observe(ctx); err != nil { // subscribes "k" first
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	got := make(chan time.Time, 1)
	go func() {
		l, err := waiter.Mutex("k").Lock(ctx)
		if err != nil {
			t.Error(err)
		} else if err := l.Unlock(context.Background()); err != nil {
			t.Error(err)
		}
		got <- time.Now()
	}()
	time.Sleep(1200 * time.Millisecond) // past one subscribeWait since the waiter came
	released := time.Now()
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if took := (<-got).Sub(released); took > 500*time.Millisecond {
		t.Errorf("the waiter got the lock %v after the release, %v after it began to wait (subscribeWait 1s)", took.Round(time.Millisecond), (took + 1200*time.Millisecond).Round(time.Millisecond))
	}
}
