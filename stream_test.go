package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/memlock"
	"github.com/dlock-go/dlock/redislock"
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
	// Two goroutines of a and one of b on each key: a's waits that b's
	// holds keep waiting are the ones that subscribe (while a holds a key
	// itself, its other goroutine's attempt waits for a's own release).
	for i := range 9 {
		c := a
		if i >= 6 {
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
