package dlock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/memlock"
	"github.com/dlock-go/dlock/redislock"
	"github.com/redis/go-redis/v9"
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

// TestShortWaitPollsWhileSubscribePending checks that a waiter is never
// blocked on its subscription: with the store's Subscribe hanging past the
// waiter's whole wait (subscribeWait is 5s, the wait 2s), a release 300ms
// in is found by polling, plain and Fair (a Fair waiter, queued with its
// first request and handed the lock by the release, claims the grant with
// its next request); and a second short wait of the name does the same.
func TestShortWaitPollsWhileSubscribePending(t *testing.T) {
	t.Parallel()
	for _, fair := range []bool{false, true} {
		store := memlock.New()
		holder, waiter := dlock.New(store), dlock.New(stuckStore(store))
		opts := []dlock.Option{dlock.WithWait(2 * time.Second)}
		if fair {
			opts = append(opts, dlock.Fair())
		}
		for round := 1; round <= 2; round++ {
			h, err := holder.Mutex("k").Lock(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan error, 1)
			go func() {
				l, err := waiter.Mutex("k", opts...).Lock(context.Background())
				if err == nil {
					err = l.Unlock(context.Background())
				}
				got <- err
			}()
			time.Sleep(300 * time.Millisecond)
			if err := h.Unlock(t.Context()); err != nil {
				t.Fatal(err)
			}
			if err := <-got; err != nil {
				t.Errorf("fair=%v round %d: Lock with a 2s wait and a release 300ms in: %v", fair, round, err)
			}
		}
		if err := errors.Join(holder.Close(), waiter.Close()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestShortWaitPollsWhilePubSubHalfOpen is TestShortWaitPollsWhileSubscribePending
// on redis-server: the waiter's pub/sub connection goes half-open as it
// subscribes (what it writes vanishes, nothing comes back), while its
// command connections work.
func TestShortWaitPollsWhilePubSubHalfOpen(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t)
	for _, fair := range []bool{false, true} {
		holder := dlock.New(redislock.New(srv.Client(t)))
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Dialer: dialHalfOpenOnSubscribe})
		waiter := dlock.New(redislock.New(rdb))
		opts := []dlock.Option{dlock.WithWait(2 * time.Second)}
		if fair {
			opts = append(opts, dlock.Fair())
		}
		for round := 1; round <= 2; round++ {
			h, err := holder.Mutex("k").Lock(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan error, 1)
			go func() {
				l, err := waiter.Mutex("k", opts...).Lock(context.Background())
				if err == nil {
					err = l.Unlock(context.Background())
				}
				got <- err
			}()
			time.Sleep(300 * time.Millisecond)
			if err := h.Unlock(t.Context()); err != nil {
				t.Fatal(err)
			}
			if err := <-got; err != nil {
				t.Errorf("fair=%v round %d: Lock with a 2s wait and a release 300ms in: %v", fair, round, err)
			}
		}
		if err := errors.Join(holder.Close(), waiter.Close(), rdb.Close()); err != nil {
			t.Fatal(err)
		}
	}
}

// dialHalfOpenOnSubscribe dials a connection that goes half-open when it
// writes a SUBSCRIBE: from then on its writes vanish and its reads get
// nothing (until their deadline or Close).
func dialHalfOpenOnSubscribe(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &halfOpenConn{Conn: c, closed: make(chan struct{})}, nil
}

type halfOpenConn struct {
	net.Conn
	closeOnce sync.Once
	closed    chan struct{}
	mu        sync.Mutex
	hole      bool
	deadline  time.Time // read deadline
}

func (c *halfOpenConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.hole && bytes.Contains(bytes.ToLower(p), []byte("subscribe")) {
		c.hole = true
	}
	if c.hole {
		return len(p), nil
	}
	return c.Conn.Write(p)
}

func (c *halfOpenConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	hole, deadline := c.hole, c.deadline
	c.mu.Unlock()
	if !hole {
		return c.Conn.Read(p)
	}
	var expired <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-c.closed:
		return 0, net.ErrClosed
	case <-expired:
		return 0, os.ErrDeadlineExceeded
	}
}

func (c *halfOpenConn) SetDeadline(t time.Time) error {
	_ = c.SetReadDeadline(t)
	return c.Conn.SetDeadline(t)
}

func (c *halfOpenConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return c.Conn.SetReadDeadline(t)
}

func (c *halfOpenConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// flaky is a memlock store whose next acquires fail with an error that
// may heal (driver.Transient) after the store acted on them, as when a
// connection drops with the answer on it.
type flaky struct {
	*memlock.Backend
	fail     atomic.Int64 // acquires still to fail; -1: all of them
	acquires atomic.Int64
	err      error // the error returned, marked transient
}

var errDropped = errors.New("flaky: connection reset after the command ran")

func newFlaky(fail int64) *flaky {
	f := &flaky{Backend: memlock.New(), err: driver.Transient(errDropped)}
	f.fail.Store(fail)
	return f
}

func (f *flaky) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	f.acquires.Add(1)
	res, err := f.Backend.Acquire(ctx, req)
	if err != nil {
		return res, err
	}
	for {
		n := f.fail.Load()
		if n == 0 {
			return res, nil
		}
		if n < 0 || f.fail.CompareAndSwap(n, n-1) {
			return driver.AcquireResult{}, f.err
		}
	}
}

// TestLockRetriesTransientStoreErrors checks that every waiting call goes
// on through store errors that may heal, and gets the lock once the store
// answers, without a hold left behind by the attempts that failed.
func TestLockRetriesTransientStoreErrors(t *testing.T) {
	kinds := []struct {
		name string
		lock func(c *dlock.Client) (func(context.Context) error, error)
	}{
		{"Mutex", func(c *dlock.Client) (func(context.Context) error, error) {
			l, err := c.Mutex("k").Lock(t.Context())
			return unlockOf(l), err
		}},
		{"FairMutex", func(c *dlock.Client) (func(context.Context) error, error) {
			l, err := c.Mutex("k", dlock.Fair()).Lock(t.Context())
			return unlockOf(l), err
		}},
		{"ReentrantMutex", func(c *dlock.Client) (func(context.Context) error, error) {
			l, err := c.Mutex("k", dlock.Reentrant()).Lock(t.Context())
			return unlockOf(l), err
		}},
		{"RLock", func(c *dlock.Client) (func(context.Context) error, error) {
			l, err := c.RWMutex("k").RLock(t.Context())
			return unlockOf(l), err
		}},
		{"Acquire", func(c *dlock.Client) (func(context.Context) error, error) {
			l, err := c.Semaphore("k", 2).Acquire(t.Context())
			return unlockOf(l), err
		}},
		{"Campaign", func(c *dlock.Client) (func(context.Context) error, error) {
			ld, err := c.Election("k").Campaign(t.Context(), "v")
			if err != nil {
				return nil, err
			}
			return ld.Resign, nil
		}},
		{"Multi", func(c *dlock.Client) (func(context.Context) error, error) {
			ml, err := c.Multi([]string{"k", "k2"}).Lock(t.Context())
			if err != nil {
				return nil, err
			}
			return ml.Unlock, nil
		}},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			f := newFlaky(3)
			c := dlock.New(f)
			defer c.Close()
			unlock, err := k.lock(c)
			if err != nil {
				t.Fatalf("Lock through 3 transient errors: %v", err)
			}
			if n := f.acquires.Load(); n < 4 {
				t.Errorf("%d acquires reached the store, want at least 4 (3 failed, 1 granted)", n)
			}
			if err := unlock(t.Context()); err != nil {
				t.Fatal(err)
			}
			if err := c.Close(); err != nil { // the failed attempts' clean-ups are done
				t.Fatal(err)
			}
			for _, key := range []string{"k", "k2"} {
				if info := held(t, f.Backend, key); info.Holds != 0 || len(info.Shared) != 0 {
					t.Errorf("%s after Unlock and Close: %+v, want free", key, info)
				}
			}
		})
	}
}

func unlockOf(l *dlock.Lease) func(context.Context) error {
	if l == nil {
		return nil
	}
	return l.Unlock
}

// TestLockTransientErrorsUntilWaitEnds checks that a wait on a store that
// keeps failing with errors that may heal ends when its wait does, with a
// not-obtained error that carries the cause and the last store error.
func TestLockTransientErrorsUntilWaitEnds(t *testing.T) {
	t.Parallel()
	f := newFlaky(-1)
	c := dlock.New(f)
	defer c.Close()
	start := time.Now()
	_, err := c.Mutex("k", dlock.WithWait(500*time.Millisecond)).Lock(t.Context())
	took := time.Since(start)
	if !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) ||
		!errors.Is(err, errDropped) || !errors.Is(err, driver.ErrTransient) {
		t.Fatalf("Lock = %v; want ErrNotObtained, DeadlineExceeded and the store's error", err)
	}
	if !strings.Contains(err.Error(), errDropped.Error()) {
		t.Errorf("the message %q does not say the store's error", err)
	}
	if took < 400*time.Millisecond {
		t.Errorf("Lock returned after %v, before its wait (500ms) ended", took)
	}
	if n := f.acquires.Load(); n < 3 {
		t.Errorf("%d acquires in 500ms; want several tries", n)
	}
	// TryLock makes one attempt and returns the store's error.
	f.acquires.Store(0)
	if _, err := c.Mutex("k").TryLock(t.Context()); !errors.Is(err, errDropped) || errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("TryLock = %v; want the store's error", err)
	}
	if n := f.acquires.Load(); n != 1 {
		t.Errorf("TryLock made %d acquires, want 1", n)
	}
}

// TestLockReturnsPermanentStoreErrorAtOnce checks that a store error that
// will not heal (not marked transient) still ends a wait at once.
func TestLockReturnsPermanentStoreErrorAtOnce(t *testing.T) {
	f := newFlaky(-1)
	f.err = errDropped
	c := dlock.New(f)
	defer c.Close()
	start := time.Now()
	_, err := c.Mutex("k", dlock.WithWait(5*time.Second)).Lock(t.Context())
	if !errors.Is(err, errDropped) || errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("Lock = %v; want the store's error", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Lock returned after %v; want at once", took)
	}
	if n := f.acquires.Load(); n != 1 {
		t.Errorf("%d acquires, want 1", n)
	}
}

// TestLockRetriesTransientErrorsWhileWaiting checks that a wait that is
// under way (the lock is held) goes on through transient errors and gets
// the lock at its release.
func TestLockRetriesTransientErrorsWhileWaiting(t *testing.T) {
	t.Parallel()
	for _, fair := range []bool{false, true} {
		f := newFlaky(0)
		holder, c := dlock.New(f.Backend), dlock.New(f)
		var opts []dlock.Option
		if fair {
			opts = append(opts, dlock.Fair())
		}
		h, err := holder.Mutex("k").Lock(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			l, err := c.Mutex("k", opts...).Lock(t.Context())
			if err == nil {
				err = l.Unlock(context.Background())
			}
			got <- err
		}()
		time.Sleep(100 * time.Millisecond)
		f.fail.Store(-1)
		time.Sleep(2 * time.Second) // attempts fail (a queued waiter keeps its entry every 5s/3)
		f.fail.Store(0)
		if err := h.Unlock(t.Context()); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Errorf("fair=%v: Lock: %v", fair, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("fair=%v: Lock still waits 10s after the release", fair)
		}
		if err := errors.Join(c.Close(), holder.Close()); err != nil {
			t.Fatal(err)
		}
		if info := held(t, f.Backend, "k"); info.Holds != 0 {
			t.Errorf("fair=%v: after Unlock and Close: %+v, want free", fair, info)
		}
	}
}

// TestLockRetriesAreObservedAsAttempts checks that observers see each try
// through transient errors: one acquire store call with its error per try,
// and the Lock's granted event counting them all.
func TestLockRetriesAreObservedAsAttempts(t *testing.T) {
	f := newFlaky(2)
	rec := &recorder{}
	c := dlock.New(f, dlock.WithObserver(rec))
	defer c.Close()
	l, err := c.Mutex("k").Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	es := rec.take()
	if g := one(t, es, dlock.EventLockGranted); g.Attempts != 3 {
		t.Errorf("granted after 2 transient errors with Attempts %d, want 3", g.Attempts)
	}
	var failed int
	for _, e := range of(es, dlock.EventStoreCall) {
		if e.Op == "acquire" && errors.Is(e.Err, errDropped) {
			failed++
		}
	}
	if failed != 2 {
		t.Errorf("%d failed acquire store calls observed, want 2", failed)
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// acquireCounter is a store that counts the acquire requests it is sent,
// and changes nothing else.
// acquireCounter counts the acquires sent to a memlock store, by key and
// token.
type acquireCounter struct {
	*memlock.Backend
	mu     sync.Mutex
	tokens map[string]int // acquires sent per key and token ("key token")
}

func (s *acquireCounter) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	s.mu.Lock()
	if s.tokens == nil {
		s.tokens = make(map[string]int)
	}
	s.tokens[req.Key+" "+req.Token]++
	s.mu.Unlock()
	return s.Backend.Acquire(ctx, req)
}

// senders returns how many tokens have sent acquires so far, on any key.
func (s *acquireCounter) senders() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.tokens)
}

// sentBy returns how many acquires each key and token ("key token") has
// sent so far.
func (s *acquireCounter) sentBy() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.tokens)
}

// TestLockJoinsItsClientsWaitersWithoutARequest: a Lock on a name for
// which its Client has a request under way or waiters joins them without
// a request of its own, so that a crowd of them, come at once or one by
// one, costs the store one request at a time (counted by the tokens that
// ask: the waiter whose turn it is asks again on its schedule); every
// waiter is granted, TryLock still asks the store once, and a reentrant
// handle that holds the lock still enters it at once. (The order among one
// Client's waiters is the order in which they reach their group's turn,
// which WaitersOn, counting joins, does not show.)
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
			rBusy := make(chan struct{}, 1)
			onBusy := dlock.WithOnBusy(func(*dlock.NotObtainedError) {
				select {
				case rBusy <- struct{}{}:
				default:
				}
			})
			go func() {
				l, err := c.Mutex("r", onBusy).Lock(ctx)
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
			before := store.senders()
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
			// The Client's waiter at the turn asks again on its schedule,
			// more often the longer a loaded machine takes to get here;
			// what counts is who asks: a Lock that joins sends nothing.
			if n := store.senders() - before; n >= waiters/2 {
				t.Errorf("%d Locks of one Client waiting for a held name: %d of them sent requests; want a few (one at a time)", waiters, n)
			}

			sent := store.sentBy()
			if _, err := c.Mutex("k", opts...).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
				t.Errorf("TryLock of a held name: %v, want not obtained", err)
			}
			var fresh []int // requests of the tokens new since: the TryLock's
			for kt, n := range store.sentBy() {
				if _, ok := sent[kt]; !ok && strings.HasPrefix(kt, "k ") {
					fresh = append(fresh, n)
				}
			}
			if len(fresh) != 1 || fresh[0] != 1 {
				t.Errorf("TryLock beside waiters: new tokens sent %v requests, want one token, one request", fresh)
			}
			<-rBusy // the Lock of "r" waits
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
		})
	}
}

// A retry strategy that says "no pause" must not become a busy loop.
func TestZeroRetryDelayIsNotABusyLoop(t *testing.T) {
	f := newFaulty()
	holder := dlock.New(f)
	defer holder.Close()
	if _, err := holder.Mutex("k").Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	c := dlock.New(f)
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	before := f.acquires.Load()
	_, _ = c.Mutex("k", dlock.WithRetry(zeroDelay{})).Lock(ctx)
	if n := f.acquires.Load() - before; n > 300 {
		t.Errorf("%d attempts in 100ms with a zero retry delay, want at most 300", n)
	}
}

// pausedAfterAcquire is a Backend whose first Acquire, sent with a
// pauseCtx, arms that context: the next Done of it runs the context's
// pause, as when the Lock's goroutine is descheduled after its first
// attempt, before it waits.
type pausedAfterAcquire struct{ *memlock.Backend }

func (b pausedAfterAcquire) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	res, err := b.Backend.Acquire(ctx, req)
	if p, ok := ctx.(*pauseCtx); ok {
		p.armed.Store(true)
	}
	return res, err
}

// pauseCtx runs pause once, at the first Done after it was armed.
type pauseCtx struct {
	context.Context
	armed atomic.Bool
	once  sync.Once
	pause func()
}

func (p *pauseCtx) Done() <-chan struct{} {
	if p.armed.Load() {
		p.once.Do(p.pause)
	}
	return p.Context.Done()
}

// TestFirstAttemptKeepsItsClientsPlaceInTheFairQueue: a fair Lock whose
// first attempt queued it first keeps its Client's place, even when another
// Lock of its Client comes between that attempt's answer and its wait. That
// Lock joins it without a request, and the Client is served before a
// Client that queued after it.
func TestFirstAttemptKeepsItsClientsPlaceInTheFairQueue(t *testing.T) {
	mem := memlock.New()
	holder, other, c := dlock.New(mem), dlock.New(mem), dlock.New(pausedAfterAcquire{mem})
	defer holder.Close()
	defer other.Close()
	defer c.Close()
	ctx := ctxTimeout(t, time.Minute)
	held, err := holder.Mutex("k", dlock.Fair()).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}

	type grant struct {
		who string
		l   *dlock.Lease
	}
	grants := make(chan grant, 3)
	var wg sync.WaitGroup
	defer wg.Wait()
	lock := func(who string, cl *dlock.Client, ctx context.Context, busy func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var once sync.Once
			l, err := cl.Mutex("k", dlock.Fair(), dlock.WithOnBusy(func(*dlock.NotObtainedError) { once.Do(busy) })).Lock(ctx)
			if err != nil {
				t.Errorf("%s: %v", who, err)
				return
			}
			grants <- grant{who, l}
		}()
	}

	// c's first Lock is queued first; between its first attempt's answer
	// and its wait, another Client queues, then c's second Lock comes.
	first := &pauseCtx{Context: ctx}
	first.pause = func() {
		queued := make(chan struct{})
		lock("other", other, ctx, func() { close(queued) })
		<-queued
		joined := make(chan struct{})
		lock("c second", c, ctx, func() { close(joined) })
		<-joined
		for dlock.WaitersOn(c, "k") == 0 {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond) // the second Lock settles in
	}
	lock("c first", c, first, func() {})
	for dlock.WaitersOn(c, "k") < 2 || dlock.WaitersOn(other, "k") < 1 {
		time.Sleep(time.Millisecond)
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	var order []string
	for range 3 {
		g := <-grants
		order = append(order, g.who)
		if err := g.l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.HasPrefix(order[0], "c ") {
		t.Fatalf("grants in the order %q; want one of c's Locks first (c queued first)", order)
	}
}

// TestWaitingWriterKeepsReadersOutAcrossTransientError: a writer that
// waits for a reader keeps a later reader out through an attempt whose
// answer is lost (a transient error after the store acted): the wait goes
// on with a new token, and the clean-up of the old one drops no intent
// that a reader could slip past. The late reader's lease comes after the
// writer's.
//
// The lost attempt is refused (the reader still holds: it refreshed the
// writer's intent), or granted (the reader left just before it).
func TestWaitingWriterKeepsReadersOutAcrossTransientError(t *testing.T) {
	lose := func(w *troubled) { w.loseNext.Store(true) }
	t.Run("refused", func(t *testing.T) { lateReaderWaitsForWriter(t, false, lose) })
	t.Run("granted", func(t *testing.T) { lateReaderWaitsForWriter(t, true, lose) })
}

// lateReaderWaitsForWriter runs a reader's lease, a writer that waits for
// it (an RWMutex's, on a troubled store whose acquires take 200 ms after a
// fault) and a later reader that waits for the writer; fault arms the
// writer's store once both wait. The first reader leaves before the fault
// (leaveFirst) or once it was met. The late reader must get its lease
// after the writer's. opts are the writer's.
func lateReaderWaitsForWriter(t *testing.T, leaveFirst bool, fault func(*troubled), opts ...dlock.Option) {
	t.Helper()
	store := memlock.New()
	newClient := func(b driver.Backend) *dlock.Client {
		c := dlock.New(b)
		t.Cleanup(func() { c.Close() })
		return c
	}
	ctx := t.Context()
	r1, err := newClient(store).RWMutex("book").RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		fence uint64
		err   error
	}
	take := func(lock func(context.Context) (*dlock.Lease, error), out chan<- result) {
		lctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		l, err := lock(lctx)
		if err == nil {
			err = l.Unlock(ctx)
		}
		out <- result{fence: l.Fence(), err: err}
	}
	signal := func() (chan struct{}, func()) {
		ch := make(chan struct{})
		var once sync.Once
		return ch, func() { once.Do(func() { close(ch) }) }
	}

	wb := newTroubled(store, 200*time.Millisecond)
	waiting, sawIntent := signal()
	wb.answered = func(_ driver.AcquireRequest, res driver.AcquireResult) {
		if res.Queued && res.Shared > 0 {
			sawIntent()
		}
	}
	writer, late := make(chan result, 1), make(chan result, 1)
	go take(newClient(wb).RWMutex("book", opts...).Lock, writer)
	await(t, waiting, "the writer's intent")

	lb := newTroubled(store, 0)
	refused, sawRefusal := signal()
	lb.answered = func(_ driver.AcquireRequest, res driver.AcquireResult) {
		if res.WriterWaiting {
			sawRefusal()
		}
	}
	go take(newClient(lb).RWMutex("book").RLock, late)
	await(t, refused, "the late reader's refusal")

	fault(wb)
	if !leaveFirst {
		await(t, wb.fired, "the fault")
	}
	if err := r1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	await(t, wb.fired, "the fault")
	w, l := <-writer, <-late
	if w.err != nil || l.err != nil {
		t.Fatalf("writer: %v; late reader: %v", w.err, l.err)
	}
	if l.fence < w.fence {
		t.Errorf("the late reader got fence %d before the waiting writer's %d", l.fence, w.fence)
	}
}

// TestWaitGoesOnWhenIntentMovesFail: a wait whose attempt's answer is lost
// (a transient error) goes on with a new token even when every move of
// its writer intent to that token fails too: it makes attempts again and
// takes the lock once the holder lets go, well before its context ends.
func TestWaitGoesOnWhenIntentMovesFail(t *testing.T) {
	store := memlock.New()
	ctx := t.Context()
	holder := dlock.New(store)
	defer holder.Close()
	held, err := holder.Mutex("job").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wb := &moving{troubled: newTroubled(store, 0)}
	wb.move = func(context.Context, string, string, string, string, time.Duration) (bool, error) {
		return false, driver.Transient(errors.New("moving: the store is busy"))
	}
	var refusals atomic.Int64
	wb.answered = func(_ driver.AcquireRequest, res driver.AcquireResult) {
		if !res.Acquired && refusals.Add(1) == 2 {
			wb.loseNext.Store(true) // this attempt, a wait's, loses its answer
		}
	}
	c := dlock.New(wb)
	defer c.Close()
	got := make(chan error, 1)
	go func() {
		lctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		l, err := c.Mutex("job").Lock(lctx)
		if err == nil {
			err = l.Unlock(ctx)
		}
		got <- err
	}()
	await(t, wb.fired, "the lost answer")
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the wait ended with %v (%d moves tried); want the lock", err, wb.moves.Load())
	}
	if wb.moves.Load() == 0 {
		t.Fatal("no move of the intent was tried")
	}
}
