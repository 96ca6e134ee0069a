package redislock_test

// A request whose outcome is unknown to its caller (cancelled, or resent by
// go-redis after a read timeout) may reach Redis after everything that
// followed it: the caller's clean-up, another grant and its release. It
// must then grant nothing and queue nothing (late.lua).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// lateDialer dials Redis through connections that, once armed, hold the
// next write of an EVALSHA: the write reports success, and the bytes reach
// Redis only when the test calls deliver, after go-redis has given up on
// the connection. That is a request delayed on its way (a congested link,
// a proxy that stalls): it lands after what its caller did next.
type lateDialer struct {
	addr   string
	armed  atomic.Bool
	caught chan struct{} // a write was held
	// deaf, once set, lets the next EVALSHA write that armed does not hold
	// through, and loses its answer: the connection's reads fail from then
	// on, as if it broke after Redis ran the request.
	deaf atomic.Bool

	mu   sync.Mutex
	held *lateConn
	data []byte
}

func newLateDialer(addr string) *lateDialer {
	return &lateDialer{addr: addr, caught: make(chan struct{}, 1)}
}

// dial dials d.addr, or addr when d has none (a Cluster's nodes).
func (d *lateDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if d.addr != "" {
		addr = d.addr
	}
	var nd net.Dialer
	c, err := nd.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &lateConn{Conn: c, d: d}, nil
}

// awaitHeld waits until a write is held.
func (d *lateDialer) awaitHeld(t *testing.T) {
	t.Helper()
	select {
	case <-d.caught:
	case <-time.After(10 * time.Second):
		t.Fatal("no EVALSHA was held")
	}
}

// deliver sends the held write to Redis, waits for Redis's answer (so the
// script has run) and closes the connection.
func (d *lateDialer) deliver(t *testing.T) {
	t.Helper()
	d.mu.Lock()
	c, data := d.held, d.data
	d.held, d.data = nil, nil
	d.mu.Unlock()
	if c == nil {
		t.Fatal("nothing held")
	}
	defer c.Conn.Close()
	_ = c.Conn.SetDeadline(time.Time{}) // go-redis's have passed
	if _, err := c.Conn.Write(data); err != nil {
		t.Fatalf("delivering the held request: %v", err)
	}
	_ = c.Conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 4096)
	if n, err := c.Conn.Read(buf); n == 0 {
		t.Fatalf("no answer to the held request: %v", err)
	}
}

type lateConn struct {
	net.Conn
	d     *lateDialer
	mu    sync.Mutex
	holds bool // a write is held: deliver closes the connection
	deaf  atomic.Bool
}

func (c *lateConn) Read(b []byte) (int, error) {
	if c.deaf.Load() {
		return 0, os.ErrDeadlineExceeded // the answer is lost
	}
	return c.Conn.Read(b)
}

func (c *lateConn) Write(b []byte) (int, error) {
	if bytes.Contains(bytes.ToLower(b), []byte("evalsha")) && c.d.armed.CompareAndSwap(true, false) {
		c.mu.Lock()
		c.holds = true
		c.mu.Unlock()
		c.d.mu.Lock()
		c.d.held, c.d.data = c, bytes.Clone(b)
		c.d.mu.Unlock()
		c.d.caught <- struct{}{}
		return len(b), nil
	}
	if bytes.Contains(bytes.ToLower(b), []byte("evalsha")) && c.d.deaf.CompareAndSwap(true, false) {
		n, err := c.Conn.Write(b)
		c.deaf.Store(true)
		return n, err
	}
	return c.Conn.Write(b)
}

func (c *lateConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.holds {
		return nil // deliver closes it
	}
	return c.Conn.Close()
}

// lateClient returns a go-redis client with opts whose connections come
// from d.
func lateClient(t *testing.T, d *lateDialer, opts redis.Options) *redis.Client {
	t.Helper()
	opts.Addr, opts.Dialer = d.addr, d.dial
	rdb := redis.NewClient(&opts)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// lateSetup starts a Redis server and returns a client of it for the test's
// checks, a lateDialer, and a dlock Client (TTL 10s, no renewal) whose
// go-redis client, with opts, dials through it; the Client has taken and
// released a lock (warm) and is closed when the test ends.
func lateSetup(t *testing.T, opts redis.Options) (*redis.Client, *lateDialer, *dlock.Client) {
	t.Helper()
	srv := testserver.StartRedis(t)
	d := newLateDialer(srv.Addr())
	c := dlock.New(redislock.New(lateClient(t, d, opts)), dlock.WithTTL(10*time.Second), dlock.WithAutoRenew(false))
	t.Cleanup(func() { _ = c.Close() })
	warm(t, c)
	return srv.Client(t), d, c
}

// grantedNothing checks, once a late request has landed, that name is held
// by nobody and that its fence counter is still fence: the request made no
// grant. what names the grant it would have made.
// resentGrantLandsLate calls try (named what) while d holds back the first
// copy of its request, so that go-redis resends it and the resend is
// granted; it unlocks that grant, then lets the first copy land, and
// returns the grant's fence.
func resentGrantLandsLate(t *testing.T, d *lateDialer, what string, try func(context.Context) (*dlock.Lease, error)) uint64 {
	t.Helper()
	d.armed.Store(true)
	l, err := try(t.Context())
	if err != nil {
		t.Fatalf("%s (resent by go-redis): %v", what, err)
	}
	d.awaitHeld(t)
	fence := l.Fence()
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	d.deliver(t)
	return fence
}

func grantedNothing(t *testing.T, admin *redis.Client, name string, fence uint64, what string) {
	t.Helper()
	ctx := t.Context()
	if n, _ := admin.Exists(ctx, lockKey(name)).Result(); n != 0 {
		t.Errorf("%s: held by nobody", what)
	}
	if got, _ := admin.Get(ctx, lockKey(name)+":fence").Result(); got != strconv.FormatUint(fence, 10) {
		t.Errorf("fence counter %s after the late request, want %d (no new grant)", got, fence)
	}
}

// warm takes and releases a lock on c, so that the scripts are in Redis's
// cache and the pool has a connection.
func warm(t *testing.T, c *dlock.Client) {
	t.Helper()
	l, err := c.Mutex("late/warm").Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// A Fair waiter's acquire that lands after its caller gave up and cleaned
// up must not queue: a queue entry at the head would be handed the lock at
// the holder's release, and a live waiter refused until the entry lapsed.
func TestLateFairAcquireAfterCleanupQueuesNothing(t *testing.T) {
	srv := testserver.StartRedis(t)
	admin := srv.Client(t)
	d := newLateDialer(srv.Addr())
	rdb := lateClient(t, d, redis.Options{ContextTimeoutEnabled: true})
	ghost := dlock.New(redislock.New(rdb), dlock.WithTTL(10*time.Second))
	defer ghost.Close()
	holder := dlock.New(redislock.New(srv.Client(t)), dlock.WithTTL(10*time.Second))
	defer holder.Close()
	live := dlock.New(redislock.New(srv.Client(t)), dlock.WithTTL(10*time.Second))
	defer live.Close()
	warm(t, ghost)
	const name = "late/fair"
	ctx := t.Context()

	h, err := holder.Mutex(name).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d.armed.Store(true)
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	_, err = ghost.Mutex(name, dlock.Fair(), dlock.WithMetadata("ghost")).Lock(wctx)
	cancel()
	if err == nil {
		t.Fatal("the ghost's Lock succeeded")
	}
	d.awaitHeld(t)
	time.Sleep(300 * time.Millisecond) // the clean-up lands (it ran before Lock returned, unless Redis was slow)
	d.deliver(t)
	if n := zcard(t, admin, lockKey(name)+":q"); n != 0 {
		t.Errorf("the late acquire queued: %d queue entries, want 0", n)
	}

	type result struct {
		l   *dlock.Lease
		err error
	}
	got := make(chan result, 1)
	go func() {
		l, err := live.Mutex(name, dlock.Fair(), dlock.WithMetadata("live"), dlock.WithWait(20*time.Second)).Lock(ctx)
		got <- result{l, err}
	}()
	waitFor(t, func() bool { return zcard(t, admin, lockKey(name)+":q") >= 1 })
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if owner, _ := admin.HGet(ctx, lockKey(name), "owner").Result(); strings.HasSuffix(owner, "ghost") {
		t.Errorf("the holder's release handed the lock to the late request (owner %q)", owner)
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("live waiter: %v", r.err)
		}
		_ = r.l.Unlock(ctx)
	case <-time.After(4 * time.Second): // the ghost's entry would hold it up to 5s
		t.Fatal("the live waiter was not granted within 4s of the release")
	}
}

// A TryLock whose request lands after its clean-up must not be granted: a
// grant for the whole TTL that nobody holds.
func TestLateTryLockAfterCleanupGrantsNothing(t *testing.T) {
	srv := testserver.StartRedis(t)
	admin := srv.Client(t)
	d := newLateDialer(srv.Addr())
	rdb := lateClient(t, d, redis.Options{ContextTimeoutEnabled: true})
	ghost := dlock.New(redislock.New(rdb), dlock.WithTTL(10*time.Second))
	defer ghost.Close()
	other := dlock.New(redislock.New(srv.Client(t)), dlock.WithTTL(10*time.Second))
	defer other.Close()
	warm(t, ghost)
	const name = "late/try"
	ctx := t.Context()

	d.armed.Store(true)
	tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := ghost.Mutex(name).TryLock(tctx)
	cancel()
	if err == nil {
		t.Fatal("the ghost's TryLock succeeded")
	}
	d.awaitHeld(t)
	time.Sleep(300 * time.Millisecond) // the clean-up lands
	d.deliver(t)
	if n, _ := admin.Exists(ctx, lockKey(name)).Result(); n != 0 {
		owner, _ := admin.HGet(ctx, lockKey(name), "owner").Result()
		t.Errorf("the late TryLock was granted (owner %q): held by nobody", owner)
	}
	l, err := other.Mutex(name).TryLock(ctx)
	if err != nil {
		t.Fatalf("another Client's TryLock: %v", err)
	}
	_ = l.Unlock(ctx)
}

// go-redis sends a command again when its answer does not come within
// ReadTimeout; the resend is granted, the holder works and unlocks, and
// then the first copy lands: it must grant nothing (no fence drawn).
func TestLateFirstCopyOfResentAcquireGrantsNothing(t *testing.T) {
	admin, d, c := lateSetup(t, redis.Options{ReadTimeout: 300 * time.Millisecond, MaxRetries: 3})
	const name = "late/resent"
	fence := resentGrantLandsLate(t, d, "TryLock", c.Mutex(name).TryLock)
	grantedNothing(t, admin, name, fence, "the first copy of the resent acquire was granted after the Unlock")
}

// A release records nothing when every request of its grant reached Redis
// at the first try (no copy of them exists), but a re-entry that go-redis
// resent marks the grant for good: its first copy, landing after the last
// Unlock, grants nothing.
func TestLateFirstCopyOfResentReentryGrantsNothing(t *testing.T) {
	// The first grant (lateSetup's warm-up) went out twice, as an EVALSHA
	// that Redis refused for want of the script and then as an EVAL: the
	// refused copy never ran, so the request still counts as sent once.
	admin, d, c := lateSetup(t, redis.Options{ReadTimeout: 300 * time.Millisecond, MaxRetries: 3})
	ctx := t.Context()
	if n, _ := admin.Exists(ctx, lockKey("late/warm")+":late").Result(); n != 0 {
		t.Errorf("the release of a grant whose request was sent once wrote a late-request record")
	}

	const name = "late/reentry"
	m := c.Mutex(name, dlock.Reentrant())
	first, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d.armed.Store(true)
	again, err := m.Lock(ctx)
	if err != nil {
		t.Fatalf("re-entry (resent by go-redis): %v", err)
	}
	d.awaitHeld(t)
	fence := first.Fence()
	for _, l := range []*dlock.Lease{again, first} {
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := admin.Exists(ctx, lockKey(name)).Result(); n != 0 {
		t.Fatal("the lock is held after the last Unlock")
	}
	d.deliver(t)
	grantedNothing(t, admin, name, fence, "the first copy of the resent re-entry was granted after the last Unlock")
}

// A re-entry that go-redis resent, and whose second answer was lost too,
// has an unknown outcome: its resend ran (a hold that the handle's last
// Unlock drains), and its first copy is still on its way. That copy,
// landing after the last Unlock, grants nothing: the Backend never read an
// answer to the request, so its release may not skip it.
func TestLateFirstCopyOfReentryWithLostAnswersGrantsNothing(t *testing.T) {
	admin, d, c := lateSetup(t, redis.Options{ReadTimeout: 300 * time.Millisecond, MaxRetries: 1})
	ctx := t.Context()
	const name = "late/reentry-lost"
	m := c.Mutex(name, dlock.Reentrant())
	first, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fence := first.Fence()
	d.armed.Store(true) // the first copy held
	d.deaf.Store(true)  // the resend runs, its answer lost
	again, err := m.Lock(ctx)
	if err != nil {
		t.Fatalf("re-entry (tried again after an unknown outcome): %v", err)
	}
	d.awaitHeld(t)
	h, _ := admin.HGetAll(ctx, lockKey(name)).Result()
	if rids := strings.Fields(h["rid"]); len(rids) != 3 {
		t.Fatalf("the grant's requests %q, want 3 (the first, the resend whose answer was lost, the next try)", h["rid"])
	}
	for _, l := range []*dlock.Lease{again, first} {
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := admin.Exists(ctx, lockKey(name)).Result(); n != 0 {
		t.Fatal("the lock is held after the last Unlock drained it")
	}
	d.deliver(t)
	grantedNothing(t, admin, name, fence, "the first copy of the re-entry was granted after the last Unlock")
}

// A re-entry whose answer did not come (the request held on its way) is
// tried again by the handle, as a new request; the first request, landing
// after the last Unlock, grants nothing: the release records the request
// whose answer was lost, though it never reached the grant.
func TestLateReentryWithLostAnswerGrantsNothing(t *testing.T) {
	admin, d, c := lateSetup(t, redis.Options{ReadTimeout: 300 * time.Millisecond, MaxRetries: -1})
	lostReentryGrantsNothing(t, admin, d, c, "late/reentry-unanswered")
}

// lostReentryGrantsNothing takes name with a reentrant handle of c, re-enters
// it while d holds the re-entry's request (its answer never comes, and the
// handle tries again with a new one), unlocks both holds, and then lets the
// held request land: it must grant nothing.
func lostReentryGrantsNothing(t *testing.T, admin *redis.Client, d *lateDialer, c *dlock.Client, name string) {
	t.Helper()
	ctx := t.Context()
	m := c.Mutex(name, dlock.Reentrant())
	first, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fence := first.Fence()
	d.armed.Store(true)
	again, err := m.Lock(ctx)
	if err != nil {
		t.Fatalf("re-entry (tried again after an unknown outcome): %v", err)
	}
	d.awaitHeld(t)
	for _, l := range []*dlock.Lease{again, first} {
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := admin.Exists(ctx, lockKey(name)).Result(); n != 0 {
		t.Fatal("the lock is held after the last Unlock")
	}
	d.deliver(t)
	grantedNothing(t, admin, name, fence, "the re-entry whose answer was lost was granted after the last Unlock")
}

// A Fair waiter's request that go-redis resent queued it, and the lock was
// then handed to it; the first copy of that request, landing after the
// waiter's Unlock, grants nothing, though it never reached the grant.
func TestLateFirstCopyOfResentQueuedAcquireGrantsNothing(t *testing.T) {
	srv := testserver.StartRedis(t)
	admin := srv.Client(t)
	d := newLateDialer(srv.Addr())
	rdb := lateClient(t, d, redis.Options{ReadTimeout: 300 * time.Millisecond, MaxRetries: 3})
	waiter := dlock.New(redislock.New(rdb), dlock.WithTTL(10*time.Second), dlock.WithAutoRenew(false))
	defer waiter.Close()
	holder := dlock.New(redislock.New(srv.Client(t)), dlock.WithTTL(10*time.Second))
	defer holder.Close()
	warm(t, waiter)
	ctx := t.Context()
	const name = "late/queued"
	h, err := holder.Mutex(name).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d.armed.Store(true)
	type result struct {
		l   *dlock.Lease
		err error
	}
	got := make(chan result, 1)
	go func() {
		l, err := waiter.Mutex(name, dlock.Fair()).Lock(ctx)
		got <- result{l, err}
	}()
	d.awaitHeld(t)
	waitFor(t, func() bool { return zcard(t, admin, lockKey(name)+":q") >= 1 })
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("the waiter's Lock: %v", r.err)
	}
	fence := r.l.Fence()
	if err := r.l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _ := admin.Exists(ctx, lockKey(name)).Result(); n != 0 {
		t.Fatal("the lock is held after the waiter's Unlock")
	}
	d.deliver(t)
	grantedNothing(t, admin, name, fence, "the first copy of the waiter's resent request was granted after its Unlock")
}

// Two Clients with one owner ID hold one grant: the second re-entered the
// first's, by a request that go-redis resent. The first copy of that
// request, landing after both Unlock, grants nothing, whichever Client
// released last: the other Client's requests are not the last releaser's
// to vouch for.
func TestLateFirstCopyOfOtherClientsReentryGrantsNothing(t *testing.T) {
	srv := testserver.StartRedis(t)
	admin := srv.Client(t)
	d := newLateDialer(srv.Addr())
	rdb := lateClient(t, d, redis.Options{ReadTimeout: 300 * time.Millisecond, MaxRetries: 3})
	opts := []dlock.Option{dlock.WithTTL(10 * time.Second), dlock.WithAutoRenew(false)}
	a := dlock.New(redislock.New(srv.Client(t)), opts...)
	defer a.Close()
	b := dlock.New(redislock.New(rdb), opts...)
	defer b.Close()
	warm(t, b)
	ctx := t.Context()
	const name = "late/owner-id"
	lockOpts := []dlock.Option{dlock.Reentrant(), dlock.WithOwnerID("svc-late")}
	la, err := a.Mutex(name, lockOpts...).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d.armed.Store(true)
	lb, err := b.Mutex(name, lockOpts...).Lock(ctx)
	if err != nil {
		t.Fatalf("the other Client's re-entry (resent by go-redis): %v", err)
	}
	d.awaitHeld(t)
	fence := la.Fence()
	if lb.Fence() != fence {
		t.Fatalf("the other Client's fence %d, want the first's %d (one grant)", lb.Fence(), fence)
	}
	for _, l := range []*dlock.Lease{lb, la} {
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := admin.Exists(ctx, lockKey(name)).Result(); n != 0 {
		t.Fatal("the lock is held after both Unlock")
	}
	d.deliver(t)
	grantedNothing(t, admin, name, fence, "the first copy of the other Client's re-entry was granted after both Unlock")
}

// A reader's acquire that go-redis resent: its hold keeps no request id,
// so the release names the request, whose first copy, landing after the
// RUnlock, takes no hold.
func TestLateFirstCopyOfResentReaderAcquireHoldsNothing(t *testing.T) {
	admin, d, c := lateSetup(t, redis.Options{ReadTimeout: 300 * time.Millisecond, MaxRetries: 3})
	const name = "late/reader"
	ctx := t.Context()

	fence := resentGrantLandsLate(t, d, "TryRLock", c.RWMutex(name).TryRLock)
	if n, _ := admin.ZCard(ctx, lockKey(name)+":s").Result(); n != 0 {
		t.Errorf("the first copy of the resent reader acquire took a hold after the RUnlock: %d holds", n)
	}
	if got, _ := admin.Get(ctx, lockKey(name)+":fence").Result(); got != strconv.FormatUint(fence, 10) {
		t.Errorf("fence counter %s after the late copy, want %d (no new hold)", got, fence)
	}
}

// On a Cluster, a lock's keys and its late-request record share one hash
// slot: a TryLock whose request lands after its clean-up, and the first
// copy of an acquire that the ClusterClient resent, grant nothing there
// either.
func TestClusterLateAcquireGrantsNothing(t *testing.T) {
	_, cl := setupCluster(t)
	admin := cl.Client(t)
	ctx := t.Context()
	for _, resent := range []bool{false, true} {
		name := fmt.Sprintf("late/cluster-resent-%t", resent)
		d := newLateDialer("")
		opts := &redis.ClusterOptions{Addrs: cl.Addrs(), Dialer: d.dial, ContextTimeoutEnabled: !resent}
		if resent {
			opts.ReadTimeout = 300 * time.Millisecond
		}
		rdb := redis.NewClusterClient(opts)
		defer rdb.Close()
		c := dlock.New(redislock.New(rdb), dlock.WithTTL(10*time.Second), dlock.WithAutoRenew(false))
		defer c.Close()
		l, err := c.Mutex(name).TryLock(ctx) // scripts cached, the slot's node connected
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		fence, err := admin.Get(ctx, lockKey(name)+":fence").Result()
		if err != nil {
			t.Fatal(err)
		}

		d.armed.Store(true)
		if resent {
			l, err := c.Mutex(name).TryLock(ctx)
			if err != nil {
				t.Fatalf("TryLock (resent by go-redis): %v", err)
			}
			fence = strconv.FormatUint(l.Fence(), 10)
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		} else {
			tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			_, err := c.Mutex(name).TryLock(tctx)
			cancel()
			if err == nil {
				t.Fatal("TryLock succeeded with its request held")
			}
		}
		d.awaitHeld(t)
		time.Sleep(300 * time.Millisecond) // the clean-up lands
		d.deliver(t)
		if n, _ := admin.Exists(ctx, lockKey(name)).Result(); n != 0 {
			t.Errorf("resent=%t: the late request was granted: held by nobody", resent)
		}
		if got, _ := admin.Get(ctx, lockKey(name)+":fence").Result(); got != fence {
			t.Errorf("resent=%t: fence counter %s after the late request, want %s", resent, got, fence)
		}
	}
}

// waitFor polls cond for up to 10s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met within 10s")
}

// A reentrant handle keeps its token for life. When its last Unlock drains
// an uncertain grant that the store lost (force release, failover), the
// untied release finds nothing and records the token as cleaned up, as a
// clean-up would (the store cannot tell them apart): the handle's next
// TryLock of the free lock may then be refused for up to lateTTL (5 s, as
// docs/SAFETY.md says), but a Lock that waits longer gets it: the handle is
// never locked out past the record's life.
func TestReentrantHandleRelocksAfterDrainOfLostGrant(t *testing.T) {
	srv := testserver.StartRedis(t)
	b := &drainRaceBackend{Backend: redislock.New(srv.Client(t))}
	c := dlock.New(b, dlock.WithTTL(10*time.Second))
	defer c.Close()
	ctx := t.Context()
	const name = "late/reentrant-drain"
	m := c.Mutex(name, dlock.Reentrant())
	first, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b.loseNext.Store(true)
	if _, err := m.Lock(ctx); err == nil {
		t.Fatal("the re-entry whose answer was lost succeeded")
	}
	// The grant is uncertain: its last Unlock drains. The store loses it.
	if _, _, err := b.ForceRelease(ctx, name); err != nil {
		t.Fatal(err)
	}
	if err := first.Unlock(ctx); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Unlock of the lost grant: %v, want ErrNotHeld", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 3*redislock.LateTTL)
	defer cancel()
	l, err := m.Lock(wctx)
	if err != nil {
		t.Fatalf("the handle's Lock of the free lock, with %v to wait: %v", 3*redislock.LateTTL, err)
	}
	_ = l.Unlock(ctx)
}

// An all-at-once acquire (AcquireAll) that lands after its caller gave up
// and released its token on every name must grant none of them.
func TestLateAcquireAllAfterCleanupGrantsNothing(t *testing.T) {
	srv := testserver.StartRedis(t)
	admin := srv.Client(t)
	d := newLateDialer(srv.Addr())
	rdb := lateClient(t, d, redis.Options{ContextTimeoutEnabled: true})
	ghost := dlock.New(redislock.New(rdb), dlock.WithTTL(10*time.Second))
	defer ghost.Close()
	ctx := t.Context()
	names := []string{"{late}a", "{late}b"}
	ml, err := ghost.MultiAtOnce([]string{"{late}warm1", "{late}warm2"}).TryLock(ctx) // the script in the cache
	if err != nil {
		t.Fatal(err)
	}
	if err := ml.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	d.armed.Store(true)
	tctx, cancel := context.WithTimeout(ctx, time.Second)
	_, err = ghost.MultiAtOnce(names).TryLock(tctx)
	cancel()
	if err == nil {
		t.Fatal("the ghost's TryLock succeeded")
	}
	d.awaitHeld(t)
	time.Sleep(300 * time.Millisecond) // the clean-up lands
	d.deliver(t)
	for _, name := range names {
		if n, err := admin.Exists(ctx, lockKey(name)).Result(); err != nil || n != 0 {
			t.Errorf("%q after the late AcquireAll: EXISTS = %d, %v; want 0 (nothing granted)", name, n, err)
		}
	}
}

// go-redis resent a TryLock after ReadTimeout and the resend was refused
// (the lock was held); the holder then unlocks, and the first copy lands:
// it must grant nothing, though no grant or clean-up of its token exists.
func TestLateFirstCopyOfResentRefusedAcquireGrantsNothing(t *testing.T) {
	srv := testserver.StartRedis(t)
	admin := srv.Client(t)
	d := newLateDialer(srv.Addr())
	rdb := lateClient(t, d, redis.Options{ReadTimeout: 300 * time.Millisecond, MaxRetries: 3})
	c := dlock.New(redislock.New(rdb), dlock.WithTTL(10*time.Second), dlock.WithAutoRenew(false))
	defer c.Close()
	holder := dlock.New(redislock.New(srv.Client(t)), dlock.WithTTL(10*time.Second))
	defer holder.Close()
	warm(t, c)
	const name = "late/resent-refused"
	ctx := t.Context()
	h, err := holder.Mutex(name).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fence := h.Fence()
	d.armed.Store(true)
	if _, err := c.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock of a held lock (resent by go-redis): %v, want ErrNotObtained", err)
	}
	d.awaitHeld(t)
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	d.deliver(t)
	grantedNothing(t, admin, name, fence, "the first copy of the resent, refused acquire was granted after the holder's Unlock")
}

// With WithReplicaAck, as without: a reentrant handle's re-entry whose
// answer was lost, tried again as a new request, lands after the last
// Unlock and grants nothing.
func TestLateReentryWithLostAnswerGrantsNothingWithReplicaAck(t *testing.T) {
	set := testserver.StartSentinel(t)
	admin := set.Primary(t).Client(t)
	d := newLateDialer("")
	opts := set.FailoverOptions()
	opts.Dialer, opts.ReadTimeout, opts.MaxRetries = d.dial, 300*time.Millisecond, -1
	rdb := redis.NewFailoverClient(opts)
	defer rdb.Close()
	c := dlock.New(redislock.New(rdb, redislock.WithReplicaAck(1, 2*time.Second)), dlock.WithTTL(10*time.Second), dlock.WithAutoRenew(false))
	defer c.Close()
	warm(t, c)
	lostReentryGrantsNothing(t, admin, d, c, "late/reentry-unanswered-acked")
}

// A MultiAtOnce TryLock that go-redis resent and whose resend was refused
// (one of the locks held): its first copy, landing after the holder's
// release, grants nothing.
func TestLateFirstCopyOfResentRefusedAcquireAllGrantsNothing(t *testing.T) {
	srv := testserver.StartRedis(t)
	admin := srv.Client(t)
	d := newLateDialer(srv.Addr())
	rdb := lateClient(t, d, redis.Options{ReadTimeout: 300 * time.Millisecond, MaxRetries: 3})
	c := dlock.New(redislock.New(rdb), dlock.WithTTL(10*time.Second), dlock.WithAutoRenew(false))
	defer c.Close()
	holder := dlock.New(redislock.New(srv.Client(t)), dlock.WithTTL(10*time.Second))
	defer holder.Close()
	ctx := t.Context()
	names := []string{"{late2}a", "{late2}b"}
	ml, err := c.MultiAtOnce([]string{"{late2}warm1", "{late2}warm2"}).TryLock(ctx) // the script in the cache
	if err != nil {
		t.Fatal(err)
	}
	if err := ml.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	h, err := holder.Mutex(names[1]).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d.armed.Store(true)
	if _, err := c.MultiAtOnce(names).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock of a held lock (resent by go-redis): %v, want ErrNotObtained", err)
	}
	d.awaitHeld(t)
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	d.deliver(t)
	for _, name := range names {
		if n, err := admin.Exists(ctx, lockKey(name)).Result(); err != nil || n != 0 {
			t.Errorf("%q after the first copy of the resent, refused AcquireAll: EXISTS = %d, %v; want 0 (nothing granted)", name, n, err)
		}
	}
}

// A reentrant handle's Fair Lock whose acquire got no answer before its
// wait ended withdraws its token (its token outlives the call, so no
// clean-up release); that acquire, landing after the withdrawal, grants
// nothing: the lock is not held by a handle no goroutine holds it with.
func TestLateReentrantFairAcquireAfterWithdrawalGrantsNothing(t *testing.T) {
	admin, d, c := lateSetup(t, redis.Options{ContextTimeoutEnabled: true, MaxRetries: -1})
	ctx := t.Context()
	const name = "late/reentrant-withdrawn"
	d.armed.Store(true)
	tctx, cancel := context.WithTimeout(ctx, time.Second)
	_, err := c.Mutex(name, dlock.Reentrant(), dlock.Fair()).Lock(tctx)
	cancel()
	if err == nil {
		t.Fatal("the Lock whose acquire was held succeeded")
	}
	d.awaitHeld(t)
	waitFor(t, func() bool {
		n, _ := admin.Exists(ctx, lockKey(name)+":late").Result()
		return n == 1 // the withdrawal landed
	})
	d.deliver(t)
	if n, _ := admin.Exists(ctx, lockKey(name)).Result(); n != 0 {
		t.Errorf("the acquire that landed after the withdrawal was granted: held by nobody")
	}
}
