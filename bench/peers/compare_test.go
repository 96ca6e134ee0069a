package peers_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/bench/peers"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/bench"
	"github.com/dlock-go/dlock/internal/test/testserver"
	dlockredis "github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/redlock"
)

var (
	flagDuration  = flag.Duration("peers.duration", 300*time.Millisecond, "how long each subject runs each workload")
	flagOut       = flag.String("peers.out", "", "write the report as JSON to this file")
	flagPerClient = flag.Int("peers.per-client", 2, "workers to a Client in dlock-pair and dlock-fair-pair (named dlock-Nper and dlock-fair-Nper when not 2)")
	flagCharts    = flag.String("peers.charts", "", "write one SVG chart per workload of the one-node subjects into this directory (compare-WORKLOAD.svg)")
	flagWorkloads = flag.String("peers.workloads", "uncontended,hot,keys,rw,sem",
		"comma list of workloads: uncontended, hot (8 workers on one name, CS 0/100µs/1ms/10ms), headline (hot with CS 100µs), keys (8 workers over 64 names, CS 100µs), "+
			"rw (8 workers on one RWMutex, 2 writing, CS 100µs), sem (8 workers on a Semaphore of 3, CS 100µs), or a workload's label")
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// workloads returns the workloads the flags select, in the order they run.
func workloads(t *testing.T) []bench.Workload {
	t.Helper()
	var all []bench.Workload
	kinds := map[string][]int{} // kind → indexes into all
	add := func(kind string, w bench.Workload) {
		w.Duration = *flagDuration
		kinds[kind] = append(kinds[kind], len(all))
		if w.Label() == peers.Headline.Label() {
			kinds["headline"] = append(kinds["headline"], len(all))
		}
		all = append(all, w)
	}
	add("uncontended", peers.Uncontended)
	for _, cs := range []time.Duration{0, 100 * time.Microsecond, time.Millisecond, 10 * time.Millisecond} {
		add("hot", bench.Workload{Workers: 8, Names: 1, CS: cs})
	}
	add("keys", bench.Workload{Workers: 8, Names: 64, CS: 100 * time.Microsecond})
	add("rw", peers.RW)
	add("sem", peers.Sem)

	chosen := make([]bool, len(all))
	for _, tok := range strings.Split(*flagWorkloads, ",") {
		tok = strings.TrimSpace(tok)
		if tok == "" {
			continue
		}
		idx, ok := kinds[tok]
		if !ok {
			for i, w := range all {
				if w.Label() == tok {
					idx, ok = []int{i}, true
				}
			}
		}
		if !ok {
			t.Fatalf("-peers.workloads: unknown workload %q", tok)
		}
		for _, i := range idx {
			chosen[i] = true
		}
	}
	var out []bench.Workload
	for i, w := range all {
		if chosen[i] {
			out = append(out, w)
		}
	}
	if len(out) == 0 {
		t.Fatal("-peers.workloads selects no workload")
	}
	return out
}

// runKind runs s on w and returns the result, or false, with s added to
// notRun[w's label], when s's workers do not take w's kind of lock (redsync
// and bsm have no read-write locks or semaphores).
func runKind(t *testing.T, s bench.Subject, w bench.Workload, notRun *notRunList) (bench.Result, bool) {
	t.Helper()
	r, err := bench.Run(t.Context(), s, w, nil)
	if errors.Is(err, bench.ErrKindUnsupported) {
		notRun.add(w.Label(), s.Name)
		return r, false
	}
	if err != nil {
		t.Fatalf("%s %s: %v", s.Name, w.Label(), err)
	}
	return r, true
}

// notRunList is the subjects left out of each workload, in run order.
type notRunList struct {
	order    []string
	subjects map[string][]string
}

func (n *notRunList) add(workload, subject string) {
	if n.subjects == nil {
		n.subjects = map[string][]string{}
	}
	if n.subjects[workload] == nil {
		n.order = append(n.order, workload)
	}
	n.subjects[workload] = append(n.subjects[workload], subject)
}

// write writes a line per workload that left subjects out.
func (n *notRunList) write(w io.Writer) {
	for i, wl := range n.order {
		if i == 0 {
			fmt.Fprintln(w, "\nnot run (no such kind of lock):")
		}
		fmt.Fprintf(w, "  %s: %s\n", wl, strings.Join(n.subjects[wl], ", "))
	}
}

// pairName returns the name of a -pair subject with -peers.per-client
// workers to a Client: "dlock-pair" with 2, "dlock-8per" with 8.
func pairName(subject string) string {
	if *flagPerClient == 2 {
		return subject
	}
	return strings.TrimSuffix(subject, "pair") + strconv.Itoa(*flagPerClient) + "per"
}

// hooked returns a new client of addr whose commands trips counts.
func hooked(addr string, trips *bench.Trips) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	rdb.AddHook(trips.RedisHook())
	return rdb
}

// TestCompare runs dlock (each worker with a Client of its own, and two
// workers to a Client), the raw baseline and every peer variant over the
// same workloads on the same Redis server, then dlock's redlock and
// redsync's Redlock on three nodes, and prints the table and the targets.
// It asserts only that every subject completed grants without errors.
func TestCompare(t *testing.T) {
	ctx := t.Context()
	ws := workloads(t)
	if *flagCharts != "" {
		// Made before the run, not found missing after it.
		if err := os.MkdirAll(*flagCharts, 0o755); err != nil {
			t.Fatalf("-peers.charts: %v", err)
		}
	}

	one := testserver.StartRedis(t)
	var nodes []*testserver.Redis
	for range 3 {
		nodes = append(nodes, testserver.StartRedis(t))
	}

	// One node.
	oneCounter := bench.RedisCounter{one.Client(t)}
	dlockOn := func(name string, perClient int, opts ...dlock.Option) bench.Subject {
		trips := new(bench.Trips)
		s := bench.DlockShared(name, perClient, func(ctx context.Context, id int) (driver.Backend, func() error, error) {
			rdb := hooked(one.Addr(), trips)
			return dlockredis.New(rdb), rdb.Close, nil
		}, opts...)
		s.Counter, s.Trips = oneCounter, trips
		return s
	}
	withTrips := func(s func(trips *bench.Trips) bench.Subject) bench.Subject {
		trips := new(bench.Trips)
		sub := s(trips)
		sub.Counter, sub.Trips = oneCounter, trips
		return sub
	}
	oneNode := []bench.Subject{
		withTrips(func(trips *bench.Trips) bench.Subject {
			return bench.RawRedis(peers.SubjectRaw, func() redis.UniversalClient { return hooked(one.Addr(), trips) }, dlock.DefaultTTL)
		}),
		dlockOn(peers.SubjectDlock, 1),
		dlockOn(peers.SubjectDlockFair, 1, dlock.Fair()),
		dlockOn(pairName(peers.SubjectDlockPair), *flagPerClient),
		dlockOn(pairName(peers.SubjectDlockFairP), *flagPerClient, dlock.Fair()),
		withTrips(func(trips *bench.Trips) bench.Subject {
			return peers.Redsync(peers.SubjectRedsync, func() []redis.UniversalClient {
				return []redis.UniversalClient{hooked(one.Addr(), trips)}
			}, peers.RedsyncDefault()...)
		}),
		withTrips(func(trips *bench.Trips) bench.Subject {
			return peers.Redsync(peers.SubjectRedsyncTune, func() []redis.UniversalClient {
				return []redis.UniversalClient{hooked(one.Addr(), trips)}
			}, peers.RedsyncTuned()...)
		}),
		withTrips(func(trips *bench.Trips) bench.Subject {
			return peers.BSM(peers.SubjectBSM, func() redis.UniversalClient { return hooked(one.Addr(), trips) }, peers.BSMTTL, peers.BSMDefault)
		}),
		withTrips(func(trips *bench.Trips) bench.Subject {
			return peers.BSM(peers.SubjectBSMTuned, func() redis.UniversalClient { return hooked(one.Addr(), trips) }, peers.BSMTTL, peers.BSMTuned)
		}),
	}

	// Three nodes.
	var threeCounter bench.RedisCounter
	for _, n := range nodes {
		threeCounter = append(threeCounter, n.Client(t))
	}
	threeClients := func(trips *bench.Trips) []redis.UniversalClient {
		var cs []redis.UniversalClient
		for _, n := range nodes {
			cs = append(cs, hooked(n.Addr(), trips))
		}
		return cs
	}
	dlockTrips, redsyncTrips := new(bench.Trips), new(bench.Trips)
	dlockRL3 := bench.Dlock(peers.SubjectDlockRL3, func(ctx context.Context, id int) (driver.Backend, func() error, error) {
		cs := threeClients(dlockTrips)
		closeAll := func() error {
			var first error
			for _, c := range cs {
				if err := c.Close(); err != nil && first == nil {
					first = err
				}
			}
			return first
		}
		b, err := redlock.New(cs)
		if err != nil {
			_ = closeAll()
			return nil, nil, err
		}
		return b, closeAll, nil
	})
	dlockRL3.Counter, dlockRL3.Trips = threeCounter, dlockTrips
	redsyncRL3 := peers.Redsync(peers.SubjectRedsyncRL3, func() []redis.UniversalClient { return threeClients(redsyncTrips) }, peers.RedsyncDefault()...)
	redsyncRL3.Counter, redsyncRL3.Trips = threeCounter, redsyncTrips

	// Baselines, measured in this run.
	rep := &bench.Report{Machine: bench.ThisMachine(), Started: time.Now(), Baselines: map[string]bench.Percentiles{}}
	version, err := oneCounter[0].InfoMap(ctx, "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	rep.Store = fmt.Sprintf("redis-server %s on loopback: 1 node; 3 independent nodes for the *-redlock3 rows", version["Server"]["redis_version"])
	ping, err := bench.RedisRTT(ctx, oneCounter[0], 1000)
	if err != nil {
		t.Fatal(err)
	}
	rep.Baselines["ping"] = ping
	for i, c := range threeCounter {
		p, err := bench.RedisRTT(ctx, c, 300)
		if err != nil {
			t.Fatal(err)
		}
		rep.Baselines[fmt.Sprintf("ping-node-%d", i)] = p
	}

	var notRun notRunList
	run := func(s bench.Subject, w bench.Workload) {
		t.Helper()
		if r, ok := runKind(t, s, w, &notRun); ok {
			rep.Results = append(rep.Results, r)
		}
	}
	for _, w := range ws {
		for _, s := range oneNode {
			run(s, w)
		}
	}
	for _, w := range ws {
		if w.Label() == peers.Uncontended.Label() || w.Label() == peers.Headline.Label() {
			run(dlockRL3, w)
			run(redsyncRL3, w)
		}
	}

	var out strings.Builder
	if err := rep.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	notRun.write(&out)
	if err := peers.WriteTargets(&out, rep); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&out, "\ndefault and tuned: redsync default = no options (expiry 8s, 32 tries, retry delay rand[50ms,250ms)); "+
		"redsync-tuned = retry delay rand[%v,%v), 1<<20 tries; bsm-redislock = LinearBackoff(%v); bsm-redislock-tuned = LinearBackoff(%v); bsm TTL %v\n",
		peers.RedsyncTunedDelay/2, peers.RedsyncTunedDelay, peers.BSMDefaultBackoff, peers.BSMTunedBackoff, peers.BSMTTL)
	fmt.Print(out.String()) // go test shows it with -v, or when the test fails

	if *flagCharts != "" {
		// The one-node subjects: Redlock's rows are another store.
		one := *rep
		one.Results = nil
		for _, r := range rep.Results {
			if r.Subject != peers.SubjectDlockRL3 && r.Subject != peers.SubjectRedsyncRL3 {
				one.Results = append(one.Results, r)
			}
		}
		if _, err := one.WriteCharts(*flagCharts, "compare-"); err != nil {
			t.Fatal(err)
		}
	}
	if *flagOut != "" {
		f, err := os.Create(*flagOut)
		if err != nil {
			t.Fatal(err)
		}
		if err := rep.WriteJSON(f); err != nil {
			_ = f.Close()
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}

	for _, r := range rep.Results {
		if r.Grants == 0 || r.Errors != 0 {
			t.Errorf("%s %s: %d grants, %d errors (first: %s)", r.Subject, r.Workload, r.Grants, r.Errors, r.FirstError)
		}
	}
}
