package dlock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// pausingStore is a redislock Backend whose stream's first Subscribe
// stops redis-server (SIGSTOP) just before it writes its SUBSCRIBE and has
// it continue after resumeAfter: the SUBSCRIBE is written, and confirmed
// only after the hub's subscribeWait.
type pausingStore struct {
	*redislock.Backend
	srv         *testserver.Redis
	t           *testing.T
	once        sync.Once
	resumeAfter time.Duration
	resumed     chan struct{}
}

func (s *pausingStore) Listen(ctx context.Context, fn func(key, next string)) (driver.Listener, error) {
	l, err := s.Backend.Listen(ctx, fn)
	if err != nil {
		return nil, err
	}
	return pausingListener{l, s}, nil
}

type pausingListener struct {
	driver.Listener
	s *pausingStore
}

func (l pausingListener) Subscribe(ctx context.Context, key string) error {
	l.s.once.Do(func() {
		l.s.srv.Pause(l.s.t)
		time.AfterFunc(l.s.resumeAfter, func() {
			l.s.srv.Resume(l.s.t)
			close(l.s.resumed)
		})
	})
	return l.Listener.Subscribe(ctx, key)
}

// TestRedisSubscribeConfirmedAfterHubGaveUp: the hub gives up on a
// Subscribe whose SUBSCRIBE Redis has been sent but not answered; the
// confirmation comes later. The channel must not stay subscribed on the
// server (nobody would unsubscribe it), and a later wait of the key must
// subscribe again and be woken by the release.
func TestRedisSubscribeConfirmedAfterHubGaveUp(t *testing.T) {
	defer dlock.SetSubscribeWait(300 * time.Millisecond)()
	defer dlock.SetSubscriptionLinger(100 * time.Millisecond)()
	srv := testserver.StartRedis(t)
	admin := srv.Client(t)
	ctx := t.Context()
	store := &pausingStore{Backend: redislock.New(srv.Client(t)), srv: srv, t: t, resumeAfter: time.Second, resumed: make(chan struct{})}
	waiter := dlock.New(store, dlock.WithTTL(10*time.Second))
	defer waiter.Close()
	holder := dlock.New(redislock.New(srv.Client(t)), dlock.WithTTL(10*time.Second))
	defer holder.Close()

	h, err := holder.Mutex("k").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := waiter.Mutex("k").Lock(ctx)
		if err == nil {
			err = l.Unlock(ctx)
		}
		got <- err
	}()
	<-store.resumed
	time.Sleep(300 * time.Millisecond) // the late confirmation, and its UNSUBSCRIBE
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter did not get the lock within 5s of the release")
	}
	// The group may have subscribed again once Redis was back (after its
	// failedAt pause): that subscription lingers 100ms, then goes.
	time.Sleep(500 * time.Millisecond)
	chans, err := admin.PubSubChannels(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(chans) != 0 {
		t.Errorf("with no waiter left, channels still subscribed: %v", chans)
	}

	// A later wait of the key (a new group) subscribes again, and hears.
	h, err = holder.Mutex("k").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		l, err := waiter.Mutex("k").Lock(ctx)
		if err == nil {
			err = l.Unlock(ctx)
		}
		got <- err
	}()
	time.Sleep(1500 * time.Millisecond) // subscribed; notified waiters retry at 100ms, 200ms, 400ms, 800ms...
	chans, err = admin.PubSubChannels(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(chans) != 2 {
		t.Errorf("the second wait's channels = %v, want the release and handoff channels", chans)
	}
	released := time.Now()
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Since(released); d > 300*time.Millisecond {
			t.Errorf("the subscribed waiter got the lock %v after the release, want at once", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the second waiter did not get the lock within 5s")
	}
}
