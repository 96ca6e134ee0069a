package redlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/redlock"
)

// TestQuorumMissIsTransientWhenItsFailuresMayHeal checks which quorum
// misses a waiting Lock may ride out: nodes that did not answer in time
// heal; nodes holding a foreign value do not, and once they leave no
// quorum the miss is not transient. A cancelled caller's miss never is.
func TestQuorumMissIsTransientWhenItsFailuresMayHeal(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	const timeout = 300 * time.Millisecond
	silent := func() redis.UniversalClient { return clientFor(t, silentNode(t), timeout) }

	// Two nodes that do not answer within the node timeout.
	b := backendOn(t, []redis.UniversalClient{silent(), servers[0].Client(t), silent()}, redlock.WithNodeTimeout(timeout))
	_, err := b.Acquire(t.Context(), request(t, "slow", 10*time.Second))
	var qe *redlock.QuorumError
	if !errors.As(err, &qe) || !driver.IsTransient(err) {
		t.Errorf("Acquire with 2 of 3 nodes silent = %v (transient %v), want a transient *QuorumError", err, driver.IsTransient(err))
	}
	if _, err := b.Renew(t.Context(), "slow", "t", time.Second); !driver.IsTransient(err) {
		t.Errorf("Renew with 2 of 3 nodes silent = %v, want transient", err)
	}

	// One foreign value and one silent node: the two live nodes could
	// still agree once the silent one answers.
	for _, n := range nodes[:2] {
		if err := n.Set(t.Context(), lockKey("foreign"), "x", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	b = backendOn(t, []redis.UniversalClient{servers[0].Client(t), servers[2].Client(t), silent()}, redlock.WithNodeTimeout(timeout))
	_, err = b.Acquire(t.Context(), request(t, "foreign", 10*time.Second))
	if !errors.Is(err, redislock.ErrForeignValue) || !driver.IsTransient(err) {
		t.Errorf("Acquire with one foreign value and one silent node = %v (transient %v), want a transient miss naming the foreign value", err, driver.IsTransient(err))
	}

	// Two foreign values of three: no quorum can ever agree.
	b = newBackend(t, servers)
	_, err = b.Acquire(t.Context(), request(t, "foreign", 10*time.Second))
	if !errors.Is(err, redislock.ErrForeignValue) || driver.IsTransient(err) {
		t.Errorf("Acquire with 2 of 3 foreign values = %v (transient %v), want a miss that is not transient", err, driver.IsTransient(err))
	}

	// The caller's own cancellation.
	b = backendOn(t, []redis.UniversalClient{silent(), servers[0].Client(t), silent()}, redlock.WithNodeTimeout(timeout))
	ctx, cancel := context.WithTimeout(t.Context(), timeout/3)
	defer cancel()
	if _, err := b.Acquire(ctx, request(t, "cut", 10*time.Second)); err == nil || driver.IsTransient(err) {
		t.Errorf("Acquire whose caller's deadline passed = %v, want an error that is not transient", err)
	}
}

// stallNodes runs a Lua busy loop of d on each of nodes at once, from
// connections of their own, every period until stop is closed: the nodes
// answer nothing meanwhile, as nodes of a loaded machine may not in time.
func stallNodes(t *testing.T, nodes []*redis.Client, d, period time.Duration, stop <-chan struct{}) *sync.WaitGroup {
	t.Helper()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			var stalls sync.WaitGroup
			for _, n := range nodes {
				stalls.Add(1)
				go func() {
					defer stalls.Done()
					_ = n.Eval(context.Background(), `
local t = redis.call('TIME')
local stop = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[1])
repeat
  t = redis.call('TIME')
until tonumber(t[1]) * 1000000 + tonumber(t[2]) >= stop
return 1`, nil, d.Microseconds()).Err()
				}()
			}
			stalls.Wait()
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	return &wg
}

// TestLockRidesOutTransientQuorumMisses has 30 goroutines Lock one name
// with 10 s waits on a 3-node Redlock whose nodes stall now and then (two
// of three at once, longer than the node timeout): a stall costs an
// attempt its quorum, and no Lock may fail before its wait has ended.
func TestLockRidesOutTransientQuorumMisses(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	clients := make([]redis.UniversalClient, len(servers))
	for i, srv := range servers {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		clients[i] = c
	}
	b := backendOn(t, clients)
	_ = b.Ping(t.Context())
	c := dlock.New(b)
	defer c.Close()

	stop := make(chan struct{})
	stalls := stallNodes(t, nodes[1:], 150*time.Millisecond, 250*time.Millisecond, stop)
	defer stalls.Wait()
	defer close(stop)

	const workers, wait = 30, 10 * time.Second
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			l, err := c.Mutex("hot", dlock.WithTTL(2*time.Second), dlock.WithWait(wait)).Lock(t.Context())
			if err != nil {
				if took := time.Since(start); took < wait {
					errs <- errors.New("Lock failed after " + took.Round(time.Millisecond).String() + " of its " + wait.String() + " wait: " + err.Error())
				}
				return
			}
			time.Sleep(5 * time.Millisecond)
			_ = l.Unlock(context.Background()) // a stalled release leaves the lock to its TTL
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
