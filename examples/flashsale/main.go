// Command flashsale is a flash sale on Redis and MariaDB, run end to end:
// several service processes (net/http) share one Redis, which keeps the
// stock, and one MariaDB, which keeps the orders; a load generator spreads
// purchase requests over them; the orders go from Redis to MariaDB through
// a stream with a consumer group. Three strategies sell: a dlock Mutex per
// item (fenced read and write), one atomic Lua script with no lock, and a
// dlock Semaphore admitting N buyers into a slower checkout. A per-user rate
// limit comes first: GCRA (go-redis/redis_rate) or a fixed window (-limiter).
//
//	go run . -redis 127.0.0.1:6379 -mysql 'root@tcp(127.0.0.1:3306)/flashsale' -strategy all
//
// `flashsale serve` runs one service process (the run starts them itself).
// See README.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"text/tabwriter"
	"time"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "serve" {
		os.Exit(serveMain(os.Args[2:]))
	}
	os.Exit(runMain(os.Args[1:], os.Stdout))
}

// runFlags are the flags of a run, shared by the command and the test.
type runFlags struct {
	cfg      runConfig
	strategy string
	killProc bool
}

func (f *runFlags) register(fs *flag.FlagSet) {
	c := &f.cfg
	fs.StringVar(&c.redisAddr, "redis", "127.0.0.1:6379", "Redis address")
	fs.StringVar(&c.mysqlDSN, "mysql", "root@tcp(127.0.0.1:3306)/flashsale", "MariaDB data source name; the run empties its orders table")
	fs.StringVar(&f.strategy, "strategy", "all", "mutex, lua, semaphore, or all (one after the other, same workload)")
	fs.IntVar(&c.procs, "procs", 3, "service processes")
	fs.IntVar(&c.items, "items", 4, "items on sale")
	fs.Int64Var(&c.stock, "stock", 1200, "units of each item")
	fs.IntVar(&c.users, "users", 2000, "buyers")
	fs.IntVar(&c.requests, "requests", 6000, "purchase requests")
	fs.IntVar(&c.concurrency, "concurrency", 64, "requests in flight at once")
	fs.IntVar(&c.service.ratePerMinute, "rate", 5, "purchases a user may attempt per minute")
	fs.StringVar(&c.service.limiter, "limiter", limiterGCRA, "the rate limiter: gcra (go-redis/redis_rate) or window (fixed window, one script)")
	fs.DurationVar(&c.service.lockTTL, "lock-ttl", 2*time.Second, "TTL of item locks and checkout permits")
	fs.DurationVar(&c.service.lockWait, "lock-wait", 3*time.Second, "longest wait for a lock or a permit")
	fs.IntVar(&c.service.permits, "permits", 16, "checkout permits (semaphore)")
	fs.DurationVar(&c.service.checkoutDelay, "checkout-delay", 5*time.Millisecond, "the slower checkout's extra work (semaphore)")
	fs.BoolVar(&c.service.fair, "fair", false, "item locks serve waiters in arrival order (mutex: dlock.Fair)")
	fs.DurationVar(&c.claimIdle, "claim-idle", 3*time.Second, "an order writer takes over another's order after it was pending this long")
	fs.BoolVar(&f.killProc, "kill", false, "kill -9 one service process halfway through each run, and start it again")
}

// strategies returns the strategies the flag names.
func (f *runFlags) strategies() []string {
	if f.strategy == "all" {
		return []string{strategyMutex, strategyLua, strategySemaphore}
	}
	return strings.Split(f.strategy, ",")
}

func runMain(args []string, out io.Writer) int {
	fs := flag.NewFlagSet("flashsale", flag.ContinueOnError)
	var f runFlags
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := knownLimiter(f.cfg.service.limiter); err != nil {
		fmt.Fprintln(os.Stderr, "flashsale:", err)
		return 2
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	f.cfg.spawn = func(args []string) *exec.Cmd { return exec.Command(self, append([]string{"serve"}, args...)...) }
	f.cfg.logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	if f.killProc {
		f.cfg.faults = []fault{{at: 0.5, name: "kill -9 svc-1", do: func(r *run) error { return r.kill9(1) }}}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	var reps []*report
	failed := false
	for _, s := range f.strategies() {
		cfg := f.cfg
		cfg.service.strategy = s
		cfg.service.sale = fmt.Sprintf("%s-%d", s, time.Now().UnixNano())
		rep, err := runSale(ctx, cfg)
		if err != nil {
			fmt.Fprintf(os.Stderr, "flashsale: %s: %v\n", s, err)
			failed = true
		}
		if rep != nil {
			reps = append(reps, rep)
			failed = failed || !rep.ok()
		}
	}
	if len(reps) > 0 {
		printReports(out, reps)
	}
	if failed {
		if len(reps) == 0 || allOK(reps) {
			fmt.Fprintln(out, "verdict: FAIL: a run could not be made (see the error above)")
		}
		return 1
	}
	return 0
}

// allOK reports whether every run kept its invariants.
func allOK(reps []*report) bool {
	for _, r := range reps {
		if !r.ok() {
			return false
		}
	}
	return true
}

// ok reports whether the run kept its invariants.
func (rep *report) ok() bool {
	return rep.Oversold == 0 && rep.Leaked == 0 && rep.Lost == 0 && rep.Phantom == 0 &&
		rep.Duplicated == 0 && rep.Failed == 0
}

// printReports prints the runs as two narrow tables, throughput and
// answers, then the invariants, with a legend and a one-line verdict.
// Throughput is given relative to the lua strategy when it ran (the
// reference the docs use), else to the first run.
func printReports(w io.Writer, reps []*report) {
	if len(reps) == 0 {
		fmt.Fprintln(w, "verdict: FAIL: no run completed")
		return
	}
	ref := reps[0]
	for _, r := range reps {
		if r.Strategy == strategyLua {
			ref = r
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "strategy\tanswered/s\tvs %s\tp50\tp99\tsold\tok\tsold out\tlimited\tretried\tfailed\t\n", ref.Strategy)
	for _, r := range reps {
		fmt.Fprintf(tw, "%s\t%.0f\t%.2f\t%v\t%v\t%d\t%d\t%d\t%d\t%d\t%d\t\n",
			r.Strategy, r.Throughput, r.Throughput/ref.Throughput, r.P50.Round(100*time.Microsecond), r.P99.Round(100*time.Microsecond),
			r.Sold, r.Confirmed, r.SoldOut, r.Limited, r.Retries, r.Failed)
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "  sold: units taken from the stock; ok, sold out, limited: final answers;")
	fmt.Fprintln(w, "  retried: requests sent again; failed: no final answer")
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "strategy\trows\toversold\tleaked\tlost\tphantom\tduplicated\trefused\tredelivered\t")
	for _, r := range reps {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n",
			r.Strategy, r.Rows, r.Oversold, r.Leaked, r.Lost, r.Phantom, r.Duplicated, r.Refused, r.Redelivered)
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "  must be 0: oversold (rows beyond units taken, or stock below 0), leaked (units taken without a row),")
	fmt.Fprintln(w, "  lost (ok without a row), phantom (row for a refused request), duplicated (order queued twice);")
	fmt.Fprintln(w, "  not faults: refused (late writes the fence turned away), redelivered (rows written again after a crash,")
	fmt.Fprintln(w, "  no change)")
	for _, r := range reps {
		for _, f := range r.Faults {
			fmt.Fprintf(w, "%s: %s\n", r.Strategy, f)
		}
	}
	var bad []string
	for _, r := range reps {
		if !r.ok() {
			bad = append(bad, r.Strategy)
		}
	}
	if len(bad) > 0 {
		fmt.Fprintf(w, "verdict: FAIL: %s broke an invariant\n", strings.Join(bad, ", "))
		return
	}
	fmt.Fprintf(w, "verdict: PASS: %d runs, every invariant held\n", len(reps))
}
