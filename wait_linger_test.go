package dlock_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memlock"
)

// subCounting is a memlock store whose notification streams count
// Subscribe and Unsubscribe calls and the live subscriptions per key.
type subCounting struct {
	*memlock.Backend

	mu            sync.Mutex
	subs, unsubs  int
	live          map[string]int
	droppedToZero int // times a key's live subscriptions fell to 0
	maxLive       int // most live subscriptions of one key at once
}

func (s *subCounting) Listen(ctx context.Context, fn func(key, next string)) (driver.Listener, error) {
	l, err := s.Backend.Listen(ctx, fn)
	if err != nil {
		return nil, err
	}
	return &subCountingListener{Listener: l, s: s}, nil
}

func (s *subCounting) liveOf(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live[key]
}

func (s *subCounting) counts() (subs, unsubs, dropped int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.subs, s.unsubs, s.droppedToZero
}

type subCountingListener struct {
	driver.Listener
	s *subCounting
}

func (l *subCountingListener) Subscribe(ctx context.Context, key string) error {
	err := l.Listener.Subscribe(ctx, key)
	if err == nil {
		l.s.mu.Lock()
		l.s.subs++
		if l.s.live == nil {
			l.s.live = map[string]int{}
		}
		l.s.live[key]++
		l.s.maxLive = max(l.s.maxLive, l.s.live[key])
		l.s.mu.Unlock()
	}
	return err
}

func (l *subCountingListener) Unsubscribe(ctx context.Context, key string) error {
	l.s.mu.Lock()
	l.s.unsubs++
	if l.s.live[key]--; l.s.live[key] == 0 {
		l.s.droppedToZero++
	}
	l.s.mu.Unlock()
	return l.Listener.Unsubscribe(ctx, key)
}

// waitOnce makes waiter wait for name while holder holds it, then lets it
// in; the waiter unlocks at once.
func waitOnce(t *testing.T, holder, waiter *dlock.Client, store *subCounting, name string) {
	t.Helper()
	ctx := context.Background()
	held, err := holder.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	busy := make(chan struct{}, 1)
	onBusy := dlock.WithOnBusy(func(*dlock.NotObtainedError) {
		select {
		case busy <- struct{}{}:
		default:
		}
	})
	got := make(chan error, 1)
	go func() {
		l, err := waiter.Mutex(name, onBusy).Lock(ctx)
		if err == nil {
			err = l.Unlock(ctx)
		}
		got <- err
	}()
	// The waiter was refused, and its Client is subscribed (anew, or still
	// from an earlier wait); release only then, so that it is a waiter that
	// the release wakes.
	select {
	case <-busy:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was never refused")
	}
	for deadline := time.Now().Add(10 * time.Second); store.liveOf(name) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the waiter never subscribed")
		}
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not let in after the release")
	}
}

// TestWaitsShareASubscription checks that a Client that waits for the same
// name again soon keeps its subscription to the name's releases in between
// (one SUBSCRIBE and UNSUBSCRIBE per wait cost a hot lock round trips), and
// that it drops it once no waiter came back for a while.
func TestWaitsShareASubscription(t *testing.T) {
	t.Run("kept between waits", func(t *testing.T) {
		defer dlock.SetSubscriptionLinger(time.Hour)()
		store := &subCounting{Backend: memlock.New()}
		holder, waiter := dlock.New(store.Backend), dlock.New(store)
		defer holder.Close()
		for range 3 {
			waitOnce(t, holder, waiter, store, "hot")
		}
		// One SUBSCRIBE serves the three waits: the subscription lingers
		// between them, and the next wait takes it over; a wait that
		// starves and goes on in the queue keeps it too. The stream never
		// has two live subscriptions of the key (driver.Listener).
		subs, unsubs, dropped := store.counts()
		if subs != 1 || unsubs != 0 || dropped != 0 || store.liveOf("hot") != 1 {
			t.Errorf("after three waits: %d subscribes, %d unsubscribes, subscription dropped %d times, %d live; want 1 subscribe, none dropped, 1 live",
				subs, unsubs, dropped, store.liveOf("hot"))
		}
		start := time.Now()
		if err := waiter.Close(); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("Close took %v with unsubscriptions pending", d)
		}
	})
	t.Run("dropped after the linger", func(t *testing.T) {
		defer dlock.SetSubscriptionLinger(10 * time.Millisecond)()
		store := &subCounting{Backend: memlock.New()}
		holder, waiter := dlock.New(store.Backend), dlock.New(store)
		defer holder.Close()
		defer waiter.Close()
		waitOnce(t, holder, waiter, store, "once")
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			subs, unsubs, _ := store.counts()
			if subs >= 1 && unsubs == subs {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d subscribes, %d unsubscribes 10s after the wait; want as many of each", subs, unsubs)
			}
		}
	})
}

// acquireCounting is a memlock store that counts Acquire calls.
type acquireCounting struct {
	*memlock.Backend
	mu sync.Mutex
	n  int
}

func (a *acquireCounting) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	a.mu.Lock()
	a.n++
	a.mu.Unlock()
	return a.Backend.Acquire(ctx, req)
}

func (a *acquireCounting) calls() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n
}

// TestWaitSleepsFirstWhenNoReleaseCame: a waiter whose Client was already
// subscribed to the name when its first attempt was refused, and has heard
// no release since, does not ask the store again before it sleeps: the next
// release will wake it. (It saves one of the four store calls per grant of
// a hot fair lock.)
func TestWaitSleepsFirstWhenNoReleaseCame(t *testing.T) {
	for _, fair := range []bool{true, false} {
		store := &acquireCounting{Backend: memlock.New()}
		holder, waiter := dlock.New(store.Backend), dlock.New(store)
		// The plain case is Reentrant so that it never switches to the
		// queue (a waiter that starves tries at once, as a fair one).
		opts := []dlock.Option{dlock.Reentrant()}
		if fair {
			opts = []dlock.Option{dlock.Fair()}
		}
		m := waiter.Mutex("k", opts...)
		ctx := context.Background()
		for round := range 2 {
			h, err := holder.Mutex("k").Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			before := store.calls()
			got := make(chan error, 1)
			go func() {
				l, err := m.Lock(ctxTimeout(t, 10*time.Second))
				if err == nil {
					err = l.Unlock(ctx)
				}
				got <- err
			}()
			// The waiter tries, then sleeps: a plain one until its first
			// retry (100ms), a fair one until a release.
			for deadline := time.Now().Add(10 * time.Second); store.calls() == before; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the waiter never tried")
				}
			}
			time.Sleep(30 * time.Millisecond)
			waited := store.calls() - before
			if round == 1 && waited != 1 {
				// The first round subscribed; the subscription lingers.
				t.Errorf("fair=%v: the waiter called Acquire %d times before any release; want 1 (its first try)", fair, waited)
			}
			if err := h.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-got; err != nil {
				t.Fatal(err)
			}
		}
		_ = holder.Close()
		_ = waiter.Close()
	}
}

// releaseOnRefusal is a memlock store that, when armed, releases the
// holder's lease right after the store refused a request and before the
// refusal reaches the waiter: the release falls between the waiter's
// first try and its wait.
type releaseOnRefusal struct {
	*memlock.Backend
	mu    sync.Mutex
	armed *dlock.Lease
}

func (r *releaseOnRefusal) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	res, err := r.Backend.Acquire(ctx, req)
	r.mu.Lock()
	l := r.armed
	if err == nil && !res.Acquired && l != nil {
		r.armed = nil
	}
	r.mu.Unlock()
	if err == nil && !res.Acquired && l != nil {
		_ = l.Unlock(context.Background())
	}
	return res, err
}

// TestWaitTriesWhenReleasedBeforeItWaits: a release that comes between a
// waiter's refused first try and its wait is heard (the Client was
// subscribed), so the waiter tries again at once instead of sleeping on the
// old answer.
func TestWaitTriesWhenReleasedBeforeItWaits(t *testing.T) {
	for _, fair := range []bool{true, false} {
		store := &releaseOnRefusal{Backend: memlock.New()}
		holder, waiter := dlock.New(store.Backend), dlock.New(store)
		opts := []dlock.Option{dlock.Reentrant()}
		if fair {
			opts = []dlock.Option{dlock.Fair()}
		}
		m := waiter.Mutex("k", opts...)
		ctx := context.Background()
		for round := range 2 {
			h, err := holder.Mutex("k").Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if round == 0 {
				// The first round subscribes; the subscription lingers.
				go func() { time.Sleep(50 * time.Millisecond); _ = h.Unlock(ctx) }()
			} else {
				store.mu.Lock()
				store.armed = h
				store.mu.Unlock()
			}
			start := time.Now()
			l, err := m.Lock(ctxTimeout(t, 10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			// Sleeping on the old answer would take a retry (plain:
			// 100ms) or a queue refresh (fair: 1.7s).
			if round == 1 && took > 25*time.Millisecond {
				t.Errorf("fair=%v: Lock took %v with the lock released before the wait; want it at once", fair, took)
			}
		}
		_ = holder.Close()
		_ = waiter.Close()
	}
}

// TestOneLiveSubscriptionPerKey checks the client's side of the
// driver.Listener contract under churn: waits that come and go on a few
// keys, with subscriptions that linger only a moment, never have two live
// subscriptions of one key on the stream (a Listener need not count them).
func TestOneLiveSubscriptionPerKey(t *testing.T) {
	defer dlock.SetSubscriptionLinger(time.Millisecond)()
	store := &subCounting{Backend: memlock.New()}
	a, b := dlock.New(store), dlock.New(store.Backend)
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 6 {
		c := a
		if i%3 == 2 {
			c = b
		}
		name := fmt.Sprintf("churn-%d", i%3)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				l, err := c.Mutex(name).Lock(ctx)
				if err != nil {
					continue
				}
				time.Sleep(time.Duration(rand.N(3)) * time.Millisecond)
				_ = l.Unlock(context.Background())
				time.Sleep(time.Duration(rand.N(4)) * time.Millisecond) // let the subscription lapse at times
			}
		}()
	}
	wg.Wait()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	if store.subs < 2 || store.unsubs == 0 {
		t.Fatalf("%d subscribes and %d unsubscribes: the churn did not make subscriptions come and go", store.subs, store.unsubs)
	}
	if store.maxLive > 1 {
		t.Errorf("up to %d live subscriptions of one key at once; want at most 1", store.maxLive)
	}
}
