package chaostest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/locktest/chaos"
)

// Defaults of a scenario.
const (
	defaultClients  = 3
	defaultTTL      = 500 * time.Millisecond
	defaultThink    = 30 * time.Millisecond
	defaultDuration = 2 * time.Second // a short run
	// soakOps is the least number of critical sections a soak run makes.
	soakOps = 10_000
	// soakLimit bounds a soak run, which ends at soakOps.
	soakLimit = 30 * time.Minute
	// shortStock is the starting stock of a short run: it never sells out.
	shortStock = 1_000_000
	// leftoverSlack is added to the wait for leases of unknown fate to
	// expire, for a loaded machine.
	leftoverSlack = 2 * time.Second
)

// violation is a set of pass criteria (docs/SAFETY.md, "Scenarios and pass criteria") that a scenario may, or
// must, be seen to break.
type violation uint

const (
	// late: accepted writes after the writer's lease ended (LateWrites): a
	// holder that ignores its lost lease, or is paused, writes late. On an
	// unfenced resource it brings what late writes cause: lost updates,
	// stale accesses accepted, a stock below zero, a history that is not
	// linearizable.
	late violation = 1 << iota
	// overlap: windows of two leases of one name valid at once (Overlaps),
	// as when the store's clock runs faster than the client's beyond the
	// drift allowance; on an unfenced resource with the same consequences
	// as late.
	overlap
	// fenceLoss: fences that go back or repeat (the store forgot its fence
	// counters, as a redis without persistence that restarts); with it even
	// a fenced resource may accept stale accesses and lose updates.
	fenceLoss
	// lateLoss: losses reported to their holder after the lease's local
	// deadline (a holder that was paused cannot hear of its loss in time).
	lateLoss
)

// expect says which criteria a scenario may break and which it must be
// seen to break, and why (printed with the counts).
type expect struct {
	why  string
	may  violation // broken criteria that do not fail the run
	must violation // criteria the check must find broken (implies may)
}

// scenario is one run of clients against one store while faults are
// injected, checked afterwards.
type scenario struct {
	store      *store
	label      string         // the summary's scenario column; "": the test's name
	clients    int            // in-process clients; default 3
	perClient  int            // workers of each client, as goroutines of one service; default 1
	specs      []storeSpec    // client i's way to the store when set (its own proxy); default store.spec
	names      []string       // default two names (eight in a soak)
	workload   chaos.Workload // chaos.Stock or chaos.Set
	fenced     bool
	targets    []chaos.Target // default: Exclusive on each name
	ttl        time.Duration  // default 500ms
	think      time.Duration  // longest sleep inside a critical section; default 30ms
	ignoreLoss bool
	cancelRate float64
	// cancelWithin is the longest delay of an injected cancellation
	// (Worker.CancelWithin); 0: the worker's default, 2ms.
	cancelWithin time.Duration
	observe      []chaos.ObserveOption
	lockOpts     []dlock.Option // options of every client (WithTTL(ttl) comes first)
	// clientOpts, when set, gives client i (from 0) options of its own,
	// after lockOpts.
	clientOpts func(i int) []dlock.Option
	fair       bool          // process scenarios: every lock, the children's too, is a Fair Mutex
	ops        int           // critical sections to run; 0: until duration ends (a soak makes at least soakOps)
	duration   time.Duration // length of a short run; default 2s
	backoff    time.Duration // pause after a failed acquire; default chaos.Run's
	// wait is every lock's WithWait (after lockOpts); 0: a Lock waits
	// until the run ends.
	wait time.Duration
	// waitsHold fails the run when a wait ended early: an acquire that
	// returned an error while its wait had time left (an injected
	// cancellation aside). The count is logged for every run.
	waitsHold bool
	// idleBound, when set, fails the run when a name sat free after a
	// release, while a waiter waited, for longer than it (see idleTimes).
	// The longest such time is logged for every run.
	idleBound time.Duration
	// watchHeads reads the store's holders and queue heads while the run
	// goes on and until the clients closed, and fails the run when one
	// was a token whose clean-up had been answered (checkNobody); the
	// store must have store.heads.
	watchHeads bool
	expect     expect
	// setup runs after the clients and workers are made, before they
	// start (to set a worker's BeforeWrite, say).
	setup func(r *runState)
	// faults runs on the test goroutine while the workers run, and must
	// leave the store healthy when it returns (partitions healed, servers
	// up); ctx ends when the run does. It notes every fault it injects
	// with r.rec.Note.
	faults func(ctx context.Context, r *runState)
	// extra checks more after the run (e.g. crash: freed after TTL).
	extra func(t *testing.T, r *runState)
}

// runState is a scenario while it runs, for faults, setup and extra.
type runState struct {
	t       *testing.T
	sc      *scenario
	store   *store
	rec     *chaos.Recorder
	res     *chaos.Resource
	clients []*dlock.Client
	workers []*chaos.Worker
	report  *chaos.Report // set after the run, for extra
	soak    bool
	// end ends the run early: the workers stop as they would at the end
	// of its duration (for faults that have done all they came for).
	end context.CancelFunc
}

// sleep waits d or until ctx ends, on the calling goroutine; it reports
// whether d passed.
func (r *runState) sleep(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// runScenario runs sc and checks it: the workers run until the run's
// duration (or, in a soak, soakOps critical sections) while sc.faults
// injects faults; then every client is closed, the history is checked
// against the pass criteria as sc.expect allows, and the store must
// be left empty. The report is logged in plain words and added to the
// summary; on a failure the history and the report are written to the
// -chaos.out directory.
func runScenario(t *testing.T, sc scenario) *chaos.Report {
	t.Helper()
	s := sc.store
	if sc.clients == 0 {
		sc.clients = defaultClients
	}
	if len(sc.names) == 0 {
		sc.names = []string{"a", "b"}
		if *soak {
			sc.names = []string{"a", "b", "c", "d", "e", "f", "g", "h"}
		}
	}
	if sc.ttl == 0 {
		sc.ttl = defaultTTL
	}
	if sc.think == 0 {
		sc.think = defaultThink
	}
	if sc.duration == 0 {
		sc.duration = defaultDuration
	}
	if len(sc.targets) == 0 {
		for _, n := range sc.names {
			sc.targets = append(sc.targets, chaos.Target{Name: n, Mode: chaos.Exclusive})
		}
	}
	sc.expect.may |= sc.expect.must
	failedBefore := t.Failed()
	ops := sc.ops
	if *soak {
		ops = max(ops, soakOps)
	}
	var names []string
	for _, tg := range sc.targets {
		names = append(names, tg.Name)
	}
	s.track(names...)

	rec := chaos.NewRecorder()
	res := chaos.NewResource(rec, sc.fenced)
	stock := int64(shortStock)
	if *soak {
		// Sells out near the end of the run, so that "never below zero"
		// is put to the test.
		stock = int64(ops * 9 / 10 / len(distinct(names)))
	}
	for _, tg := range sc.targets {
		switch sc.workload {
		case chaos.Set:
			res.Init(tg.Name, chaos.Value{})
		default:
			res.Init(tg.Name, chaos.Value{Stock: stock})
		}
	}

	r := &runState{t: t, sc: &sc, store: s, rec: rec, res: res, soak: *soak}
	for i := range sc.clients {
		spec := s.spec
		if i < len(sc.specs) && sc.specs[i].Kind != "" {
			spec = sc.specs[i]
		}
		name := fmt.Sprintf("c%d", i+1)
		opts := append([]dlock.Option{dlock.WithTTL(sc.ttl)}, sc.lockOpts...)
		if sc.clientOpts != nil {
			opts = append(opts, sc.clientOpts(i)...)
		}
		if sc.wait > 0 {
			opts = append(opts, dlock.WithWait(sc.wait))
		}
		c := s.clientOn(t, spec, rec, name, sc.observe, opts...)
		r.clients = append(r.clients, c)
		for range max(sc.perClient, 1) {
			r.workers = append(r.workers, &chaos.Worker{
				ID: len(r.workers) + 1, Client: name, Locks: c, Resource: res, Sink: rec,
				Workload: sc.workload, Think: sc.think, IgnoreLoss: sc.ignoreLoss,
				CancelRate: sc.cancelRate, CancelWithin: sc.cancelWithin,
			})
		}
	}
	if sc.setup != nil {
		sc.setup(r)
	}

	limit := sc.duration
	if *soak {
		limit = soakLimit
	}
	start := time.Now()
	// runEnd is when the run's context ended: waits cut short then ended
	// with the run, not early. AfterFunc notes it a moment late, after
	// waits may have returned; the deadline's time, taken before the
	// context is made, is not later than the deadline itself.
	var runEnd atomic.Int64
	runEnd.Store(chaos.Now() + int64(limit))
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	r.end = cancel
	stopRunEnd := context.AfterFunc(ctx, func() {
		if now := chaos.Now(); now < runEnd.Load() {
			runEnd.Store(now)
		}
	})
	defer stopRunEnd()
	var heads func() (int, []headSight)
	if sc.watchHeads {
		if s.heads == nil {
			t.Fatalf("scenario %s watches the store's queue heads, which %s cannot show", scenarioName(t, sc), s.name)
		}
		wctx, wcancel := context.WithCancel(t.Context())
		h := watchHeads(wctx, r)
		defer func() { wcancel(); h() }()
		heads = func() (int, []headSight) {
			wcancel()
			return h()
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer cancel() // ends the faults when the workers are done
		chaos.Run(ctx, r.workers, sc.targets, ops, sc.backoff)
	}()
	// Stop the workers even when faults fails the test.
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	defer stop()
	if sc.faults != nil {
		sc.faults(ctx, r)
	}
	<-done
	stop()
	elapsed := time.Since(start)

	for i, c := range r.clients {
		if err := c.Close(); err != nil {
			t.Logf("close client c%d: %v", i+1, err)
		}
	}
	events := rec.Events()
	report := chaos.Check(events, chaos.CheckOptions{})
	r.report = report

	t.Logf("%s on %s, %s, %d clients, %d names, TTL %v, think ≤ %v: ran %v",
		scenarioName(t, sc), s.name, workloadName(sc), sc.clients, len(distinct(names)), sc.ttl, sc.think, elapsed.Round(time.Millisecond))
	t.Logf("report:\n%s", report.String())
	verdict, ok := assess(t, sc, report, ops)
	waits := checkWaits(t, sc, events, runEnd.Load())
	if !waits.ok {
		ok = false
	}
	if !checkLeftovers(t, sc, events) {
		ok = false
	}
	if heads != nil {
		reads, sights := heads()
		if !checkNobody(t, reads, sights, events) {
			ok = false
		}
	}
	if sc.extra != nil {
		sc.extra(t, r)
	}
	// t.Failed covers extra's checks, unless an earlier run of the same
	// test had failed already.
	if !ok || t.Failed() && !failedBefore {
		verdict = "FAIL"
		writeFailure(t, report, events)
	}
	addRow(t, sc, report, waits, verdict)
	return report
}

// judge asserts the pass criteria that sc.expect does not
// waive, and returns the result column of the summary.
func judge(t *testing.T, sc scenario, rp *chaos.Report, ops int) string {
	t.Helper()
	verdict, _ := assess(t, sc, rp, ops)
	return verdict
}

// assess is judge, and also reports whether the criteria held.
func assess(t *testing.T, sc scenario, rp *chaos.Report, ops int) (string, bool) {
	t.Helper()
	may, must := sc.expect.may, sc.expect.must
	// What may be broken on the resource: an unfenced resource takes
	// whatever a late or overlapping holder sends; a fenced one only
	// when fences themselves went wrong.
	harm := may&fenceLoss != 0 || (!sc.fenced && may&(late|overlap) != 0)
	counts := fmt.Sprintf("(grants %d, overlaps %d, late writes %d, lost updates %d, stale accepted %d, stale rejected %d, negative stock %d, "+
		"fence regressions %d, duplicate fences %d, late loss reports %d, not linearizable %v)",
		rp.Grants, len(rp.Overlaps), rp.LateWrites, rp.LostUpdates, rp.StaleAccepted, rp.StaleRejected, rp.NegativeStock,
		rp.FenceRegressions, rp.DuplicateFences, rp.LateLossReports, rp.NonLinearizable)
	ok := true
	fail := func(format string, args ...any) {
		t.Helper()
		ok = false
		t.Errorf("%s %s", fmt.Sprintf(format, args...), counts)
	}

	if rp.Grants == 0 || rp.Reads == 0 {
		fail("the run proves nothing: %d grants, %d reads", rp.Grants, rp.Reads)
	}
	if *soak && rp.Grants < ops {
		fail("soak: %d grants, want at least %d", rp.Grants, ops)
	}
	// Criterion 1 is about fenced resources. An unfenced one accepts
	// stale accesses by design (and the reads of concurrent readers of
	// an RWMutex, whose fences need not come in the order they read);
	// what harm they do shows as overlaps, late writes and lost updates.
	if rp.StaleAccepted > 0 && sc.fenced && may&fenceLoss == 0 {
		fail("the fenced resource accepted %d stale accesses", rp.StaleAccepted)
	}
	if len(rp.Overlaps) > 0 && may&overlap == 0 {
		fail("%d exclusion violations (listed in the report)", len(rp.Overlaps))
	}
	if rp.LateWrites > 0 && may&late == 0 {
		fail("%d writes accepted after their lease ended", rp.LateWrites)
	}
	if !harm {
		if rp.LostUpdates > 0 {
			fail("%d lost updates", rp.LostUpdates)
		}
		if rp.NegativeStock > 0 {
			fail("the stock went below zero %d times", rp.NegativeStock)
		}
		if len(rp.NonLinearizable) > 0 {
			fail("histories not linearizable: %v", rp.NonLinearizable)
		}
	}
	if may&fenceLoss == 0 && (rp.FenceRegressions > 0 || rp.DuplicateFences > 0) {
		fail("fences went back %d times and repeated %d times", rp.FenceRegressions, rp.DuplicateFences)
	}
	if rp.LateLossReports > 0 && may&lateLoss == 0 {
		fail("%d losses reported to their holder after the lease's local deadline", rp.LateLossReports)
	}
	// A search that timed out checked nothing: it passes only where a
	// history that is not linearizable would.
	if len(rp.Unchecked) > 0 {
		if harm {
			t.Logf("porcupine timed out on %v: not checked for linearizability (allowed: %s)", rp.Unchecked, sc.expect.why)
		} else {
			fail("porcupine timed out on %v: not checked for linearizability", rp.Unchecked)
		}
	}

	verdict := "ok"
	var found []string
	if must&late != 0 {
		if rp.LateWrites == 0 {
			fail("expected: %s; but the check found no late write", sc.expect.why)
		}
		found = append(found, fmt.Sprintf("%d late writes, %d lost updates", rp.LateWrites, rp.LostUpdates))
	}
	if must&overlap != 0 {
		if len(rp.Overlaps) == 0 {
			fail("expected: %s; but the check found no overlap", sc.expect.why)
		}
		found = append(found, fmt.Sprintf("%d overlaps, %d lost updates", len(rp.Overlaps), rp.LostUpdates))
	}
	if must&fenceLoss != 0 {
		if rp.FenceRegressions+rp.DuplicateFences == 0 {
			fail("expected: %s; but the check found no fence going back or repeating", sc.expect.why)
		}
		found = append(found, fmt.Sprintf("%d fence regressions, %d duplicate fences", rp.FenceRegressions, rp.DuplicateFences))
	}
	if must&lateLoss != 0 {
		if rp.LateLossReports == 0 {
			fail("expected: %s; but the check found no late loss report", sc.expect.why)
		}
		found = append(found, fmt.Sprintf("%d late loss reports", rp.LateLossReports))
	}
	switch {
	case len(found) > 0:
		t.Logf("expected: %s; found %s", sc.expect.why, strings.Join(found, "; "))
		verdict = "ok (expected violations found)"
	case may != 0:
		broke := rp.LateWrites + len(rp.Overlaps) + rp.LostUpdates + rp.StaleAccepted + rp.FenceRegressions + rp.DuplicateFences + rp.LateLossReports
		t.Logf("allowed: %s; found %d late writes, %d overlaps, %d lost updates, %d stale accepted", sc.expect.why,
			rp.LateWrites, len(rp.Overlaps), rp.LostUpdates, rp.StaleAccepted)
		if broke > 0 {
			verdict = "ok (allowed violations found)"
		}
	}
	return verdict, ok
}

// checkLeftovers fails the test when the store keeps anything of a lock
// after every client released and closed. Leases whose fate a client could
// not know (a store call that ended in an error: the store may have acted
// on it) are waited for until they expire, TTL and slack later; nothing
// else is waited for but a backend's documented background work
// (store.settle). After a lost lease, expired holds do not count. It
// reports whether the store was found empty.
func checkLeftovers(t *testing.T, sc scenario, events []chaos.Event) bool {
	t.Helper()
	s := sc.store
	unknown, lost := 0, 0
	for _, e := range events {
		switch e.Kind {
		case chaos.KindStoreAcquire, chaos.KindStoreRenew, chaos.KindStoreRelease:
			if e.Outcome == chaos.Unknown {
				unknown++
			}
		case chaos.KindLoss:
			lost++
		}
	}
	list, limit := s.leftovers, s.settle
	if unknown == 0 && lost > 0 {
		// A lease that ran out before its Unlock leaves its expired hold
		// where the store keeps expired ones (SQL rows): only live ones
		// count.
		list = s.live
	}
	if unknown > 0 {
		// The store drops them at their TTL (twice it, for a store
		// clock slowed by WithStoreClockRate); SQL rows stay, expired.
		list, limit = s.live, 2*sc.ttl+s.settle+leftoverSlack
	}
	deadline := time.Now().Add(limit)
	for {
		left := list(t)
		if len(left) == 0 {
			return true
		}
		if time.Now().After(deadline) {
			if unknown > 0 {
				t.Errorf("left on the store %v after the last client closed (waited for %d store calls of unknown outcome to expire): %q", limit, unknown, left)
			} else {
				t.Errorf("left on the store after the last client closed: %q", left)
			}
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// scenarioName is sc.label, or the name of the top-level test without
// "Test".
func scenarioName(t *testing.T, sc scenario) string {
	if sc.label != "" {
		return sc.label
	}
	name, _, _ := strings.Cut(t.Name(), "/")
	return strings.ToLower(strings.TrimPrefix(name, "Test"))
}

// workloadName describes the workload and the resource: "stock fenced".
func workloadName(sc scenario) string {
	w := "stock"
	if sc.workload == chaos.Set {
		w = "set"
	}
	if sc.fenced {
		w += " fenced"
	} else {
		w += " unfenced"
	}
	for _, tg := range sc.targets {
		switch {
		case tg.Mode == chaos.Shared || tg.RW:
			return w + ", rw"
		case tg.Mode == chaos.Permit:
			return w + ", semaphore"
		}
	}
	return w
}

// The output directory of failures: -chaos.out, or one made on first use.
var (
	outOnce sync.Once
	outPath string
	outErr  error
)

// failureDir returns the directory of the current test's failure files.
func failureDir(t *testing.T) (string, error) {
	outOnce.Do(func() {
		outPath = *outDir
		if outPath == "" {
			outPath, outErr = os.MkdirTemp("", "dlock-chaos-")
			return
		}
		outErr = os.MkdirAll(outPath, 0o755)
	})
	if outErr != nil {
		return "", outErr
	}
	dir := filepath.Join(outPath, unsafeChars.ReplaceAllString(t.Name(), "_"))
	for i := 2; ; i++ {
		if _, err := os.Stat(dir); os.IsNotExist(err) {
			break
		}
		dir = filepath.Join(outPath, fmt.Sprintf("%s-%d", unsafeChars.ReplaceAllString(t.Name(), "_"), i))
	}
	return dir, os.MkdirAll(dir, 0o755)
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// writeFailure writes the history and the report of a failed run.
func writeFailure(t *testing.T, rp *chaos.Report, events []chaos.Event) {
	t.Helper()
	dir, err := failureDir(t)
	if err != nil {
		t.Logf("cannot write the failure files: %v", err)
		return
	}
	files, err := rp.WriteFiles(dir, events)
	if err != nil {
		t.Logf("write the failure files to %s: %v", dir, err)
	}
	t.Logf("history and report of the failed run: %s", strings.Join(files, " "))
}

// row is one line of the summary TestMain prints.
type row struct {
	scenario, backend, workload string
	ops, grants, overlaps       int
	staleRejected, staleAcc     int
	late, lost, losses          int
	lateLoss                    int
	waits                       waitStats
	nonLinear, unchecked        []string // names porcupine rejected, and timed out on
	result                      string
}

var (
	summaryMu sync.Mutex
	summary   []row
)

// addRow adds a run to the summary.
func addRow(t *testing.T, sc scenario, rp *chaos.Report, w waitStats, result string) {
	summaryMu.Lock()
	defer summaryMu.Unlock()
	summary = append(summary, row{
		scenario: scenarioName(t, sc), backend: sc.store.name, workload: workloadName(sc),
		ops: rp.Grants + rp.AcquireFailed + rp.AcquireUnknown, grants: rp.Grants, overlaps: len(rp.Overlaps),
		staleRejected: rp.StaleRejected, staleAcc: rp.StaleAccepted, late: rp.LateWrites, lost: rp.LostUpdates,
		losses: rp.Losses, lateLoss: rp.LateLossReports, nonLinear: rp.NonLinearizable, unchecked: rp.Unchecked,
		waits: w, result: result,
	})
}

// printSummary writes the summary table to stdout (go test shows it with
// -v, or when the package fails).
func printSummary() {
	summaryMu.Lock()
	defer summaryMu.Unlock()
	if len(summary) == 0 {
		return
	}
	mode := "short"
	if *soak {
		mode = "soak"
	}
	fmt.Printf("\nchaos summary (%s runs; ops = acquire attempts):\n", mode)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "scenario\tbackend\tworkload\tops\tgrants\toverlaps\tstale rejected\tstale accepted\tlate writes\tlost updates\tlosses\tlate loss reports\tearly wait fails\tmax idle\tlinearizable\tresult\t")
	for _, r := range summary {
		lin := "yes"
		if len(r.nonLinear) > 0 {
			lin = "NO: " + strings.Join(r.nonLinear, ",")
		}
		if len(r.unchecked) > 0 {
			if len(r.nonLinear) > 0 {
				lin += "; "
			} else {
				lin = ""
			}
			lin += "timed out: " + strings.Join(r.unchecked, ",")
		}
		early, idle := "-", "-"
		if r.waits.checked {
			early, idle = strconv.Itoa(r.waits.early), r.waits.maxIdle.Round(time.Millisecond).String()
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t\n",
			r.scenario, r.backend, r.workload, r.ops, r.grants, r.overlaps, r.staleRejected, r.staleAcc, r.late, r.lost, r.losses, r.lateLoss,
			early, idle, lin, r.result)
	}
	_ = w.Flush()
}
