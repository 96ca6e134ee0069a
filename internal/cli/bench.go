// The dlock bench command: its flags, the subjects and workloads it runs on
// each store, and its report.

package cli

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/bench"
	"github.com/spf13/pflag"
)

// Subjects and workloads of dlock bench, in the order they run, and the
// workloads run when --workloads is not given.
var (
	benchSubjects         = []string{"dlock", "dlock-fair", "dlock-pair", "dlock-fair-pair", "raw"}
	benchWorkloads        = []string{"uncontended", "hot", "keys", "rw", "sem"}
	benchDefaultWorkloads = []string{"uncontended", "hot", "keys"}
)

const (
	// rttSamples is the number of round trips each baseline times.
	rttSamples = 1000
	// rawTTL is the raw Redis baseline's lease: long enough never to expire
	// under a critical section, short enough that a raw lock a killed bench
	// leaves behind soon goes.
	rawTTL = 10 * time.Second
	// keysCS is the critical section of the keys, rw and sem workloads.
	keysCS = 100 * time.Microsecond
)

// benchOptions are the flags of dlock bench.
type benchOptions struct {
	subjects  []string
	workloads []string
	workers   int
	names     int
	writers   int // of rw's workers
	permits   int // of sem
	cs        []time.Duration
	duration  time.Duration
	json      bool
	charts    string        // directory of the SVG charts, or ""
	urls      []*backendURL // the stores, in the order given
}

// benchReport is one store's report as --json writes it: bench.Report with
// the notes on subjects left out.
type benchReport struct {
	bench.Report
	Notes []string `json:"notes,omitempty"`
}

// benchLists are the comma-list flags of dlock bench, as given.
type benchLists struct{ subjects, workloads, cs string }

// benchFlags adds bench's flags to fs, filling o and l.
func benchFlags(fs *pflag.FlagSet, o *benchOptions, l *benchLists) {
	fs.StringVar(&l.subjects, "subjects", strings.Join(benchSubjects, ","), "comma list of dlock, dlock-fair, dlock-pair, dlock-fair-pair, raw")
	fs.StringVar(&l.workloads, "workloads", strings.Join(benchDefaultWorkloads, ","), "comma list of "+strings.Join(benchWorkloads, ", "))
	fs.StringVar(&l.cs, "cs", "0,100us,1ms,10ms", "critical sections of hot, a comma list of durations")
	fs.IntVar(&o.workers, "workers", 8, "workers of hot, keys, rw and sem")
	fs.IntVar(&o.names, "names", 64, "lock names of keys")
	fs.IntVar(&o.writers, "writers", 2, "workers of rw that write; the others read")
	fs.IntVar(&o.permits, "permits", 3, "permits of sem's semaphore")
	durationVar(fs, &o.duration, "duration", 2*time.Second, "length of each run")
	fs.BoolVar(&o.json, "json", false, "a JSON array of reports, one per store")
	fs.StringVar(&o.charts, "charts", "", "write one SVG chart per store and workload into this directory")
}

// benchCommand defines bench's flags on fs and returns what runs it.
func benchCommand(a *app, fs *pflag.FlagSet) runner {
	o := &benchOptions{}
	var l benchLists
	benchFlags(fs, o, &l)
	return func(ctx context.Context, args []string, _ int) error {
		if err := parseBenchArgs(a, o, &l, args); err != nil {
			return err
		}
		return cmdBench(ctx, a, o)
	}
}

// parseBenchArgs checks bench's flags (in o and l) and its store URLs, pos.
func parseBenchArgs(a *app, o *benchOptions, l *benchLists, pos []string) (err error) {
	if o.subjects, err = benchList("--subjects", l.subjects, benchSubjects); err != nil {
		return err
	}
	if o.workloads, err = benchList("--workloads", l.workloads, benchWorkloads); err != nil {
		return err
	}
	for _, s := range strings.Split(l.cs, ",") {
		s = strings.TrimSpace(s)
		d, err := time.ParseDuration(s)
		switch {
		case err != nil:
			return usageErr("bench", "--cs: %q is not a duration (write 0, 100us, 1ms, ...)", printable(s, 40))
		case d < 0:
			return usageErr("bench", "--cs: %v is negative", d)
		}
		if !slices.Contains(o.cs, d) {
			o.cs = append(o.cs, d)
		}
	}
	switch {
	case o.workers < 1:
		return usageErr("bench", "--workers must be at least 1, not %d", o.workers)
	case o.names < 1:
		return usageErr("bench", "--names must be at least 1, not %d", o.names)
	case o.duration <= 0:
		return usageErr("bench", "--duration must be positive, not %v", o.duration)
	case slices.Contains(o.workloads, "rw") && o.workers < 2:
		return usageErr("bench", "--workers must be at least 2 for rw (a writer and a reader), not %d", o.workers)
	case slices.Contains(o.workloads, "rw") && (o.writers < 1 || o.writers >= o.workers):
		return usageErr("bench", "--writers must be between 1 and %d (--workers − 1) for rw, not %d", o.workers-1, o.writers)
	case slices.Contains(o.workloads, "sem") && (o.permits < 1 || o.permits > dlock.MaxPermits):
		return usageErr("bench", "--permits must be between 1 and %d for sem, not %d", dlock.MaxPermits, o.permits)
	}
	if o.charts != "" {
		if fi, err := os.Stat(o.charts); err != nil || !fi.IsDir() {
			return usageErr("bench", "--charts: %q is not a directory", printable(o.charts, 80))
		}
	}
	for _, raw := range pos {
		b, err := parseBackendURL(strings.TrimSpace(raw))
		if err != nil {
			return fail(exitUsage, "store %q: %s", redact(raw), err)
		}
		o.urls = append(o.urls, b)
	}
	if len(o.urls) == 0 {
		b, err := a.backendURL()
		if err != nil {
			return err
		}
		o.urls = []*backendURL{b}
	}
	return nil
}

// benchList parses a comma list of choices from known, without repeats, in
// the order given.
func benchList(name, value string, known []string) ([]string, error) {
	var out []string
	for _, s := range strings.Split(value, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(known, s) {
			return nil, usageErr("bench", "%s: unknown %q; want a comma list of %s", name, printable(s, 40), strings.Join(known, ", "))
		}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out, nil
}

// workloadList returns the runs the options ask for, in order.
func (o *benchOptions) workloadList() []bench.Workload {
	var out []bench.Workload
	for _, w := range o.workloads {
		switch w {
		case "uncontended":
			out = append(out, bench.Workload{Name: "uncontended", Workers: 1, Names: 1, Duration: o.duration})
		case "hot":
			for _, cs := range o.cs {
				out = append(out, bench.Workload{Name: fmt.Sprintf("hot-%dw-cs%v", o.workers, cs),
					Workers: o.workers, Names: 1, CS: cs, Duration: o.duration})
			}
		case "keys":
			out = append(out, bench.Workload{Name: fmt.Sprintf("keys-%dw-%dn-cs%v", o.workers, o.names, keysCS),
				Workers: o.workers, Names: o.names, CS: keysCS, Duration: o.duration})
		case "rw":
			out = append(out, labelled(bench.Workload{Kind: bench.KindRW, Workers: o.workers, Writers: o.writers,
				Names: 1, CS: keysCS, Duration: o.duration}))
		case "sem":
			out = append(out, labelled(bench.Workload{Kind: bench.KindSemaphore, Workers: o.workers, Permits: o.permits,
				Names: 1, CS: keysCS, Duration: o.duration}))
		}
	}
	return out
}

// labelled returns w named by its label.
func labelled(w bench.Workload) bench.Workload {
	w.Name = w.Label()
	return w
}

func cmdBench(ctx context.Context, a *app, o *benchOptions) error {
	// A signal ends the runs under way; the workers' Clients release what
	// they hold as they close.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, sigTerm)
	defer signal.Stop(sigs)
	ctx, stopWatch := cancelOnSignal(ctx, sigs)
	err := a.bench(ctx, o)
	if caught := stopWatch(); caught != nil {
		return fail(exitSignalBase+signalNumber(caught), "%s: bench stopped; locks held were released", signalName(caught))
	}
	return err
}

// bench connects to every store, then benches them one after the other.
func (a *app) bench(ctx context.Context, o *benchOptions) error {
	stores := make([]*store, 0, len(o.urls))
	defer func() {
		for _, st := range stores {
			_ = st.Close()
		}
	}()
	for _, b := range o.urls {
		st, err := connect(ctx, b, a.connectTimeout)
		if err != nil {
			return err
		}
		stores = append(stores, st)
	}
	var (
		reports []benchReport
		errRuns int
	)
	for i, st := range stores {
		rep, err := a.benchStore(ctx, o, o.urls[i], st)
		if err != nil {
			return err
		}
		for _, r := range rep.Results {
			if r.Errors > 0 {
				errRuns++
			}
		}
		if o.charts != "" {
			if _, err := rep.WriteCharts(o.charts, fmt.Sprintf("bench-%d-%s-", i+1, o.urls[i].kind)); err != nil {
				return fail(exitIOErr, "write charts: %v", err)
			}
		}
		if o.json {
			reports = append(reports, rep)
			continue
		}
		if i > 0 {
			fmt.Fprintln(a.stdout)
		}
		if err := rep.WriteTable(a.stdout); err != nil {
			return fail(exitUnavailable, "write table: %v", err)
		}
		for _, n := range rep.Notes {
			fmt.Fprintf(a.stdout, "note: %s\n", n)
		}
	}
	if o.json {
		if err := writeJSON(a.stdout, reports); err != nil {
			return err
		}
	}
	if errRuns > 0 {
		return fail(exitUnavailable, "%d %s had errors (see the errors column)", errRuns, plural(errRuns, "run", "runs"))
	}
	return nil
}

// benchStore measures the store's baselines, then runs every workload on
// every subject, the subjects of a workload one after the other.
func (a *app) benchStore(ctx context.Context, o *benchOptions, b *backendURL, st *store) (benchReport, error) {
	rep := benchReport{Report: bench.Report{Machine: bench.ThisMachine(), Store: st.where, Started: time.Now()}}
	subjects, notes := a.benchSubjects(o, b, st)
	rep.Notes = notes

	base, err := baselines(ctx, st)
	if err != nil {
		return rep, err
	}
	rep.Baselines = base

	workloads := o.workloadList()
	var progress bench.Progress
	if isTerminal(a.stderr) {
		p, clear := bench.LineProgress(a.stderr, len(workloads)*len(subjects))
		defer clear()
		progress = p
	}
	for _, w := range workloads {
		for _, s := range subjects {
			if progress != nil {
				progress(s.Name, w.Name, 0, 0) // LineProgress counts the runs from these calls
			}
			r, err := bench.Run(ctx, s, w, progress)
			if errors.Is(err, bench.ErrKindUnsupported) {
				rep.Notes = append(rep.Notes, kindNote(s.Name, w, b))
				continue
			}
			if err != nil {
				if ctx.Err() != nil {
					return rep, ctx.Err()
				}
				var ee *exitError
				if errors.As(err, &ee) {
					return rep, ee
				}
				return rep, st.storeErr("bench "+s.Name+" "+w.Name, err)
			}
			rep.Results = append(rep.Results, r)
		}
	}
	return rep, nil
}

// kindNote is the note on a subject that cannot run workload w's kind of
// lock on the store b.
func kindNote(subject string, w bench.Workload, b *backendURL) string {
	what := map[string]string{bench.KindRW: "read-write locks", bench.KindSemaphore: "semaphores"}[w.Kind]
	why := fmt.Sprintf("%s stores have no %s", b.kind, what)
	switch {
	case strings.HasPrefix(subject, "dlock-fair"):
		why = fmt.Sprintf("%s stores have no fair %s", b.kind, what)
	case subject == "raw":
		why = "the raw baseline has them on Redis only"
	}
	return fmt.Sprintf("no %s on %s: %s", subject, w.Name, why)
}

// baselines times the store's round trips: PING on Redis (on each node of
// Redlock), SELECT 1 on SQL.
func baselines(ctx context.Context, st *store) (map[string]bench.Percentiles, error) {
	out := map[string]bench.Percentiles{}
	if st.db != nil {
		p, err := bench.SQLRTT(ctx, st.db, rttSamples)
		if err != nil {
			return nil, st.storeErr("baseline", err)
		}
		out["select1"] = p
		return out, nil
	}
	for i, rdb := range st.rdbs {
		p, err := bench.RedisRTT(ctx, rdb, rttSamples)
		if err != nil {
			return nil, st.storeErr("baseline", err)
		}
		name := "ping"
		if len(st.rdbs) > 1 {
			name = fmt.Sprintf("ping-node-%d", i+1)
		}
		out[name] = p
	}
	return out, nil
}

// benchSubjects returns the subjects o asks for on the store, and notes on
// those the store cannot have.
func (a *app) benchSubjects(o *benchOptions, b *backendURL, st *store) ([]bench.Subject, []string) {
	var (
		out   []bench.Subject
		notes []string
	)
	for _, name := range o.subjects {
		switch name {
		case "dlock", "dlock-pair":
			out = append(out, a.dlockSubject(b, st, name, perClient(name)))
		case "dlock-fair", "dlock-fair-pair":
			if c, ok := st.backend.(driver.Capabler); !ok || !c.Supports(driver.CapFair) {
				notes = append(notes, fmt.Sprintf("no %s: %s stores have no fair locks", name, b.kind))
				continue
			}
			out = append(out, a.dlockSubject(b, st, name, perClient(name), dlock.Fair()))
		case "raw":
			s, ok := a.rawSubject(b, st)
			if !ok {
				notes = append(notes, "no raw baseline on Redlock: a lock on a majority of nodes has no one-command floor; "+
					"compare with the ping-node baselines")
				continue
			}
			out = append(out, s)
		}
	}
	return out, notes
}

// perClient returns the workers to a Client of a dlock subject: two for
// the -pair subjects, one otherwise.
func perClient(subject string) int {
	if strings.HasSuffix(subject, "-pair") {
		return 2
	}
	return 1
}

// watchers returns what counts a subject's traffic on st: its round trips
// (Redis), and the store's operations.
func watchers(st *store) (*bench.Trips, bench.Counter, connectHooks) {
	if st.db == nil && len(st.rdbs) == 0 {
		return nil, nil, connectHooks{} // etcd: not counted
	}
	if st.db != nil {
		c := new(bench.StatementCounter)
		return nil, c, connectHooks{statements: c}
	}
	t := new(bench.Trips)
	return t, bench.RedisCounter(st.rdbs), connectHooks{redis: t.RedisHook()}
}

// dlockSubject is dlock's Mutex, made with opts, perClient workers to a
// connection and a Client: with 1, each worker has its own, as separate
// processes would; with 2, pairs of goroutines of one service share one.
func (a *app) dlockSubject(b *backendURL, st *store, name string, perClient int, opts ...dlock.Option) bench.Subject {
	trips, counter, hooks := watchers(st)
	s := bench.DlockShared(name, perClient, func(ctx context.Context, _ int) (driver.Backend, func() error, error) {
		ws, err := connectHooked(ctx, b, a.connectTimeout, hooks)
		if err != nil {
			return nil, nil, err
		}
		return ws.backend, ws.Close, nil
	}, opts...)
	s.Trips, s.Counter = trips, counter
	return graceful(s, a.connectTimeout)
}

// rawSubject is the store's raw baseline, and false on Redlock, which has
// none. etcd's is a put-if-absent transaction with a lease, then a delete.
func (a *app) rawSubject(b *backendURL, st *store) (bench.Subject, bool) {
	trips, counter, hooks := watchers(st)
	var s bench.Subject
	switch b.kind {
	case kindRedis, kindSentinel, kindCluster:
		s = bench.RawRedis("raw", func() redis.UniversalClient {
			rdb := newRedisClient(b, a.connectTimeout, false)
			rdb.AddHook(hooks.redis)
			return rdb
		}, rawTTL)
	case kindEtcd:
		s = bench.RawEtcd("raw", func() (*clientv3.Client, error) { return newEtcdClient(b.etcd, a.connectTimeout) }, rawTTL)
	case kindSQLite, kindMySQL, kindPostgres:
		dialect := map[sqlDialect]string{dialectSQLite: "sqlite", dialectMySQL: "mysql", dialectPostgres: "postgres"}[st.dialect]
		var err error
		s, err = bench.RawSQL("raw", dialect, func() (*sql.DB, error) {
			db, _, err := openSQL(b, a.connectTimeout, hooks.statements)
			return db, err
		})
		if err != nil { // not reached: the dialect is one of the three
			return s, false
		}
	default:
		return s, false
	}
	s.Trips, s.Counter = trips, counter
	return graceful(s, a.connectTimeout), true
}
