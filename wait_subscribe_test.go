package dlock_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/memlock"
	"github.com/dlock-go/dlock/redislock"
	"github.com/redis/go-redis/v9"
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
