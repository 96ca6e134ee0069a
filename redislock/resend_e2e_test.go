package redislock_test

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

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
