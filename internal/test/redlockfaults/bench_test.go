package redlockfaults_test

// Benchmarks of one uncontended Lock+Unlock cycle (one Client, one name) on
// one Redis node and on Redlock with 3 and 5 nodes, where every node, the
// single one included, sits behind a proxy, so that the comparison is fair
// (the -direct variants, without proxies, show what the proxies cost):
//
//	go test -run XXX -bench . -benchtime 2s ./internal/test/redlockfaults/
//
// Besides ns/op, each reports lock-ns/op and unlock-ns/op, the mean time of
// the two halves of the cycle. The -slow variants delay every answer of one
// node by 50ms (as long as the default node timeout, so that node misses
// every deadline) or 30ms (within it): an acquire is decided at quorum and
// should not notice, and a release waits for the late nodes only as long as
// the quorum took. raw-quorum-N is the floor of any quorum lock here: SET NX
// PX and compare-and-delete on N nodes at once, each half done at quorum.
// The net1ms variants put every node 1ms away, so that the network, not
// this machine's cores, sets the pace (run them with -benchtime 300x).

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
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
	for _, n := range []int{1, 5} {
		b.Run(fmt.Sprintf("raw-quorum-%d", n), func(b *testing.B) {
			ns := startNodes(b, n)
			clients := make([]*redis.Client, n)
			for i := range clients {
				clients[i] = ns.client(b, i)
			}
			benchRawQuorum(b, clients)
		})
	}
	// On a network: every node 1ms away (toxiproxy's finest step), as
	// nodes on other machines would be; there the round trip, not this
	// machine's two cores, sets the pace, and a quorum of parallel calls
	// should cost about one call.
	for _, v := range []struct {
		name  string
		nodes int
		slow  time.Duration // latency of node 0 instead of 1ms
		raw   bool          // the raw quorum instead of dlock
	}{
		{"net1ms/one-node", 1, 0, false},
		{"net1ms/raw-quorum-1", 1, 0, true},
		{"net1ms/redlock-5", 5, 0, false},
		{"net1ms/raw-quorum-5", 5, 0, true},
		{"net1ms/redlock-5-slow", 5, 50 * time.Millisecond, false},
	} {
		b.Run(v.name, func(b *testing.B) {
			ns := startNodes(b, v.nodes)
			for i := range v.nodes {
				ns.proxies[i].Latency(b, time.Millisecond)
			}
			if v.slow > 0 {
				ns.proxies[0].Latency(b, v.slow)
			}
			switch {
			case v.raw:
				clients := make([]*redis.Client, v.nodes)
				for i := range clients {
					clients[i] = ns.client(b, i)
				}
				benchRawQuorum(b, clients)
			case v.nodes == 1:
				benchCycle(b, redislock.New(ns.client(b, 0)))
			default:
				benchCycle(b, ns.redlock(b))
			}
		})
	}
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

// rawRelease is the compare-and-delete every hand-written Redis lock uses.
var rawRelease = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// benchRawQuorum is the floor of any quorum lock on this machine: SET NX PX
// on every node at once, go on when a quorum said yes, then
// compare-and-delete on every node at once and go on when a quorum is done.
// No fences, no notifications, no renewal, no clean-up of a lost attempt.
func benchRawQuorum(b *testing.B, clients []*redis.Client) {
	ctx := context.Background()
	q := len(clients)/2 + 1
	quorum := func(op func(c *redis.Client) bool) bool {
		ok := make(chan bool, len(clients))
		for _, c := range clients {
			go func() { ok <- op(c) }()
		}
		yes, no := 0, 0
		for yes < q && no <= len(clients)-q {
			if <-ok {
				yes++
			} else {
				no++
			}
		}
		return yes >= q
	}
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		// A key per cycle: the late nodes of the last cycle may still be
		// releasing theirs.
		key := "raw/" + strconv.Itoa(i)
		i++
		if !quorum(func(c *redis.Client) bool {
			ok, err := c.SetNX(ctx, key, "token", 10*time.Second).Result()
			return err == nil && ok
		}) {
			b.Fatal("raw SET NX lost the quorum")
		}
		quorum(func(c *redis.Client) bool {
			return rawRelease.Run(ctx, c, []string{key}, "token").Err() == nil
		})
	}
}
