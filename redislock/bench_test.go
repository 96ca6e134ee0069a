package redislock_test

// Benchmarks of a full Lock+Unlock cycle on a real redis-server, each next to a
// raw baseline on the same server in the same run:
//
//	go test -run XXX -bench . -benchtime 3s ./redislock/
//
// Uncontended: dlock's cycle against SET NX PX + a compare-and-delete script.
// Contended: N owners (each with a Client of its own, as N processes) on one
// name, against N raw loops that spin on SET NX PX without sleeping.

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

var compareAndDelete = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)

func BenchmarkMutexUncontended(b *testing.B) {
	srv := testserver.StartRedis(b)
	c := dlock.New(redislock.New(srv.Client(b)))
	defer c.Close()
	ctx := context.Background()
	m := c.Mutex("bench/uncontended")
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		l, err := m.Lock(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRawUncontended(b *testing.B) {
	srv := testserver.StartRedis(b)
	rdb := srv.Client(b)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		ok, err := rdb.SetNX(ctx, "raw/uncontended", "token", 10*time.Second).Result()
		if err != nil || !ok {
			b.Fatalf("SET NX = %v, %v", ok, err)
		}
		if err := compareAndDelete.Run(ctx, rdb, []string{"raw/uncontended"}, "token").Err(); err != nil {
			b.Fatal(err)
		}
	}
}

var contenders = []int{2, 8}

func BenchmarkMutexContended(b *testing.B) {
	for _, n := range contenders {
		b.Run(fmt.Sprintf("owners=%d", n), func(b *testing.B) {
			srv := testserver.StartRedis(b)
			mutexes := make([]*dlock.Mutex, n)
			for i := range mutexes {
				c := dlock.New(redislock.New(srv.Client(b)))
				b.Cleanup(func() { _ = c.Close() })
				mutexes[i] = c.Mutex("bench/contended")
			}
			runContended(b, n, func(ctx context.Context, i int) error {
				l, err := mutexes[i].Lock(ctx)
				if err != nil {
					return err
				}
				return l.Unlock(ctx)
			})
		})
	}
}

func BenchmarkRawContended(b *testing.B) {
	for _, n := range contenders {
		b.Run(fmt.Sprintf("owners=%d", n), func(b *testing.B) {
			srv := testserver.StartRedis(b)
			clients := make([]*redis.Client, n)
			for i := range clients {
				clients[i] = srv.Client(b)
			}
			runContended(b, n, func(ctx context.Context, i int) error {
				token := fmt.Sprint(i)
				for {
					ok, err := clients[i].SetNX(ctx, "raw/contended", token, 10*time.Second).Result()
					if err != nil {
						return err
					}
					if ok {
						break
					}
				}
				return compareAndDelete.Run(ctx, clients[i], []string{"raw/contended"}, token).Err()
			})
		})
	}
}

// runContended runs b.N grants spread over n owners and reports the p50 and
// p99 time from asking for the lock to holding it.
func runContended(b *testing.B, n int, cycle func(ctx context.Context, owner int) error) {
	ctx := context.Background()
	var left atomic.Int64
	left.Store(int64(b.N))
	waits := make([][]time.Duration, n)
	var wg sync.WaitGroup
	b.ResetTimer()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for left.Add(-1) >= 0 {
				start := time.Now()
				if err := cycle(ctx, i); err != nil {
					b.Error(err)
					return
				}
				waits[i] = append(waits[i], time.Since(start))
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	all := slices.Concat(waits...)
	if len(all) == 0 {
		return
	}
	slices.Sort(all)
	b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
}
