package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/redis/go-redis/v9"
)

// limiterKinds are the limiters the tests and the benchmark compare.
var limiterKinds = []string{limiterWindow, limiterGCRA}

// hitConcurrently sends perUser attempts for each of users from workers
// goroutines at once, the users' attempts interleaved, and returns how
// many of each user's were admitted. after, when set, runs after each
// attempt, with the user.
func hitConcurrently(t *testing.T, lim limiter, users []string, perUser, workers int, after func(user string)) map[string]int {
	t.Helper()
	ctx := t.Context()
	counts := make([]atomic.Int64, len(users))
	var next atomic.Int64
	total := int64(len(users) * perUser)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < total; i = next.Add(1) - 1 {
				u := int(i) % len(users)
				ok, err := lim.allow(ctx, users[u])
				if err != nil {
					t.Errorf("allow(%s): %v", users[u], err)
					return
				}
				if ok {
					counts[u].Add(1)
				}
				if after != nil {
					after(users[u])
				}
			}
		}()
	}
	wg.Wait()
	admitted := map[string]int{}
	for i, u := range users {
		admitted[u] = int(counts[i].Load())
	}
	return admitted
}

// Each limiter admits exactly its limit per user when many more attempts
// than that arrive at once from many goroutines, for several users at a
// time: not one more (a lost update), not one fewer.
func TestLimitersAdmitTheirLimitPerUserUnderConcurrency(t *testing.T) {
	rdb := testserver.StartRedis(t).Client(t)
	const limit, perUser, workers = 10, 40, 32
	users := []string{"u0", "u1", "u2", "u3", "u4", "u5", "u6", "u7"}
	for _, kind := range limiterKinds {
		t.Run(kind, func(t *testing.T) {
			// Per hour: GCRA frees one attempt every 6 minutes, so every
			// attempt here falls within the burst however slow the machine.
			lim, err := newLimiter(kind, rdb, keys{sale: "concurrent"}, limit, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			for u, n := range hitConcurrently(t, lim, users, perUser, workers, nil) {
				if n != limit {
					t.Errorf("%s: %d of %d attempts admitted, want %d", u, n, perUser, limit)
				}
			}
		})
	}
}

// The fixed window's counter has an expiry from its first hit on, whoever
// makes it among concurrent hits, and later hits do not move it: every hit
// reads back the same expiry time. Each of 16 users is hit by 32 goroutines
// at once, so that many first hits race with the hits after them.
func TestWindowLimiterCounterAlwaysExpires(t *testing.T) {
	rdb := testserver.StartRedis(t).Client(t)
	const window = time.Minute
	k := keys{sale: "expiry"}
	lim, err := newLimiter(limiterWindow, rdb, k, 5, window)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 16 {
		user := "u" + strconv.Itoa(i)
		var mu sync.Mutex
		ends := map[time.Duration]int{}
		hitConcurrently(t, lim, []string{user}, 32, 32, func(user string) {
			ctx := t.Context()
			ttl, err := rdb.PTTL(ctx, k.rateWindow(user)).Result()
			if err != nil || ttl <= 0 || ttl > window {
				t.Errorf("%s: PTTL after a hit = %v, %v; want in (0, %v]", user, ttl, err, window)
			}
			end, err := rdb.PExpireTime(ctx, k.rateWindow(user)).Result()
			if err != nil {
				t.Errorf("PEXPIRETIME: %v", err)
			}
			mu.Lock()
			ends[end]++
			mu.Unlock()
		})
		if len(ends) != 1 {
			t.Errorf("%s: the hits read %d different window ends (%v), want 1", user, len(ends), ends)
		}
	}
}

// Across a window boundary the fixed window admits twice its limit in a
// moment: its limit just before the counter expires and its limit again
// just after. GCRA admits no more than its burst in the same moment, and
// only one more attempt for each period/limit that passes.
func TestLimitersAcrossAWindowBoundary(t *testing.T) {
	rdb := testserver.StartRedis(t).Client(t)
	ctx := t.Context()
	const limit, period = 5, time.Minute
	k := keys{sale: "boundary"}
	lims := map[string]limiter{}
	for _, kind := range limiterKinds {
		lim, err := newLimiter(kind, rdb, k, limit, period)
		if err != nil {
			t.Fatal(err)
		}
		lims[kind] = lim
	}
	admitted := map[string]int{}
	batch := func() {
		for kind, lim := range lims {
			admitted[kind] += hitConcurrently(t, lim, []string{"u"}, limit, limit, nil)["u"]
		}
	}

	start := time.Now()
	batch()
	for kind, n := range admitted {
		if n != limit {
			t.Fatalf("%s admitted %d of the first %d attempts, want all", kind, n, limit)
		}
	}
	// The window's end: shortening the counter's expiry to 50 ms puts it
	// where it would be 59.95 s into the window, without the wait.
	key := k.rateWindow("u")
	if err := rdb.PExpire(ctx, key, 50*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	waitGone(t, rdb, key)
	batch()
	elapsed := time.Since(start)

	if n := admitted[limiterWindow]; n != 2*limit {
		t.Errorf("fixed window admitted %d of %d attempts across its boundary, want %d", n, 2*limit, 2*limit)
	}
	if elapsed >= period {
		t.Errorf("the attempts took %v, want them within one period (%v)", elapsed, period)
	}
	// GCRA frees one attempt per emission interval (12 s here).
	bound := limit + int(elapsed/(period/limit))
	if n := admitted[limiterGCRA]; n > bound {
		t.Errorf("GCRA admitted %d of %d attempts in %v, want at most %d", n, 2*limit, elapsed, bound)
	}
	t.Logf("%d attempts in %v: fixed window admitted %d, GCRA %d", 2*limit, elapsed.Round(time.Millisecond),
		admitted[limiterWindow], admitted[limiterGCRA])
}

// waitGone returns once key has expired, reading its PTTL.
func waitGone(t *testing.T, rdb *redis.Client, key string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ttl, err := rdb.PTTL(t.Context(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl == -2 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still there 30 s later (PTTL %v)", key, ttl)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The command refuses a limiter it does not know before it starts anything.
func TestRunRefusesUnknownLimiter(t *testing.T) {
	var out strings.Builder
	if code := runMain([]string{"-limiter", "leaky"}, &out); code != 2 {
		t.Errorf("exit code %d with -limiter leaky, want 2", code)
	}
}

// BenchmarkLimiters measures the two limiters side by side on one
// redis-server: users limited to 5 attempts a minute, each attempting 10
// times (half admitted), from 16 goroutines per CPU. It reports decisions/s,
// and from Redis's INFO the commands it ran and the CPU time it used per
// decision, which the machine's other load disturbs less than the wall
// clock.
func BenchmarkLimiters(b *testing.B) {
	rdb := testserver.StartRedis(b).Client(b)
	const limit, perUser = 5, 10
	for _, kind := range limiterKinds {
		b.Run(kind, func(b *testing.B) {
			ctx := b.Context()
			lim, err := newLimiter(kind, rdb, keys{sale: fmt.Sprintf("bench-%d", time.Now().UnixNano())}, limit, time.Minute)
			if err != nil {
				b.Fatal(err)
			}
			users := int64(max(1, b.N/perUser))
			calls0, cpu0 := redisStats(b, rdb)
			var next, admitted atomic.Int64
			b.SetParallelism(16)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					user := "u" + strconv.Itoa(int(next.Add(1)%users))
					ok, err := lim.allow(ctx, user)
					if err != nil {
						b.Error(err)
						return
					}
					if ok {
						admitted.Add(1)
					}
				}
			})
			b.StopTimer()
			calls, cpu := redisStats(b, rdb)
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
			b.ReportMetric(float64(calls-calls0)/float64(b.N), "cmds/decision")
			b.ReportMetric(float64((cpu-cpu0).Microseconds())/float64(b.N), "redis-cpu-µs/decision")
			b.ReportMetric(float64(admitted.Load())/float64(b.N), "admitted/decision")
		})
	}
}

// redisStats returns the calls of every command Redis has counted (INFO
// commandstats), INFO itself left out, and the CPU time Redis has used
// (INFO cpu: user and system, all threads).
func redisStats(b *testing.B, rdb *redis.Client) (calls int64, cpu time.Duration) {
	b.Helper()
	info, err := rdb.Info(context.Background(), "commandstats", "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		switch {
		case !ok:
		case name == "used_cpu_user" || name == "used_cpu_sys":
			sec, err := strconv.ParseFloat(rest, 64)
			if err != nil {
				b.Fatalf("INFO cpu line %q: %v", line, err)
			}
			cpu += time.Duration(sec * float64(time.Second))
		case strings.HasPrefix(name, "cmdstat_") && name != "cmdstat_info":
			for _, f := range strings.Split(rest, ",") {
				if v, ok := strings.CutPrefix(f, "calls="); ok {
					n, err := strconv.ParseInt(v, 10, 64)
					if err != nil {
						b.Fatalf("INFO commandstats line %q: %v", line, err)
					}
					calls += n
				}
			}
		}
	}
	return calls, cpu
}
