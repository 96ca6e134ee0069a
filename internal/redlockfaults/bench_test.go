package redlockfaults_test

// Benchmarks of one uncontended Lock+Unlock cycle (one Client, one name) on
// one Redis node and on Redlock with 3 and 5 nodes, where every node, the
// single one included, sits behind a proxy, so that the comparison is fair
// (the -direct variants, without proxies, show what the proxies cost):
//
//	go test -run XXX -bench . -benchtime 2s ./internal/redlockfaults/
//
// Besides ns/op, each reports lock-ns/op and unlock-ns/op, the mean time of
// the two halves of the cycle. The -slow variants delay every answer of one
// node by 50ms (as long as the default node timeout, so that node misses
// every deadline) or 30ms (within it): an acquire is decided at quorum and
// should not notice, but a release waits for every node.

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/redlock"
)

func BenchmarkCycle(b *testing.B) {
	b.Run("one-node-direct", func(b *testing.B) {
		srv := testserver.StartRedis(b)
		benchCycle(b, redislock.New(newClient(b, srv.Addr())))
	})
	b.Run("one-node", func(b *testing.B) {
		ns := startNodes(b, 1)
		benchCycle(b, redislock.New(ns.client(b, 0)))
	})
	b.Run("redlock-5-direct", func(b *testing.B) {
		clients := make([]redis.UniversalClient, 5)
		for i := range clients {
			clients[i] = newClient(b, testserver.StartRedis(b).Addr())
		}
		backend, err := redlock.New(clients)
		if err != nil {
			b.Fatal(err)
		}
		benchCycle(b, backend)
	})
	for _, v := range []struct {
		name  string
		nodes int
		slow  time.Duration // latency added to node 0
	}{
		{"redlock-3", 3, 0},
		{"redlock-5", 5, 0},
		{"redlock-3-slow", 3, 50 * time.Millisecond},
		{"redlock-5-slow", 5, 50 * time.Millisecond},
		{"redlock-5-slow30", 5, 30 * time.Millisecond},
	} {
		b.Run(v.name, func(b *testing.B) {
			ns := startNodes(b, v.nodes)
			if v.slow > 0 {
				ns.proxies[0].Latency(b, v.slow)
			}
			benchCycle(b, ns.redlock(b))
		})
	}
}

// benchCycle runs Lock+Unlock of one name with one Client on backend and
// reports the mean time of each half.
func benchCycle(b *testing.B, backend driver.Backend) {
	c := dlock.New(backend)
	defer c.Close()
	ctx := context.Background()
	m := c.Mutex("bench/cycle")
	// Warm up: connections to every node, scripts loaded.
	for range 3 {
		l, err := m.Lock(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
	var lock, unlock time.Duration
	n := 0
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		l, err := m.Lock(ctx)
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := l.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
		lock += t1.Sub(t0)
		unlock += time.Since(t1)
		n++
	}
	b.StopTimer()
	b.ReportMetric(float64(lock.Nanoseconds())/float64(n), "lock-ns/op")
	b.ReportMetric(float64(unlock.Nanoseconds())/float64(n), "unlock-ns/op")
}
