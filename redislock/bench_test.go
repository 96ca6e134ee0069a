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
	"regexp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
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

// BenchmarkScriptServerTime reports the server's time per call of each
// script on the uncontended path, from INFO commandstats (the usec of
// EVALSHA, which include the commands the script runs; SET for the raw
// loop's acquire): b.N acquires and b.N releases, in rounds over 64 names
// (each round acquires all, then releases all, so that a name's recent
// releases fill up as on a lock in use), next to the raw loop's SET NX PX
// and compare-and-delete script. These are wall-clock µs as Redis measured
// them, without the client and the network; a busy machine inflates them
// (compare figures of one run). cpu-µs is the server process's CPU time
// (INFO cpu) per call, reading and answering the request included.
//
//	go test -run XXX -bench ScriptServerTime -benchtime 20000x ./redislock/
func BenchmarkScriptServerTime(b *testing.B) {
	srv := testserver.StartRedis(b)
	rdb := srv.Client(b)
	be := redislock.New(srv.Client(b), redislock.WithEvictionAllowed())
	ctx := context.Background()
	keys := make([]string, 64)
	for i := range keys {
		keys[i] = fmt.Sprintf("bench/script/%d", i)
	}
	usec := func(cmd string) float64 {
		return serverStat(b, rdb, "commandstats", `(?m)^cmdstat_`+cmd+`:calls=\d+,usec=(\d+)`)
	}
	type phase struct {
		name, cmd string
		run       func(key string) error
		usec, cpu float64
		calls     int
	}
	phases := []*phase{
		{name: "acquire", cmd: "evalsha", run: func(k string) error {
			res, err := be.Acquire(ctx, driver.AcquireRequest{Key: k, Token: "t", Owner: "bench owner", TTL: 10 * time.Second})
			if err == nil && !res.Acquired {
				err = fmt.Errorf("not acquired: %+v", res)
			}
			return err
		}},
		{name: "release", cmd: "evalsha", run: func(k string) error {
			res, err := be.Release(ctx, k, "t")
			if err == nil && !res.Held {
				err = fmt.Errorf("not held")
			}
			return err
		}},
		{name: "rawset", cmd: "set", run: func(k string) error {
			return rdb.SetNX(ctx, "raw/"+k, "token", 10*time.Second).Err()
		}},
		{name: "rawdel", cmd: "evalsha", run: func(k string) error {
			return compareAndDelete.Run(ctx, rdb, []string{"raw/" + k}, "token").Err()
		}},
	}
	b.ResetTimer()
	for done := 0; done < b.N; done += len(keys) {
		n := min(len(keys), b.N-done)
		for _, p := range phases {
			before, cpu := usec(p.cmd), serverCPU(b, rdb)
			for _, k := range keys[:n] {
				if err := p.run(k); err != nil {
					b.Fatalf("%s %s: %v", p.name, k, err)
				}
			}
			p.cpu += serverCPU(b, rdb) - cpu
			p.usec += usec(p.cmd) - before
			p.calls += n
		}
	}
	for _, p := range phases {
		b.ReportMetric(p.usec/float64(p.calls), p.name+"-µs")
		b.ReportMetric(p.cpu/float64(p.calls), p.name+"-cpu-µs")
	}
}

// serverCPU returns the server's CPU time so far in µs (INFO cpu, user and
// system, of its main thread and the others).
func serverCPU(b *testing.B, rdb *redis.Client) float64 {
	return 1e6 * (serverStat(b, rdb, "cpu", `(?m)^used_cpu_user:([0-9.]+)`) + serverStat(b, rdb, "cpu", `(?m)^used_cpu_sys:([0-9.]+)`))
}

// serverStat returns the number that the first group of pattern matches in
// the INFO section, or 0 when it does not match.
func serverStat(b *testing.B, rdb *redis.Client, section, pattern string) float64 {
	b.Helper()
	info, err := rdb.Info(context.Background(), section).Result()
	if err != nil {
		b.Fatal(err)
	}
	m := regexp.MustCompile(pattern).FindStringSubmatch(info)
	if m == nil {
		return 0
	}
	n, _ := strconv.ParseFloat(m[1], 64)
	return n
}

// BenchmarkUncontendedInterleaved runs the raw loop's cycle, the Backend's
// (Acquire and Release, no dlock client) and dlock's Lock+Unlock on one
// server in turns, blocks of 500 cycles each, and reports each one's median
// µs per cycle over the blocks and its ratio to raw. Taking turns keeps a
// busy machine's ups and downs out of the ratios, which separate runs of
// the benchmarks above do not. On a machine whose idle cores sleep, the
// wake-up on each round trip hides most of the difference; keep the cores
// awake with busy loops at the lowest priority to see it (see
// docs/PERFORMANCE.md):
//
//	go test -run XXX -bench UncontendedInterleaved -benchtime 30000x ./redislock/
//	for i in 1 2; do nice -n 19 sh -c 'while :; do :; done' & done  # then kill %1 %2
func BenchmarkUncontendedInterleaved(b *testing.B) {
	srv := testserver.StartRedis(b)
	ctx := context.Background()
	raw := srv.Client(b)
	be := redislock.New(srv.Client(b), redislock.WithEvictionAllowed())
	c := dlock.New(redislock.New(srv.Client(b), redislock.WithEvictionAllowed()))
	defer c.Close()
	m := c.Mutex("bench/interleaved")
	subjects := []struct {
		name  string
		cycle func() error
	}{
		{"raw", func() error {
			if err := raw.SetNX(ctx, "raw/interleaved", "token", 10*time.Second).Err(); err != nil {
				return err
			}
			return compareAndDelete.Run(ctx, raw, []string{"raw/interleaved"}, "token").Err()
		}},
		{"backend", func() error {
			res, err := be.Acquire(ctx, driver.AcquireRequest{Key: "bench/backend", Token: "t", Owner: "bench owner", TTL: 10 * time.Second})
			if err != nil || !res.Acquired {
				return fmt.Errorf("acquire: %+v, %v", res, err)
			}
			_, err = be.Release(ctx, "bench/backend", "t")
			return err
		}},
		{"dlock", func() error {
			l, err := m.Lock(ctx)
			if err != nil {
				return err
			}
			return l.Unlock(ctx)
		}},
	}
	const block = 500
	perBlock := make([][]float64, len(subjects))
	b.ResetTimer()
	for done := 0; done < b.N; done += block * len(subjects) {
		for i, s := range subjects {
			start := time.Now()
			for range block {
				if err := s.cycle(); err != nil {
					b.Fatalf("%s: %v", s.name, err)
				}
			}
			perBlock[i] = append(perBlock[i], float64(time.Since(start).Nanoseconds())/block/1e3)
		}
	}
	b.StopTimer()
	medians := make([]float64, len(subjects))
	for i, v := range perBlock {
		slices.Sort(v)
		medians[i] = v[len(v)/2]
	}
	for i, s := range subjects {
		b.ReportMetric(medians[i], s.name+"-µs/cycle")
		if i > 0 {
			b.ReportMetric(medians[i]/medians[0], s.name+"/raw")
		}
	}
}

// BenchmarkFairScriptServerTime reports the server's time per call of the
// two scripts of a fair grant in a queue's steady state, from INFO
// commandstats (the usec of EVALSHA, commands the script runs included):
// the release that hands the lock to the head of a queue of two, and the
// releasing token's next acquire, which joins the queue behind the other.
// One client makes every call in turn, so no call waits for another and a
// change to a script shows in its own figure. release-cmds and join-cmds
// are the commands each ran, the script call included.
//
//	go test -run XXX -bench FairScriptServerTime -benchtime 20000x ./redislock/
func BenchmarkFairScriptServerTime(b *testing.B) {
	srv := testserver.StartRedis(b)
	rdb := srv.Client(b)
	be := redislock.New(srv.Client(b), redislock.WithEvictionAllowed())
	ctx := context.Background()
	const key = "bench/fair"
	req := func(token string) driver.AcquireRequest {
		return driver.AcquireRequest{Key: key, Token: token, Owner: token, TTL: 10 * time.Second,
			Fair: true, Wait: true, QueueTTL: 5 * time.Second, Handoff: true}
	}
	tokens := []string{"t0", "t1", "t2"}
	first, err := be.Acquire(ctx, req(tokens[0]))
	if err != nil || !first.Acquired {
		b.Fatalf("first acquire: %+v %v", first, err)
	}
	for _, t := range tokens[1:] {
		if res, err := be.Acquire(ctx, req(t)); err != nil || res.Acquired {
			b.Fatalf("join %s: %+v %v", t, res, err)
		}
	}
	stats := func() (usec, calls float64) {
		info, err := rdb.Info(ctx, "commandstats").Result()
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`(?m)^cmdstat_([a-z|]+):calls=(\d+),usec=(\d+)`).FindAllStringSubmatch(info, -1) {
			n, _ := strconv.ParseFloat(m[2], 64)
			u, _ := strconv.ParseFloat(m[3], 64)
			if m[1] == "evalsha" {
				usec += u
			}
			if m[1] != "info" {
				calls += n
			}
		}
		return usec, calls
	}
	var relUsec, relCmds, joinUsec, joinCmds float64
	fence := first.Fence
	b.ResetTimer()
	for i := range b.N {
		holder, head := tokens[i%3], tokens[(i+1)%3]
		u0, c0 := stats()
		if _, err := be.ReleaseGrant(ctx, key, holder, fence); err != nil {
			b.Fatal(err)
		}
		u1, c1 := stats()
		res, err := be.Acquire(ctx, req(holder))
		if err != nil || res.Acquired {
			b.Fatalf("join %s: %+v %v", holder, res, err)
		}
		u2, c2 := stats()
		relUsec, relCmds = relUsec+u1-u0, relCmds+c1-c0
		joinUsec, joinCmds = joinUsec+u2-u1, joinCmds+c2-c1
		f, err := rdb.HGet(ctx, "dlock:{"+key+"}", "fence").Uint64()
		if err != nil || f != fence+1 {
			b.Fatalf("the release did not hand the lock to %s: fence %d, %v", head, f, err)
		}
		fence = f
	}
	n := float64(b.N)
	b.ReportMetric(relUsec/n, "release-µs")
	b.ReportMetric(joinUsec/n, "join-µs")
	b.ReportMetric(relCmds/n, "release-cmds")
	b.ReportMetric(joinCmds/n, "join-cmds")
}
