package redislock_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// notifications collects the keys a listener reports.
type notifications struct {
	keys   chan string
	closed atomic.Bool // set after Close; a call then is a bug
	t      *testing.T
}

func newNotifications(t *testing.T) *notifications {
	return &notifications{keys: make(chan string, 100), t: t}
}

func (n *notifications) fn(key, _ string) {
	if n.closed.Load() {
		n.t.Errorf("listener called fn(%q) after Close returned", key)
	}
	select {
	case n.keys <- key:
	default: // fn must not block
	}
}

// expect waits up to 5s for a notification of key, skipping others.
func (n *notifications) expect(t *testing.T, key string) {
	t.Helper()
	timer := time.NewTimer(5 * time.Second)
	defer timer.Stop()
	for {
		select {
		case got := <-n.keys:
			if got == key {
				return
			}
		case <-timer.C:
			t.Fatalf("no notification for %q", key)
		}
	}
}

// expectNone checks that no notification of key arrives for 200ms.
func (n *notifications) expectNone(t *testing.T, key string) {
	t.Helper()
	timer := time.NewTimer(200 * time.Millisecond)
	defer timer.Stop()
	for {
		select {
		case got := <-n.keys:
			if got == key {
				t.Fatalf("unexpected notification for %q", key)
			}
		case <-timer.C:
			return
		}
	}
}

func listen(t *testing.T, b *redislock.Backend) (driver.Listener, *notifications) {
	t.Helper()
	n := newNotifications(t)
	l, err := b.Listen(t.Context(), n.fn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = l.Close()
		n.closed.Store(true)
	})
	return l, n
}

func subscribe(t *testing.T, l driver.Listener, key string) {
	t.Helper()
	if err := l.Subscribe(t.Context(), key); err != nil {
		t.Fatalf("Subscribe(%q): %v", key, err)
	}
}

func numsub(t *testing.T, rdb *redis.Client, key string) int64 {
	t.Helper()
	ch := "dlock:{" + key + "}:rel"
	m, err := rdb.PubSubNumSub(t.Context(), ch).Result()
	if err != nil {
		t.Fatal(err)
	}
	return m[ch]
}

// lockAndRelease takes and releases key through a second client, as another
// process would.
func lockAndRelease(t *testing.T, b *redislock.Backend, key string) {
	t.Helper()
	tok := newToken(t)
	mustAcquire(t, b, driver.AcquireRequest{Key: key, Token: tok, Owner: "other", TTL: time.Second})
	if got := release(t, b, key, tok); !got.Held {
		t.Fatalf("release: %+v", got)
	}
}

func TestListenerReportsReleases(t *testing.T) {
	b, rdb, srv := setup(t)
	other := redislock.New(srv.Client(t))
	l, n := listen(t, b)

	subscribe(t, l, "k")
	lockAndRelease(t, other, "k")
	n.expect(t, "k")

	// A reentrant hold that is only decremented is not a release.
	tok := newToken(t)
	req := driver.AcquireRequest{Key: "k", Token: tok, Owner: "o", TTL: time.Second, Reentrant: true}
	mustAcquire(t, other, req)
	mustAcquire(t, other, req)
	release(t, other, "k", tok)
	n.expectNone(t, "k")
	release(t, other, "k", tok)
	n.expect(t, "k")

	// Keys not subscribed are not reported.
	lockAndRelease(t, other, "unsubscribed")
	n.expectNone(t, "unsubscribed")

	if got := numsub(t, rdb, "k"); got != 1 {
		t.Errorf("PUBSUB NUMSUB = %d, want 1", got)
	}
}

func TestListenerCountsSubscriptions(t *testing.T) {
	b, rdb, _ := setup(t)
	l, n := listen(t, b)
	ctx := t.Context()

	subscribe(t, l, "k")
	subscribe(t, l, "k")
	if err := l.Unsubscribe(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	lockAndRelease(t, b, "k")
	n.expect(t, "k") // one subscription left

	if err := l.Unsubscribe(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the last Unsubscribe reaches the server", func() bool { return numsub(t, rdb, "k") == 0 })
	lockAndRelease(t, b, "k")
	n.expectNone(t, "k")

	if err := l.Unsubscribe(ctx, "k"); err == nil {
		t.Error("Unsubscribe without a Subscribe returned nil")
	}

	// Subscribing again after the last Unsubscribe works.
	subscribe(t, l, "k")
	lockAndRelease(t, b, "k")
	n.expect(t, "k")
}

func TestSubscribeWaitsForConfirmation(t *testing.T) {
	b, rdb, srv := setup(t)
	l, n := listen(t, b)
	subscribe(t, l, "warm") // the pub/sub connection is up
	ctx := t.Context()

	// While the server is paused it reads the SUBSCRIBE but does not run it,
	// so no confirmation can come back.
	const pause = 500 * time.Millisecond
	start := time.Now()
	if err := rdb.ClientPause(ctx, pause).Err(); err != nil {
		t.Fatal(err)
	}

	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := l.Subscribe(short, "gave-up"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Subscribe during a pause with a 100ms context: %v, want DeadlineExceeded", err)
	}

	subscribe(t, l, "k")
	if waited := time.Since(start); waited < pause-100*time.Millisecond {
		t.Errorf("Subscribe returned after %v, before the server could have confirmed (pause %v)", waited, pause)
	}
	// No polling: once Subscribe returned the server has the subscription.
	if got := numsub(t, rdb, "k"); got != 1 {
		t.Errorf("PUBSUB NUMSUB after Subscribe = %d, want 1", got)
	}
	lockAndRelease(t, redislock.New(srv.Client(t)), "k")
	n.expect(t, "k")

	// The abandoned subscription is undone once its confirmation arrives.
	eventually(t, "the abandoned subscription is dropped", func() bool { return numsub(t, rdb, "gave-up") == 0 })
}

func TestListenerClose(t *testing.T) {
	b, _, _ := setup(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	n := newNotifications(t)
	l, err := b.Listen(t.Context(), n.fn)
	if err != nil {
		t.Fatal(err)
	}
	subscribe(t, l, "k")

	// A Subscribe still waiting when Close is called returns.
	blocked := make(chan error, 1)
	go func() { blocked <- l.Subscribe(context.Background(), "never-confirmed") }()

	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	n.closed.Store(true)
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := <-blocked; err == nil {
		// It may have been confirmed before Close; that is fine too.
		t.Log("the concurrent Subscribe was confirmed before Close")
	} else if !errors.Is(err, redis.ErrClosed) {
		t.Errorf("Subscribe interrupted by Close: %v, want redis.ErrClosed", err)
	}

	lockAndRelease(t, b, "k")
	n.expectNone(t, "k") // and fn reports a call after Close as an error

	if err := l.Subscribe(t.Context(), "k"); !errors.Is(err, redis.ErrClosed) {
		t.Errorf("Subscribe after Close: %v, want redis.ErrClosed", err)
	}
	if err := l.Unsubscribe(t.Context(), "k"); err != nil {
		t.Errorf("Unsubscribe after Close: %v, want nil", err)
	}
}

func TestListenerReportsPossibleLossOnReconnect(t *testing.T) {
	b, _, srv := setup(t)
	l, n := listen(t, b)
	subscribe(t, l, "k")

	srv.Kill(t)
	n.expect(t, "") // the connection failed
	srv.Start(t)
	n.expect(t, "") // back and resubscribed: retry everything

	other := redislock.New(srv.Client(t))
	lockAndRelease(t, other, "k")
	n.expect(t, "k")
}

func TestSubscribeConfirmedAfterReconnect(t *testing.T) {
	b, rdb, srv := setup(t)
	l, n := listen(t, b)
	subscribe(t, l, "warm")

	// The SUBSCRIBE for k reaches a paused server that dies before running
	// it; go-redis sends it again on the new connection and that
	// confirmation must release the waiting Subscribe.
	if err := rdb.ClientPause(t.Context(), time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- l.Subscribe(context.Background(), "k") }()
	select {
	case err := <-done:
		t.Fatalf("Subscribe returned %v while the server was paused", err)
	case <-time.After(200 * time.Millisecond):
	}

	srv.Kill(t)
	srv.Start(t)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Subscribe after reconnect: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Subscribe still waiting 10s after the server came back")
	}

	lockAndRelease(t, redislock.New(srv.Client(t)), "k")
	n.expect(t, "k")
}

func TestListenRefusesDoneContext(t *testing.T) {
	b, _, _ := setup(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := b.Listen(ctx, func(string, string) {}); !errors.Is(err, context.Canceled) {
		t.Errorf("Listen with a cancelled context: %v, want context.Canceled", err)
	}
}

// halfOpen is a go-redis Dialer whose pub/sub connections can be made
// half-open: once cut, a connection that has written SUBSCRIBE or
// SSUBSCRIBE sends nothing and receives nothing, while its deadlines still
// run, as a TCP connection whose peer or middlebox vanished. Connections
// dialed later are healthy; command connections are never cut.
type halfOpen struct {
	mu    sync.Mutex
	conns []*halfOpenConn
}

func (h *halfOpen) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	hc := &halfOpenConn{Conn: c}
	h.mu.Lock()
	h.conns = append(h.conns, hc)
	h.mu.Unlock()
	return hc, nil
}

// cut makes every pub/sub connection dialed so far half-open and returns
// how many it cut.
func (h *halfOpen) cut() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, c := range h.conns {
		if c.pubsub.Load() {
			c.cut.Store(true)
			n++
		}
	}
	return n
}

type halfOpenConn struct {
	net.Conn
	pubsub atomic.Bool // it has written a subscribe command
	cut    atomic.Bool
}

func (c *halfOpenConn) Write(b []byte) (int, error) {
	if c.cut.Load() {
		return len(b), nil // lost on the way
	}
	if bytes.Contains(bytes.ToLower(b), []byte("subscribe")) {
		c.pubsub.Store(true)
	}
	return c.Conn.Write(b)
}

func (c *halfOpenConn) Read(b []byte) (int, error) {
	for {
		n, err := c.Conn.Read(b)
		if err != nil || !c.cut.Load() {
			return n, err
		}
		// Lost on the way: read on until the deadline.
	}
}

// heardWithin waits up to d for a notification of key or of "" (releases
// may have been missed), and reports whether one came.
func (n *notifications) heardWithin(key string, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case got := <-n.keys:
			if got == key || got == "" {
				return true
			}
		case <-timer.C:
			return false
		}
	}
}

// keyWithin waits up to d for a notification of key, skipping others, and
// reports whether one came.
func (n *notifications) keyWithin(key string, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case got := <-n.keys:
			if got == key {
				return true
			}
		case <-timer.C:
			return false
		}
	}
}

// halfOpenBound is the longest a release may go unnoticed on a half-open
// pub/sub connection: pingIdle + pongWait (3s), with room for a loaded
// machine.
const halfOpenBound = 10 * time.Second

// checkHalfOpenReplaced subscribes key on l, makes its pub/sub connection
// half-open (h), and checks that a release by other is noticed within
// halfOpenBound (fn(key) or fn("")), and that the release after it is
// heard as key's release: the connection was replaced and key subscribed
// on it again.
func checkHalfOpenReplaced(t *testing.T, l driver.Listener, n *notifications, h *halfOpen, other *redislock.Backend, key string) {
	t.Helper()
	subscribe(t, l, key)
	if h.cut() == 0 {
		t.Fatal("no pub/sub connection to cut")
	}
	released := time.Now()
	lockAndRelease(t, other, key)
	if !n.heardWithin(key, halfOpenBound) {
		t.Fatalf("a release on a half-open pub/sub connection went unnoticed for %v", halfOpenBound)
	}
	t.Logf("release noticed after %v", time.Since(released).Round(time.Millisecond))
	deadline := time.Now().Add(halfOpenBound)
	for {
		lockAndRelease(t, other, key)
		if n.keyWithin(key, 500*time.Millisecond) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no release of %q heard within %v of the half-open connection's replacement", key, halfOpenBound)
		}
	}
}

// TestHalfOpenPubSubConnectionIsReplaced checks the health check of the
// single-node listener: a pub/sub connection that goes half-open while the
// command connections work is found by its PING and replaced, the waiters
// are told that releases may have been missed, and key is heard again.
func TestHalfOpenPubSubConnectionIsReplaced(t *testing.T) {
	srv := testserver.StartRedis(t)
	h := &halfOpen{}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Dialer: h.dial})
	t.Cleanup(func() { _ = rdb.Close() })
	l, n := listen(t, redislock.New(rdb))
	checkHalfOpenReplaced(t, l, n, h, redislock.New(srv.Client(t)), "k")
}
