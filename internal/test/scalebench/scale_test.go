package scalebench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redislock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	leasesFlag  = flag.Int("scale.leases", 5000, "number of leases the Client holds at once")
	heapProfile = flag.String("scale.heapprofile", "", "write a heap profile to this file at the window's first heap sample, while all leases are held")
)

const (
	ttl           = 3 * time.Second
	renewInterval = ttl / 3 // dlock renews every TTL/3
	intervals     = 3       // the measured window, in renewal intervals
	acquirers     = 64      // goroutines that take the leases
	namePrefix    = "scale/"

	// goroutineSlack is how many goroutines the Client may add whatever N
	// is: the renewer, and a renewal batch or two in flight.
	goroutineSlack = 8
	// heapBudget is the most a held lease may cost the Client's heap.
	heapBudget = 1024
	// checkChunk is how many keys one checking pipeline asks about.
	checkChunk = 1000
)

// counter is a go-redis hook that counts round trips and commands.
type counter struct {
	dials    atomic.Int64
	rt       atomic.Int64 // ProcessHook and ProcessPipelineHook calls
	cmds     atomic.Int64
	failed   atomic.Int64 // commands answered with an error (NOSCRIPT, say)
	pipes    atomic.Int64
	maxBatch atomic.Int64 // most commands in one pipeline
	maxPipe  atomic.Int64 // longest pipeline round trip, ns
	pipeTime atomic.Int64 // total pipeline round trip time, ns

	mu    sync.Mutex
	since time.Time // when the trace started; zero: not tracing
	trace []pipeEvent
}

// pipeEvent is one pipeline in the trace.
type pipeEvent struct {
	at, took time.Duration // start, from the trace's start; round trip
	cmds     int
}

// maxTrace bounds the trace.
const maxTrace = 200

// startTrace starts recording pipelines from now.
func (c *counter) startTrace() {
	c.mu.Lock()
	c.since, c.trace = time.Now(), nil
	c.mu.Unlock()
}

// stopTrace ends the trace and returns it.
func (c *counter) stopTrace() []pipeEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.since = time.Time{}
	return c.trace
}

func (c *counter) record(start time.Time, took time.Duration, cmds int) {
	c.mu.Lock()
	if !c.since.IsZero() && len(c.trace) < maxTrace {
		c.trace = append(c.trace, pipeEvent{start.Sub(c.since), took, cmds})
	}
	c.mu.Unlock()
}

func (c *counter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c.dials.Add(1)
		return next(ctx, network, addr)
	}
}

func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.rt.Add(1)
		c.cmds.Add(1)
		err := next(ctx, cmd)
		if cmd.Err() != nil {
			c.failed.Add(1)
		}
		return err
	}
}

func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.rt.Add(1)
		c.pipes.Add(1)
		c.cmds.Add(int64(len(cmds)))
		storeMax(&c.maxBatch, int64(len(cmds)))
		start := time.Now()
		err := next(ctx, cmds)
		d := time.Since(start)
		c.pipeTime.Add(int64(d))
		storeMax(&c.maxPipe, int64(d))
		c.record(start, d, len(cmds))
		for _, cmd := range cmds {
			if cmd.Err() != nil {
				c.failed.Add(1)
			}
		}
		return err
	}
}

func storeMax(v *atomic.Int64, x int64) {
	for {
		old := v.Load()
		if x <= old || v.CompareAndSwap(old, x) {
			return
		}
	}
}

// snapshot is the counter at one moment.
type snapshot struct{ dials, rt, cmds, failed, pipes, pipeTime int64 }

func (c *counter) snapshot() snapshot {
	return snapshot{c.dials.Load(), c.rt.Load(), c.cmds.Load(), c.failed.Load(), c.pipes.Load(), c.pipeTime.Load()}
}

// figures are the results of one run.
type figures struct {
	n          int
	acquire    time.Duration // taking all N leases
	rt         int64         // round trips in the window
	cmds       int64         // commands in the window
	failed     int64         // of which answered with an error (NOSCRIPT before the EVAL fallback)
	pipes      int64         // pipelines in the window
	dials      int64         // connections dialled in the window
	maxBatch   int64         // most commands in one pipeline in the window
	maxPipe    time.Duration // longest pipeline round trip in the window
	meanPipe   time.Duration // mean pipeline round trip in the window
	goroutines int           // after acquiring minus before
	maxGor     int           // most goroutines over before seen in the window
	heapBefore uint64
	heapDelta  int64 // smallest sample in the window minus before
	lost       int   // leases ended, or keys missing or without PTTL, at the window's end
	closeTime  time.Duration
	leftover   int // lock keys (not fence counters) in Redis after Close
	fences     int // fence counters in Redis after Close (they stay: one per name)
	closeErr   error
	trace      []pipeEvent // the window's pipelines
}

func (f figures) rtBudget() int64 { return int64(intervals * ((f.n + 99) / 100)) }

func (f figures) bytesPerLease() float64 { return float64(f.heapDelta) / float64(f.n) }

func (f figures) rtPer100PerInterval() float64 {
	return float64(f.rt) / (float64(f.n) / 100) / intervals
}

// renewalsPerInterval counts the renewals Redis answered, not the
// commands it refused (the EVALSHA before the EVAL fallback).
func (f figures) renewalsPerInterval() float64 { return float64(f.cmds-f.failed) / intervals }

func (f figures) String() string {
	return fmt.Sprintf("N=%d acquire=%v (%.0f/s)\n"+
		"  window %v: round trips=%d (budget %d, %.3f per 100 leases per interval), commands=%d (%d failed, %.0f renewals/interval), pipelines=%d, dials=%d\n"+
		"  pipelines: max batch=%d, mean round trip=%v, max round trip=%v\n"+
		"  goroutines: +%d after acquiring, +%d max in window (slack %d)\n"+
		"  heap: before=%d B, delta=%d B, %.0f B/lease (budget %d)\n"+
		"  lost=%d, close=%v (err %v), lock keys left after close=%d (fence counters %d)",
		f.n, f.acquire.Round(time.Millisecond), float64(f.n)/f.acquire.Seconds(),
		intervals*renewInterval, f.rt, f.rtBudget(), f.rtPer100PerInterval(), f.cmds, f.failed, f.renewalsPerInterval(), f.pipes, f.dials,
		f.maxBatch, f.meanPipe.Round(time.Microsecond), f.maxPipe.Round(time.Microsecond),
		f.goroutines, f.maxGor, goroutineSlack,
		f.heapBefore, f.heapDelta, f.bytesPerLease(), heapBudget,
		f.lost, f.closeTime.Round(time.Millisecond), f.closeErr, f.leftover, f.fences)
}

// heapAlloc returns the live heap after a full collection.
func heapAlloc() uint64 {
	runtime.GC()
	runtime.GC() // the second one frees what the first one's finalizers let go
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// writeHeapProfile writes the heap profile to path (inuse_space shows what
// the held leases keep alive; read it with go tool pprof).
func writeHeapProfile(tb testing.TB, path string) {
	tb.Helper()
	out, err := os.Create(path)
	if err != nil {
		tb.Fatalf("heap profile: %v", err)
	}
	defer out.Close()
	if err := pprof.WriteHeapProfile(out); err != nil {
		tb.Fatalf("heap profile: %v", err)
	}
}

// lockKey is redislock's name for the lock hash of name (default namespace,
// no key prefix): see redislock/keys.go.
func lockKey(name string) string { return "dlock:{" + name + "}" }

// run holds n leases on a fresh Client over srv, watches the window, checks
// the keys, closes the Client and returns the figures. round prefixes the
// names so that runs on one server do not meet. It fails tb only when the
// run could not be made (a Lock or Redis error); budgets are the caller's.
func run(tb testing.TB, srv *testserver.Redis, round int, n int) figures {
	tb.Helper()
	f := figures{n: n}
	ctx := context.Background()
	prefix := fmt.Sprintf("%s%d/", namePrefix, round)

	cnt := &counter{}
	rdb := srv.Client(tb)
	rdb.AddHook(cnt)
	check := srv.Client(tb) // for the checks, outside the counts

	// Fill the connection pool first, so that its buffers are not counted
	// as the leases' memory nor its dials as renewal traffic.
	var wg sync.WaitGroup
	for range acquirers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 4 {
				_ = rdb.Ping(ctx).Err()
			}
		}()
	}
	wg.Wait()

	c := dlock.New(redislock.New(rdb), dlock.WithTTL(ttl))
	closed := false
	tb.Cleanup(func() {
		if !closed {
			_ = c.Close()
		}
	})
	leases := make([]*dlock.Lease, n) // before the baseline: the test's storage, not the Client's

	gorBefore := runtime.NumGoroutine()
	f.heapBefore = heapAlloc()

	// Take the leases: worker w takes every acquirers-th name from w.
	start := time.Now()
	errs := make(chan error, acquirers)
	for w := range acquirers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += acquirers {
				l, err := c.Mutex(prefix + fmt.Sprint(i)).Lock(ctx)
				if err != nil {
					errs <- fmt.Errorf("lease %d: %w", i, err)
					return
				}
				leases[i] = l
			}
		}()
	}
	wg.Wait()
	f.acquire = time.Since(start)
	close(errs)
	for err := range errs {
		tb.Fatal(err)
	}
	f.goroutines = runtime.NumGoroutine() - gorBefore

	// The window: three renewal intervals from now. Only the renewer sends
	// commands on rdb in it. The heap and goroutines are sampled at its
	// start and at every interval; the smallest heap sample is the cost of
	// holding (a renewal batch in flight holds its requests and replies
	// for a moment).
	cnt.maxBatch.Store(0)
	cnt.maxPipe.Store(0)
	before := cnt.snapshot()
	cnt.startTrace()
	winStart := time.Now()
	f.maxGor = f.goroutines
	minHeap := uint64(1<<64 - 1)
	for i := range intervals {
		minHeap = min(minHeap, heapAlloc())
		if i == 0 && *heapProfile != "" {
			writeHeapProfile(tb, *heapProfile)
		}
		f.maxGor = max(f.maxGor, runtime.NumGoroutine()-gorBefore)
		time.Sleep(time.Until(winStart.Add(time.Duration(i+1) * renewInterval)))
	}
	after := cnt.snapshot()
	f.trace = cnt.stopTrace()
	f.rt = after.rt - before.rt
	f.cmds = after.cmds - before.cmds
	f.failed = after.failed - before.failed
	f.pipes = after.pipes - before.pipes
	f.dials = after.dials - before.dials
	f.maxBatch = cnt.maxBatch.Load()
	f.maxPipe = time.Duration(cnt.maxPipe.Load())
	if f.pipes > 0 {
		f.meanPipe = time.Duration((after.pipeTime - before.pipeTime) / f.pipes)
	}
	f.heapDelta = int64(minHeap) - int64(f.heapBefore)
	runtime.KeepAlive(leases)

	// Every lease still held, locally and in Redis.
	lost := make([]bool, n)
	for i, l := range leases {
		select {
		case <-l.Done():
			lost[i] = true
		default:
		}
		if l.Err() != nil {
			lost[i] = true
		}
	}
	for lo := 0; lo < n; lo += checkChunk {
		hi := min(lo+checkChunk, n)
		pipe := check.Pipeline()
		cmds := make([]*redis.DurationCmd, hi-lo)
		for i := lo; i < hi; i++ {
			cmds[i-lo] = pipe.PTTL(ctx, lockKey(prefix+fmt.Sprint(i)))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			tb.Fatalf("PTTL: %v", err)
		}
		for i, cmd := range cmds {
			if cmd.Val() <= 0 { // -2: no key, -1: no expiry
				lost[lo+i] = true
			}
		}
	}
	for _, l := range lost {
		if l {
			f.lost++
		}
	}

	// Close releases everything: no lock key may be left.
	start = time.Now()
	f.closeErr = c.Close()
	f.closeTime = time.Since(start)
	closed = true
	for i, l := range leases {
		select {
		case <-l.Done():
		default:
			tb.Errorf("lease %d: Done still open after Close", i)
			return f
		}
	}
	iter := check.Scan(ctx, 0, "dlock:{"+prefix+"*", checkChunk).Iterator()
	for iter.Next(ctx) {
		switch {
		case strings.HasSuffix(iter.Val(), ":fence"):
			f.fences++
		case strings.HasSuffix(iter.Val(), ":r"): // recent releases, kept 15s on purpose
		case strings.HasSuffix(iter.Val(), ":late"): // late-request records, kept 5s on purpose
		default:
			f.leftover++
		}
	}
	if err := iter.Err(); err != nil {
		tb.Fatalf("SCAN: %v", err)
	}
	return f
}

// TestHeldLeases holds -scale.leases leases on one Client and checks the
// budgets of the package documentation.
func TestHeldLeases(t *testing.T) {
	n := *leasesFlag
	if n < 1 {
		t.Fatalf("-scale.leases=%d: want at least 1", n)
	}
	srv := testserver.StartRedis(t)
	f := run(t, srv, 0, n)
	t.Log(f)
	if testing.Verbose() {
		for _, e := range f.trace {
			t.Logf("  pipeline at %v: %d commands, round trip %v", e.at.Round(time.Millisecond), e.cmds, e.took.Round(time.Microsecond))
		}
	}

	if f.rt > f.rtBudget() {
		t.Errorf("renewal round trips in %d intervals = %d, want <= %d (3*ceil(N/100))", intervals, f.rt, f.rtBudget())
	}
	if f.cmds-f.failed < int64(n) {
		t.Errorf("renewals in %d intervals = %d, want >= N = %d: leases went unrenewed", intervals, f.cmds-f.failed, n)
	}
	if f.goroutines > goroutineSlack {
		t.Errorf("goroutines after acquiring = before + %d, want <= before + %d", f.goroutines, goroutineSlack)
	}
	if f.bytesPerLease() > heapBudget {
		t.Errorf("heap per held lease = %.0f B, want <= %d", f.bytesPerLease(), heapBudget)
	}
	if f.lost != 0 {
		t.Errorf("%d of %d leases lost or missing in Redis at the end of the window", f.lost, n)
	}
	if f.closeErr != nil {
		t.Errorf("Close: %v", f.closeErr)
	}
	if f.leftover != 0 {
		t.Errorf("%d lock keys left in Redis after Close, want 0", f.leftover)
	}
	if f.fences != n { // the SCAN saw the keys at all
		t.Errorf("SCAN after Close found %d fence counters, want one per name (%d)", f.fences, n)
	}
}

// BenchmarkHeldLeases reports the figures of TestHeldLeases; one iteration
// is one whole run (use -benchtime 1x).
func BenchmarkHeldLeases(b *testing.B) {
	n := *leasesFlag
	if n < 1 {
		b.Fatalf("-scale.leases=%d: want at least 1", n)
	}
	srv := testserver.StartRedis(b)
	var (
		sum   figures
		round int
	)
	for b.Loop() {
		f := run(b, srv, round, n)
		b.Log(f)
		round++
		sum.rt += f.rt
		sum.cmds += f.cmds - f.failed
		sum.heapDelta += f.heapDelta
		sum.goroutines = max(sum.goroutines, f.goroutines)
		sum.lost += f.lost + f.leftover
		if f.closeErr != nil {
			b.Error(errors.Join(errors.New("close"), f.closeErr))
		}
	}
	k := float64(round)
	b.ReportMetric(float64(sum.rt)/k/(float64(n)/100)/intervals, "rt-per-100-leases-per-interval")
	b.ReportMetric(float64(sum.heapDelta)/k/float64(n), "bytes-per-lease")
	b.ReportMetric(float64(sum.goroutines), "goroutines")
	b.ReportMetric(float64(sum.cmds)/k/intervals, "renewals/interval")
	b.ReportMetric(float64(sum.lost)/k, "lost")
}
