package main

import (
	"flag"
	"io"
	"log"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/go-sql-driver/mysql"
	"go.uber.org/goleak"
)

var (
	long = flag.Bool("flashsale.long", false,
		"run the long version: 20,000 requests per strategy, every strategy under the faults (default: a few seconds each)")
	fair = flag.Bool("flashsale.fair", false, "give the mutex strategy's item locks dlock.Fair")
)

// childEnv marks a copy of the test binary started as a service process.
const childEnv = "FLASHSALE_TEST_SERVE"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(serveMain(os.Args[1:]))
	}
	// The command (runMain) starts its service processes as
	// `EXECUTABLE serve ...`: here the executable is the test binary.
	if len(os.Args) > 1 && os.Args[1] == "serve" {
		os.Exit(serveMain(os.Args[2:]))
	}
	// The MySQL driver logs every connection that a restart broke.
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
	goleak.VerifyTestMain(m,
		// A go-redis pool that failed to dial (Redis restarted) keeps one
		// goroutine that dials again every second; Close ends it when it
		// wakes.
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"),
	)
}

// stores is one Redis (AOF, fsync always) and one MariaDB for a test.
type stores struct {
	redis *testserver.Redis
	maria *testserver.MariaDB
}

func startStores(t *testing.T) *stores {
	t.Helper()
	return &stores{
		redis: testserver.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always"),
		maria: testserver.StartMariaDB(t),
	}
}

// config returns a run of strategy on the stores, in a database of its own.
func (s *stores) config(t *testing.T, strategy string) runConfig {
	t.Helper()
	db := "sale_" + strategy
	s.maria.CreateDatabase(t, db)
	cfg := runConfig{
		redisAddr: s.redis.Addr(),
		mysqlDSN:  s.maria.DSN(db),
		service: serviceConfig{sale: strategy, strategy: strategy, ratePerMinute: 5,
			lockTTL: time.Second, lockWait: 3 * time.Second, permits: 8, checkoutDelay: 2 * time.Millisecond},
		procs: 3, items: 3, stock: 420, users: 500, requests: 1500, concurrency: 32,
		claimIdle: time.Second,
		logf:      t.Logf,
	}
	cfg.service.fair = *fair
	if *long {
		cfg.items, cfg.stock, cfg.users, cfg.requests, cfg.concurrency = 4, 4000, 5000, 20000, 64
	}
	logs, err := os.Create(t.TempDir() + "/services.log")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = logs.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logs.Name())
			t.Logf("service logs (last 4 KiB):\n%s", tail(b, 4096))
		}
	})
	cfg.spawn = func(args []string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = append(os.Environ(), childEnv+"=1")
		cmd.Stderr = logs
		return cmd
	}
	return cfg
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// runOnTest runs the sale, and runs each fault's action on the test's
// goroutine (the test servers' methods may fail the test, which only the
// test's goroutine may do).
func runOnTest(t *testing.T, cfg runConfig) *report {
	t.Helper()
	type call struct {
		fn    func(r *run) error
		r     *run
		reply chan error
	}
	calls := make(chan call)
	for i, f := range cfg.faults {
		fn := f.do
		cfg.faults[i].do = func(r *run) error {
			c := call{fn: fn, r: r, reply: make(chan error, 1)}
			calls <- c
			return <-c.reply
		}
	}
	type result struct {
		rep *report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := runSale(t.Context(), cfg)
		done <- result{rep, err}
	}()
	for {
		select {
		case c := <-calls:
			c.reply <- c.fn(c.r)
		case res := <-done:
			if res.err != nil {
				t.Fatalf("run: %v", res.err)
			}
			return res.rep
		}
	}
}

// checkReport fails the test unless the run kept the invariants: nothing
// oversold, every sold unit exactly one row, every confirmed order a row,
// every request answered.
func checkReport(t *testing.T, cfg runConfig, rep *report) {
	t.Helper()
	var b strings.Builder
	printReports(&b, []*report{rep})
	t.Logf("\n%s", b.String())
	if !rep.ok() {
		t.Errorf("%s: oversold %d, leaked %d, lost %d, phantom %d, duplicated %d, failed %d; want 0 each",
			rep.Strategy, rep.Oversold, rep.Leaked, rep.Lost, rep.Phantom, rep.Duplicated, rep.Failed)
	}
	if total := int64(cfg.items) * cfg.stock; rep.Sold != total {
		t.Errorf("%s: sold %d of %d units; the workload should sell out", rep.Strategy, rep.Sold, total)
	}
	if rep.Rows != rep.Sold || int64(rep.Confirmed) > rep.Sold {
		t.Errorf("%s: %d rows, %d sold, %d confirmed", rep.Strategy, rep.Rows, rep.Sold, rep.Confirmed)
	}
	if rep.SoldOut == 0 || rep.Limited == 0 {
		t.Errorf("%s: %d sold-out and %d rate-limited answers; the workload should have both", rep.Strategy, rep.SoldOut, rep.Limited)
	}
}

// TestStrategies runs the same workload with each strategy on three
// service processes. In the short version one of them is killed with
// SIGKILL halfway and started again; the long version runs without faults,
// for the comparison table.
func TestStrategies(t *testing.T) {
	s := startStores(t)
	var reps []*report
	for _, strategy := range []string{strategyMutex, strategyLua, strategySemaphore} {
		t.Run(strategy, func(t *testing.T) {
			cfg := s.config(t, strategy)
			if !*long {
				cfg.faults = []fault{{at: 0.5, name: "kill -9 svc-1", do: func(r *run) error { return r.kill9(1) }}}
			}
			rep := runOnTest(t, cfg)
			checkReport(t, cfg, rep)
			reps = append(reps, rep)
		})
	}
	if len(reps) == 3 {
		var b strings.Builder
		printReports(&b, reps)
		t.Logf("all strategies:\n%s", b.String())
	}

	// The documented command, on a small workload: every strategy, one
	// after the other, exits 0 only when the invariants held. It uses the
	// fixed-window limiter; the runs above use the default, GCRA.
	t.Run("command", func(t *testing.T) {
		s.maria.CreateDatabase(t, "sale_command")
		var out strings.Builder
		code := runMain([]string{"-redis", s.redis.Addr(), "-mysql", s.maria.DSN("sale_command"),
			"-strategy", "all", "-items", "2", "-stock", "100", "-users", "100", "-requests", "300",
			"-concurrency", "16", "-kill", "-limiter", "window"}, &out)
		t.Logf("\n%s", out.String())
		if code != 0 {
			t.Errorf("flashsale exited with %d", code)
		}
		for _, s := range []string{strategyMutex, strategyLua, strategySemaphore} {
			if !strings.Contains(out.String(), " "+s+" ") {
				t.Errorf("no row for %s in the output", s)
			}
		}
	})
}

// TestFaults runs the sale through the three faults one after the other:
// a service process killed with SIGKILL, Redis killed and restarted from
// its AOF, MariaDB killed and restarted. In the short version only the
// Mutex strategy, whose leases the Redis restart cuts, runs it.
func TestFaults(t *testing.T) {
	s := startStores(t)
	strategies := []string{strategyMutex}
	if *long {
		strategies = []string{strategyMutex, strategyLua, strategySemaphore}
	}
	for _, strategy := range strategies {
		t.Run(strategy, func(t *testing.T) {
			cfg := s.config(t, strategy)
			cfg.faults = []fault{
				{at: 0.2, name: "kill -9 svc-0", do: func(r *run) error { return r.kill9(0) }},
				{at: 0.4, name: "restart Redis (kill -9, AOF)", do: func(*run) error {
					s.redis.Kill(t)
					time.Sleep(300 * time.Millisecond)
					s.redis.Start(t)
					return nil
				}},
				{at: 0.6, name: "restart MariaDB (kill -9)", do: func(*run) error {
					s.maria.Kill(t)
					s.maria.Start(t)
					return nil
				}},
			}
			rep := runOnTest(t, cfg)
			checkReport(t, cfg, rep)
			if len(rep.Faults) != 3 {
				t.Errorf("faults run: %q", rep.Faults)
			}
		})
	}
}

// TestFencedReadRefusesLateWriter checks the Mutex strategy's fencing
// without timing: a holder that read the stock under fence 5, and whose
// lease then ran out, cannot write after a holder with fence 6 has read,
// even though fence 6 has not written yet.
func TestFencedReadRefusesLateWriter(t *testing.T) {
	srv := testserver.StartRedis(t)
	rdb := srv.Client(t)
	ctx := t.Context()
	k := keys{sale: "fence"}
	if err := rdb.HSet(ctx, k.stock("x"), "value", 10).Err(); err != nil {
		t.Fatal(err)
	}
	a := order{ID: "a", User: "u1", Item: "x"}
	b := order{ID: "b", User: "u2", Item: "x"}
	stockA, _, err := claim(ctx, rdb, k, a, 5)
	if err != nil || stockA != 10 {
		t.Fatalf("claim(5) = %d, %v", stockA, err)
	}
	stockB, _, err := claim(ctx, rdb, k, b, 6)
	if err != nil || stockB != 10 {
		t.Fatalf("claim(6) = %d, %v", stockB, err)
	}
	if ans, err := fencedSell(ctx, rdb, k, a, 5, stockA-1); err != nil || ans != answerStale {
		t.Fatalf("late write with fence 5 = %q, %v; want %q", ans, err, answerStale)
	}
	if ans, err := fencedSell(ctx, rdb, k, b, 6, stockB-1); err != nil || ans != answerOK {
		t.Fatalf("write with fence 6 = %q, %v; want ok", ans, err)
	}
	if n, _ := stockOf(ctx, rdb, k, "x"); n != 9 {
		t.Errorf("stock = %d, want 9", n)
	}
	if n, _ := rdb.XLen(ctx, k.orders()).Result(); n != 1 {
		t.Errorf("%d orders queued, want 1", n)
	}
}

// TestFencedSellResentOnce checks that a copy of the fenced write, as
// go-redis sends when a connection breaks before the reply, queues the
// order once. A run with a Redis restart queued one order twice before
// fenced_sale.lua checked the request's record.
func TestFencedSellResentOnce(t *testing.T) {
	srv := testserver.StartRedis(t)
	rdb := srv.Client(t)
	ctx := t.Context()
	k := keys{sale: "resend"}
	if err := rdb.HSet(ctx, k.stock("x"), "value", 10).Err(); err != nil {
		t.Fatal(err)
	}
	o := order{ID: "a", User: "u1", Item: "x"}
	stock, _, err := claim(ctx, rdb, k, o, 3)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if ans, err := fencedSell(ctx, rdb, k, o, 3, stock-1); err != nil || ans != answerOK {
			t.Fatalf("copy %d of the write = %q, %v; want ok", i+1, ans, err)
		}
	}
	if n, _ := rdb.XLen(ctx, k.orders()).Result(); n != 1 {
		t.Errorf("%d orders queued, want 1", n)
	}
	if n, _ := stockOf(ctx, rdb, k, "x"); n != 9 {
		t.Errorf("stock = %d, want 9", n)
	}
}
