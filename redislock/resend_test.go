package redislock_test

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redislock"
	"github.com/redis/go-redis/v9"
)

// cutProxy forwards connections to a Redis server. When armed, it lets the
// next request through to Redis, which runs it, and then closes the
// client's connection instead of forwarding the reply: the fault of a fork
// stall, a proxy reset or a failover at the worst moment, after which
// go-redis sends the same command again on a new connection.
type cutProxy struct {
	ln    net.Listener
	to    string
	armed atomic.Bool
	cuts  atomic.Int32
	wg    sync.WaitGroup
}

func startCutProxy(t *testing.T, to string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, to: to}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.wg.Wait()
	})
	return p
}

func (p *cutProxy) addr() string { return p.ln.Addr().String() }

func (p *cutProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.to)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.wg.Add(2)
		go func() { // client → server
			defer p.wg.Done()
			_, _ = io.Copy(s, c)
			_ = s.Close()
		}()
		go func() { // server → client, unless armed: then cut
			defer p.wg.Done()
			defer c.Close()
			defer s.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 {
					if p.armed.CompareAndSwap(true, false) {
						p.cuts.Add(1)
						return // the reply is lost with the connection
					}
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// A command whose connection is cut after Redis ran it is sent again by
// go-redis (MaxRetries, 3 by default). Every script must answer the resend
// as it answered the first run.
func TestResentScriptsAnswerAsTheFirstRun(t *testing.T) {
	srv := testserver.StartRedis(t)
	admin := srv.Client(t)
	proxy := startCutProxy(t, srv.Addr())
	// One connection, so that nothing else is in flight when the proxy cuts.
	rdb := redis.NewClient(&redis.Options{Addr: proxy.addr(), PoolSize: 1, MaxRetries: 3})
	defer rdb.Close()
	// Connected before the first cut, so that a cut hits a script's reply,
	// not the connection's handshake.
	if err := rdb.Ping(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	c := dlock.New(redislock.New(rdb), dlock.WithAutoRenew(false), dlock.WithTTL(10*time.Second))
	defer c.Close()
	other := dlock.New(redislock.New(srv.Client(t)))
	defer other.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// The scripts in Redis's cache, so that a cut hits a script's run, not
	// a NOSCRIPT answer.
	warm, err := c.Mutex("resend/warm").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	cut := func(what string, fn func() error) error {
		t.Helper()
		before := proxy.cuts.Load()
		proxy.armed.Store(true)
		err := fn()
		proxy.armed.Store(false)
		if proxy.cuts.Load() != before+1 {
			t.Fatalf("%s: the proxy did not cut the reply", what)
		}
		return err
	}

	// TryLock: the first run granted; the resend must get the same grant,
	// not "held by" its own owner.
	var l *dlock.Lease
	if err := cut("TryLock", func() (err error) { l, err = c.Mutex("resend/try").TryLock(ctx); return err }); err != nil {
		t.Fatalf("TryLock whose reply was lost: %v", err)
	}
	if l.Fence() != 1 {
		t.Errorf("fence %d, want 1 (the first run's grant)", l.Fence())
	}
	// Unlock: the first run released; the resend must report the release,
	// not a lost lease.
	if err := cut("Unlock", func() error { return l.Unlock(ctx) }); err != nil {
		t.Fatalf("Unlock whose reply was lost: %v", err)
	}
	if n, _ := admin.Exists(ctx, "dlock:{resend/try}").Result(); n != 0 {
		t.Errorf("the lock is still on Redis after Unlock")
	}

	// Re-entry: counted once, so that the last Unlock frees the lock.
	m := c.Mutex("resend/reentrant", dlock.Reentrant())
	first, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var second *dlock.Lease
	if err := cut("re-entry", func() (err error) { second, err = m.Lock(ctx); return err }); err != nil {
		t.Fatalf("re-entry whose reply was lost: %v", err)
	}
	if holds, _ := admin.HGet(ctx, "dlock:{resend/reentrant}", tokenOf(t, admin, "dlock:{resend/reentrant}")).Int(); holds != 2 {
		t.Errorf("hold count after two Locks = %d, want 2", holds)
	}
	if err := cut("Unlock of a re-entry", func() error { return second.Unlock(ctx) }); err != nil {
		t.Fatalf("Unlock of a re-entry whose reply was lost: %v", err)
	}
	if err := first.Unlock(ctx); err != nil {
		t.Fatalf("last Unlock: %v", err)
	}
	if n, _ := admin.Exists(ctx, "dlock:{resend/reentrant}").Result(); n != 0 {
		t.Errorf("the lock outlives its last Unlock")
	}

	// A semaphore permit (a shared hold) and its release.
	var p *dlock.Lease
	if err := cut("Acquire", func() (err error) { p, err = c.Semaphore("resend/sem", 2).Acquire(ctx); return err }); err != nil {
		t.Fatalf("Acquire whose reply was lost: %v", err)
	}
	if err := cut("permit Unlock", func() error { return p.Unlock(ctx) }); err != nil {
		t.Fatalf("permit Unlock whose reply was lost: %v", err)
	}
	if n, _ := admin.ZCard(ctx, "dlock:{resend/sem}:s").Result(); n != 0 {
		t.Errorf("%d permits held after Unlock", n)
	}

	// Nothing was stranded: others get every lock at once.
	for _, name := range []string{"resend/try", "resend/reentrant"} {
		l, err := other.Mutex(name).TryLock(ctx)
		if err != nil {
			t.Fatalf("TryLock(%q) by another Client: %v", name, err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// tokenOf returns the holder's token of the lock hash key: the field that
// is not one of the hash's own.
func tokenOf(t *testing.T, rdb *redis.Client, key string) string {
	t.Helper()
	fields, err := rdb.HKeys(t.Context(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fields {
		switch f {
		case "owner", "fence", "at", "delay", "exp", "rid", "rrid":
		default:
			return f
		}
	}
	t.Fatalf("no holder in %s: %v", key, fields)
	return ""
}

// slowProxy is cutProxy whose reconnection after a cut waits a while:
// go-redis's resend comes late (a read timeout, a slow dial).
type slowProxy struct {
	ln    net.Listener
	to    string
	armed atomic.Bool
	slow  atomic.Bool
	cuts  atomic.Int32
	wg    sync.WaitGroup
}

func startSlowProxy(t *testing.T, to string) *slowProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &slowProxy{ln: ln, to: to}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() { _ = ln.Close(); p.wg.Wait() })
	return p
}

func (p *slowProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.slow.CompareAndSwap(true, false) {
			time.Sleep(500 * time.Millisecond)
		}
		s, err := net.Dial("tcp", p.to)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.wg.Add(2)
		go func() { defer p.wg.Done(); _, _ = io.Copy(s, c); _ = s.Close() }()
		go func() {
			defer p.wg.Done()
			defer c.Close()
			defer s.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 {
					if p.armed.CompareAndSwap(true, false) {
						p.cuts.Add(1)
						p.slow.Store(true)
						return
					}
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// Two processes share an owner ID; the first's Unlock is resent by
// go-redis after the second, woken by the release, got the lock: the resend
// must not drop the second's grant (it did: two holders).
func TestResentUnlockOwnerIDKeepsNextHolder(t *testing.T) {
	srv := testserver.StartRedis(t)
	proxy := startSlowProxy(t, srv.Addr())
	rdb1 := redis.NewClient(&redis.Options{Addr: proxy.ln.Addr().String(), PoolSize: 1, MaxRetries: 3})
	defer rdb1.Close()
	if err := rdb1.Ping(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	ttl := 6 * time.Second
	c1 := dlock.New(redislock.New(rdb1), dlock.WithTTL(ttl))
	defer c1.Close()
	c2 := dlock.New(redislock.New(srv.Client(t)), dlock.WithTTL(ttl))
	defer c2.Close()
	c3 := dlock.New(redislock.New(srv.Client(t)), dlock.WithTTL(ttl))
	defer c3.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	const name = "resend/ownerid"
	warm, err := c1.Mutex("resend/warm").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l1, err := c1.Mutex(name, dlock.WithOwnerID("svc-1")).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got2 := make(chan *dlock.Lease, 1)
	go func() {
		l, err := c2.Mutex(name, dlock.WithOwnerID("svc-1")).Lock(ctx)
		t.Logf("%s c2 Lock returned", time.Now().Format("15:04:05.000"))
		if err != nil {
			t.Errorf("c2 Lock: %v", err)
		}
		got2 <- l
	}()
	time.Sleep(200 * time.Millisecond)
	proxy.armed.Store(true)
	t.Logf("%s c1 Unlock", time.Now().Format("15:04:05.000"))
	err = l1.Unlock(ctx)
	t.Logf("%s c1 Unlock returned", time.Now().Format("15:04:05.000"))
	t.Logf("c1 Unlock (cut, resent 500ms later): %v; cuts=%d", err, proxy.cuts.Load())
	l2 := <-got2
	if l2 == nil {
		t.Fatal("c2 got nothing")
	}
	t.Logf("c2 holds fence %d, lease err %v", l2.Fence(), l2.Err())
	l3, err := c3.Mutex(name).TryLock(ctx)
	if err == nil {
		t.Errorf("SAFETY: c3 got the lock (fence %d) while c2 holds fence %d (c2 lease err: %v)", l3.Fence(), l2.Fence(), l2.Err())
	} else {
		t.Logf("c3 TryLock: %v", err)
	}
}

// One Client, one reentrant handle used by two goroutines: the first's
// Unlock is resent after the second took the lock again with the same
// token, which must keep it.
func TestResentUnlockReentrantKeepsNextHolder(t *testing.T) {
	srv := testserver.StartRedis(t)
	proxy := startSlowProxy(t, srv.Addr())
	rdb1 := redis.NewClient(&redis.Options{Addr: proxy.ln.Addr().String(), PoolSize: 4, MinIdleConns: 2, MaxRetries: 3,
		MinRetryBackoff: 500 * time.Millisecond, MaxRetryBackoff: 500 * time.Millisecond})
	defer rdb1.Close()
	ttl := 6 * time.Second
	c1 := dlock.New(redislock.New(rdb1), dlock.WithTTL(ttl))
	defer c1.Close()
	c3 := dlock.New(redislock.New(srv.Client(t)), dlock.WithTTL(ttl))
	defer c3.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	const name = "resend/reentrant"
	warm, err := c1.Mutex("resend/warm").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // idle conns dialled
	h := c1.Mutex(name, dlock.Reentrant())
	l1, err := h.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got2 := make(chan *dlock.Lease, 1)
	go func() {
		time.Sleep(150 * time.Millisecond) // inside the window before the resend
		l, err := h.Lock(ctx)
		if err != nil {
			t.Errorf("second Lock: %v", err)
		}
		got2 <- l
	}()
	proxy.armed.Store(true)
	t0 := time.Now()
	err = l1.Unlock(ctx)
	t.Logf("unlock took %v", time.Since(t0))
	t.Logf("first Unlock (cut, resent ~500ms later): %v; cuts=%d", err, proxy.cuts.Load())
	l2 := <-got2
	if l2 == nil {
		t.Fatal("no second lease")
	}
	t.Logf("second lease: fence %d, holds err %v", l2.Fence(), l2.Err())
	l3, err := c3.Mutex(name).TryLock(ctx)
	if err == nil {
		t.Errorf("SAFETY: another Client got the lock (fence %d) while the reentrant handle holds fence %d (its lease err: %v)", l3.Fence(), l2.Fence(), l2.Err())
	} else {
		t.Logf("other TryLock: %v", err)
	}
}
