//go:build linux

package chaostest

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/locktest/chaos"
)

// The scenarios of this file run a lock holder in a child process (the test
// binary run again, see childMain) so that it can be paused with SIGSTOP or
// killed with SIGKILL while it holds, as a real process can be: a long GC
// pause, a stopped VM or container, a crash. The child records its lease
// and store events into the parent's Recorder and reaches the parent's
// Resource over HTTP on loopback; the host's monotonic clock, shared by
// every process, orders its events with the parent's.
//
// In-process workers take the same lock throughout. A gate holds them back
// while the child acquires (so that a child that polls is not starved by
// workers that relock at once) and lets them wait in Lock while the child
// holds; other names carry load that the gate leaves alone.

// Settings of the process scenarios.
const (
	procThink = 2 * time.Millisecond // workers' think time, short: the load must be cheap
	// pauseRounds and crashRounds are the pauses per phase and the crashes
	// per backend of a short run; a soak makes at least procSoakRounds of
	// each, and goes on until it has made soakOps critical sections.
	pauseRounds    = 2
	crashRounds    = 2
	procSoakRounds = 25
	// procWait bounds every wait for something a child, a worker or the
	// store must do: generous, for a loaded machine.
	procWait = 30 * time.Second
	// crashSlack is how long after the kill, beyond the TTL, a waiting
	// in-process client may take to get the lock.
	crashSlack = 5 * time.Second
	// storeClockSlack allows for the store's clock: redis expires keys on
	// whole milliseconds, and CLOCK_REALTIME, which the stores read, is not
	// CLOCK_MONOTONIC, which the events carry.
	storeClockSlack = 2 * time.Millisecond
)

// procName is the lock the child and the gated workers take; loadNames
// are the others, taken by the workers alone.
const procName = "p"

func loadNames() []string {
	if *soak {
		return []string{"a", "b", "c", "d", "e", "f", "g"}
	}
	return []string{"a"}
}

// TestPause pauses a child that holds the lock, between its read and its
// write, for longer than the TTL (SIGSTOP); in-process clients take the
// lock once the store has expired the child's lease and make their own
// read and write; then the child is resumed (SIGCONT) and writes. A paused
// process cannot know that its lease ended: on a fenced resource its late
// write must be refused; on an unfenced one it is accepted, and the check
// must find it (a late write, a stale write accepted, a lost update).
func TestPause(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			s := startStore(t, kind, storeOptions{})
			for _, fenced := range []bool{true, false} {
				name := "unfenced"
				if fenced {
					name = "fenced"
				}
				t.Run(name, func(t *testing.T) { runPause(t, s, fenced) })
			}
		})
	}
}

// TestCrash kills (SIGKILL) a child process that holds the lock while
// in-process clients wait for it: the lock must come free at the store's
// TTL, not before the child's lease could have expired and not long after,
// with no exclusion violated and nothing left on the store.
func TestCrash(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) { runCrash(t, startStore(t, kind, storeOptions{})) })
	}
}

// pauseResult is what one pause did, as the child tells it, and when the
// parent stopped and resumed it (chaos.Now).
type pauseResult struct {
	lease              string
	fence              uint64
	wrote, stale, lost bool
	stopped, resumed   int64
}

func runPause(t *testing.T, s *store, fenced bool) {
	sc := procScenario(s, "pause", fenced)
	sc.expect = expect{
		why: "a holder paused past its TTL cannot know that its lease ended: it writes after the store gave the lock to another client" +
			" (and hears of its loss only once resumed, after the lease's deadline)",
		may: lateLoss,
	}
	if !fenced {
		sc.expect.must = late
		sc.expect.may |= late
	}
	r := startProcRun(t, sc)
	c := r.startChild(rolePause)
	c.expectLine(t, "ready")

	var results []pauseResult
	rounds := pauseRounds
	if *soak {
		rounds = procSoakRounds
	}
	for i := 0; i < rounds || (*soak && r.grants.Load() < soakOps); i++ {
		results = append(results, r.pauseRound(c, i+1))
		if *soak {
			// Let the load run between pauses, so that the pauses are
			// spread over the soak's critical sections.
			want := min(int64(soakOps), int64(i+1)*soakOps/int64(rounds))
			r.waitFor(t, fmt.Sprintf("%d critical sections", want), soakLimit, func() bool { return r.grants.Load() >= want })
		}
	}
	c.send(t, "exit")
	c.expectLine(t, "bye")
	c.waitExit(t, 0)

	rp, events := r.finish()
	checkPausesHeld(t, sc, c.client(), results, events)
	for i, res := range results {
		switch {
		case fenced && (res.wrote || !res.stale):
			t.Errorf("pause %d: the fenced resource did not refuse the paused child's late write (lease %s, fence %d: wrote %t, refused %t)", i+1, res.lease, res.fence, res.wrote, res.stale)
		case !fenced && !res.wrote:
			t.Errorf("pause %d: the unfenced resource did not take the paused child's late write (lease %s, fence %d)", i+1, res.lease, res.fence)
		}
	}
	n := len(results)
	if fenced {
		if rp.StaleRejected < n {
			t.Errorf("the fenced resource refused %d stale accesses, want at least %d (one late write per pause)", rp.StaleRejected, n)
		}
		if rp.LateWrites != 0 {
			t.Errorf("%d late writes accepted by the fenced resource", rp.LateWrites)
		}
		for name, sum := range rp.Names {
			if sum.Final.Stock != sum.Initial.Stock-int64(sum.Writes) {
				t.Errorf("%q: stock %d -> %d after %d accepted writes: not one unit per write", name, sum.Initial.Stock, sum.Final.Stock, sum.Writes)
			}
		}
		t.Logf("fenced: %d pauses, every late write refused (%d stale accesses refused), 0 stale accepted", n, rp.StaleRejected)
	} else {
		// Each pause makes one late write, at a fence below the one the
		// resource last took, and loses at least one update: its own (it
		// was computed from a value read before the pause), and sometimes
		// the next holder's, whose read it may come between.
		if rp.LateWrites < n || rp.StaleAccepted < n || rp.LostUpdates < n {
			t.Errorf("unfenced: %d pauses, want at least as many late writes, stale writes accepted and lost updates; found %d late writes, %d stale accepted, %d lost updates",
				n, rp.LateWrites, rp.StaleAccepted, rp.LostUpdates)
		}
		sum := rp.Names[procName]
		t.Logf("EXPECTED, as the scenario is built to show: on the unfenced resource each of the %d paused holders wrote after its lease had ended"+
			" (%d late writes, %d stale writes accepted, %d updates lost, %d units of %q sold twice, not linearizable: %v); a paused process cannot know its lease ended,"+
			" only a fenced resource can refuse it",
			n, rp.LateWrites, rp.StaleAccepted, rp.LostUpdates, sum.Final.Stock-(sum.Initial.Stock-int64(sum.Writes)), procName, rp.NonLinearizable)
	}
	checkLateLossReports(t, events)
}

// checkLateLossReports fails the test when a loss was reported late to an
// in-process client: only the paused children may hear of theirs late.
func checkLateLossReports(t *testing.T, events []chaos.Event) {
	t.Helper()
	for _, e := range events {
		if e.Kind == chaos.KindLoss && e.Deadline != 0 && e.End > e.Deadline && !e.ReadTold && !isChild(e.Client) {
			t.Errorf("%s heard of the loss of lease %s %v after its local deadline, without being paused", e.Client, e.Lease, time.Duration(e.End-e.Deadline))
		}
	}
}

// pauseRound runs one critical section in the child c and pauses it before
// its write until in-process clients have written under a lease granted
// after the child's lease could have expired on the store.
//
// The child must stay stopped all that time: if it ran, it would renew its
// lease (and the in-process clients would wait for it), and a write it made
// would be one under a valid lease, not a late one. So the line that lets
// it write is only sent just before SIGCONT, and the test fails at once,
// with the facts, if the child is seen running or its events show it ran
// before that.
func (r *procRun) pauseRound(c *childProc, round int) pauseResult {
	t := r.t
	r.gate.close(t)
	c.send(t, "step")
	var (
		fence uint64
		held  bool
	)
	c.scan(t, "paused fence=%d held=%t", &fence, &held)
	if !held {
		t.Fatalf("%s: its lease (fence %d) was lost before the pause", c.client(), fence)
	}
	c.stopAtRest(t)
	stopped := chaos.Now()
	r.rec.Note("SIGSTOP %s before its write, holding fence %d", c.client(), fence)
	r.gate.open()
	pid := c.cmd.Process.Pid
	var (
		ran   string          // what showed that the child ran, if it did
		state pauseWatchState // the watch's state when the wait ended
	)
	r.waitFor(t, "an in-process client to write after the pause, under a lease granted after the child's could have expired on the store", procWait, func() bool {
		state = r.watch.pauseState()
		switch {
		case state.childLast.Start > stopped:
			ran = fmt.Sprintf("it recorded %s %s %v after the stop", state.childLast.Kind, state.childLast.Name, time.Duration(state.childLast.Start-stopped))
		case !processStopped(pid):
			ran = "its process was found running " + time.Duration(chaos.Now()-stopped).Round(100*time.Microsecond).String() + " after the stop (thread states: " + taskStates(pid) + ")"
		}
		return ran != "" || state.freshWrite(stopped, r.sc.ttl)
	})
	if ran == "" && !allStopped(pid) {
		ran = "not all of its threads were stopped when the in-process clients had written (thread states: " + taskStates(pid) + ")"
	}
	if ran != "" {
		r.pauseBroken(c, "pause %d: %s ran while it was to be stopped (holding fence %d, before its write): %s."+
			" This test had stopped it (every thread was seen stopped) and had not resumed it: something else sent it SIGCONT (a debugger, kill -CONT;"+
			" it runs in a process group of its own, which job control and the kernel's SIGCONT to an orphaned group do not reach)."+
			" Its last store acquire or renewal was sent %v before the stop. A pause that did not hold proves nothing: stopping here",
			round, c.client(), fence, ran, time.Duration(stopped-state.childSent).Round(100*time.Microsecond))
	}
	r.rec.Note("SIGCONT %s: in-process clients have taken the lock and written", c.client())
	resumed := chaos.Now()
	c.send(t, "go") // waits in the pipe for the SIGCONT: the write follows it at once
	c.signal(t, syscall.SIGCONT)
	res := pauseResult{stopped: stopped, resumed: resumed}
	c.scan(t, "done lease=%s fence=%d wrote=%t stale=%t lost=%t", &res.lease, &res.fence, &res.wrote, &res.stale, &res.lost)
	t.Logf("pause %d: %s stopped %v holding lease %s (fence %d) before its write; in-process clients took the lock and wrote meanwhile; resumed, its write was accepted %t, refused as stale %t; lease loss seen before unlock %t",
		round, c.client(), time.Duration(resumed-stopped).Round(time.Millisecond), res.lease, res.fence, res.wrote, res.stale, res.lost)
	return res
}

// pauseBroken fails the test when a pause did not hold: it kills the child
// (so that its lease ends and the workers can stop), writes the history and
// report of the run for the failure files and ends the test with the facts.
func (r *procRun) pauseBroken(c *childProc, format string, args ...any) {
	t := r.t
	t.Helper()
	_ = c.cmd.Process.Kill()
	r.stop()
	events := r.rec.Events()
	writeFailure(t, chaos.Check(events, chaos.CheckOptions{}), events)
	t.Fatalf(format, args...)
}

// checkPausesHeld checks each pause on the whole history, where every event
// of the child has arrived: the child recorded nothing between its stop and
// its resumption (it did not run), and an in-process client wrote meanwhile
// under a lease granted after the child's lease could have expired on the
// store (the Start of its last successful store acquire or renewal, plus
// the TTL).
func checkPausesHeld(t *testing.T, sc scenario, child string, results []pauseResult, events []chaos.Event) {
	t.Helper()
	granted := map[string]int64{} // in-process leases of procName: End of their grant
	for _, e := range events {
		if e.Name == procName && e.Kind == chaos.KindAcquire && e.Outcome == chaos.OK && !isChild(e.Client) {
			granted[e.Lease] = e.End
		}
	}
	for i, res := range results {
		// Events are ordered by Start: [from, to) are those between the
		// stop and the resumption.
		from, _ := slices.BinarySearchFunc(events, res.stopped+1, func(e chaos.Event, at int64) int { return cmp.Compare(e.Start, at) })
		to, _ := slices.BinarySearchFunc(events, res.resumed, func(e chaos.Event, at int64) int { return cmp.Compare(e.Start, at) })
		var lastSent int64
		for j := from - 1; j >= 0 && lastSent == 0; j-- {
			if e := &events[j]; e.Client == child && e.Name == procName && (e.Kind == chaos.KindStoreAcquire || e.Kind == chaos.KindStoreRenew) && e.Outcome == chaos.OK {
				lastSent = e.Start
			}
		}
		storeFree := lastSent + int64(sc.ttl) - int64(storeClockSlack)
		var ran, write *chaos.Event
		for j := from; j < to; j++ {
			e := &events[j]
			switch {
			case e.Client == child && childStamped(e.Kind) && ran == nil:
				ran = e
			case e.Name == procName && e.Kind == chaos.KindWrite && e.Outcome == chaos.OK && !isChild(e.Client) && granted[e.Lease] > storeFree && write == nil:
				write = e
			}
		}
		switch {
		case ran != nil:
			t.Errorf("pause %d: %s recorded %s %s %v after its stop, before it was resumed: it ran while it was to be stopped", i+1, child, ran.Kind, ran.Name, time.Duration(ran.Start-res.stopped))
		case lastSent == 0:
			t.Errorf("pause %d: %s recorded no store acquire or renewal of %q before its stop", i+1, child, procName)
		case write == nil:
			t.Errorf("pause %d: no in-process client wrote, while %s was stopped, under a lease granted after the child's could have expired on the store (last acquire or renewal sent %v before the stop, TTL %v)",
				i+1, child, time.Duration(res.stopped-lastSent), sc.ttl)
		}
	}
}

// childStamped reports whether a child's event of kind k carries the
// child's own times; resource events carry the parent's.
func childStamped(k chaos.Kind) bool { return k != chaos.KindRead && k != chaos.KindWrite }

// crashResult is one crash of a child that held the lock.
type crashResult struct {
	client string
	fence  uint64
	killed int64 // chaos.Now just before SIGKILL
}

func runCrash(t *testing.T, s *store) {
	sc := procScenario(s, "crash", true)
	r := startProcRun(t, sc)
	var crashes []crashResult
	rounds := crashRounds
	if *soak {
		rounds = procSoakRounds
	}
	for i := 0; i < rounds || (*soak && r.grants.Load() < soakOps); i++ {
		crashes = append(crashes, r.crashRound())
		if *soak {
			want := min(int64(soakOps), int64(i+1)*soakOps/int64(rounds))
			r.waitFor(t, fmt.Sprintf("%d critical sections", want), soakLimit, func() bool { return r.grants.Load() >= want })
		}
	}
	_, events := r.finish()
	for _, cr := range crashes {
		checkTakeover(t, sc, cr, events)
	}
}

// crashRound starts a child, lets it take the lock while the gated workers
// wait, and kills it while it holds, some time into its lease (renewals
// included).
func (r *procRun) crashRound() crashResult {
	t := r.t
	c := r.startChild(roleCrash)
	c.expectLine(t, "ready")
	r.gate.close(t)
	c.send(t, "step")
	var fence uint64
	c.scan(t, "holding fence=%d", &fence)
	r.gate.open()
	hold := time.NewTimer(r.sc.ttl/4 + rand.N(r.sc.ttl*3/4))
	<-hold.C
	killed := chaos.Now()
	c.signal(t, syscall.SIGKILL)
	r.rec.Note("SIGKILL %s holding fence %d", c.client(), fence)
	c.waitExit(t, -1)
	r.waitFor(t, "an in-process client to get the lock after the kill", procWait, func() bool { return r.watch.lastGrant.Load() > killed })
	return crashResult{client: c.client(), fence: fence, killed: killed}
}

// checkTakeover checks when the lock of a killed child came free: not
// before its lease could have expired on the store, and not long after.
//
// The store keeps a lease at least TTL after it received the acquire or
// renewal that set it, which is after that call started; so the first grant
// to another client must end after the start of the child's last successful
// acquire or renewal (recorded by Observe) plus the TTL, and after the local
// deadline the child was given (which also allows for the backend's drift).
func checkTakeover(t *testing.T, sc scenario, cr crashResult, events []chaos.Event) {
	t.Helper()
	var (
		acq      *chaos.Event
		lastSent int64
		next     *chaos.Event
	)
	for i := range events {
		e := &events[i]
		if e.Name != procName {
			continue
		}
		switch {
		case e.Client == cr.client && e.Kind == chaos.KindAcquire && e.Outcome == chaos.OK:
			acq = e
		case e.Client == cr.client && (e.Kind == chaos.KindStoreAcquire || e.Kind == chaos.KindStoreRenew) && e.Outcome == chaos.OK:
			lastSent = max(lastSent, e.Start)
		}
	}
	if acq == nil || lastSent == 0 {
		t.Errorf("%s: no grant recorded", cr.client)
		return
	}
	for i := range events {
		e := &events[i]
		if e.Name == procName && e.Kind == chaos.KindAcquire && e.Outcome == chaos.OK && e.Client != cr.client && e.End > acq.End &&
			(next == nil || e.End < next.End) {
			next = e
		}
	}
	if next == nil {
		t.Errorf("%s: no one got the lock after it", cr.client)
		return
	}
	storeFree := lastSent + int64(sc.ttl) - int64(storeClockSlack)
	ms := func(d int64) string { return time.Duration(d).Round(100 * time.Microsecond).String() }
	t.Logf("%s (fence %d) killed %s after its grant; %s got the lock %s after the kill, %s after the child's last acquire or renewal was sent plus the TTL (%v), %s after its first local deadline",
		cr.client, cr.fence, ms(cr.killed-acq.End), next.Client, ms(next.End-cr.killed), ms(next.End-lastSent-int64(sc.ttl)), sc.ttl, ms(next.End-acq.Deadline))
	if next.End < acq.Deadline {
		t.Errorf("%s got the lock %s before the local deadline the killed %s had been given", next.Client, ms(acq.Deadline-next.End), cr.client)
	}
	if next.End < storeFree {
		t.Errorf("%s got the lock %s before the store could have expired the killed %s's lease (last sent + TTL)", next.Client, ms(storeFree-next.End), cr.client)
	}
	if late := next.End - cr.killed - int64(sc.ttl+crashSlack); late > 0 {
		t.Errorf("%s got the lock %s after the kill: more than TTL + %v", next.Client, ms(next.End-cr.killed), crashSlack)
	}
}

// procScenario describes a process scenario for the harness's report,
// checks and summary.
func procScenario(s *store, label string, fenced bool) scenario {
	sc := scenario{store: s, label: label, clients: defaultClients, workload: chaos.Stock, fenced: fenced, ttl: defaultTTL, think: procThink}
	sc.names = append([]string{procName}, loadNames()...)
	for _, n := range sc.names {
		sc.targets = append(sc.targets, chaos.Target{Name: n, Mode: chaos.Exclusive})
	}
	return sc
}

// procRun is one run of a process scenario: a Recorder and a Resource
// served to child processes on loopback, and in-process workers.
type procRun struct {
	t      *testing.T
	sc     scenario
	rec    *chaos.Recorder
	watch  *watchSink
	url    string
	gate   procGate
	grants atomic.Int64 // grants of the in-process workers

	children int
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	stopOnce sync.Once
}

// startProcRun serves the resource and starts the workers: one goroutine
// per worker and name, the goroutines of procName behind the gate.
func startProcRun(t *testing.T, sc scenario) *procRun {
	t.Helper()
	r := &procRun{t: t, sc: sc, rec: chaos.NewRecorder()}
	r.watch = &watchSink{rec: r.rec}
	res := chaos.NewResource(r.watch, sc.fenced)
	for _, n := range sc.names {
		res.Init(n, chaos.Value{Stock: shortStock})
	}
	sc.store.track(sc.names...)
	mux := http.NewServeMux()
	mux.Handle("/event", childEvents(r.watch))
	mux.Handle("/resource/", res.Handler())
	srv := httptest.NewServer(mux) // on loopback
	t.Cleanup(srv.Close)
	r.url = srv.URL

	var workers []*chaos.Worker
	for i := range sc.clients {
		name := fmt.Sprintf("c%d", i+1)
		c := sc.store.clientOn(t, sc.store.spec, r.rec, name, nil, dlock.WithTTL(sc.ttl))
		w := &chaos.Worker{ID: i + 1, Client: name, Locks: c, Resource: res, Sink: r.watch, Workload: sc.workload, Think: sc.think}
		if sc.fair {
			w.Options = []dlock.Option{dlock.Fair()}
		}
		workers = append(workers, w)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	for _, w := range workers {
		for _, tg := range sc.targets {
			r.wg.Add(1)
			go r.work(ctx, w, tg)
		}
	}
	t.Cleanup(r.stop) // before the clients close
	return r
}

// work runs critical sections on tg until ctx ends.
func (r *procRun) work(ctx context.Context, w *chaos.Worker, tg chaos.Target) {
	defer r.wg.Done()
	pause := time.NewTimer(time.Hour)
	defer pause.Stop()
	gated := tg.Name == procName
	for ctx.Err() == nil {
		if gated && !r.gate.enter(ctx) {
			return
		}
		res, err := w.Step(ctx, tg)
		if gated {
			r.gate.leave()
		}
		if res.Acquired {
			r.grants.Add(1)
		}
		if err != nil {
			pause.Reset(rand.N(20*time.Millisecond) + 1)
			select {
			case <-pause.C:
			case <-ctx.Done():
			}
		}
	}
}

// stop ends the workers: the gate is closed first so that the critical
// sections of procName end by themselves rather than by a cancelled Lock.
func (r *procRun) stop() {
	r.stopOnce.Do(func() {
		idle := r.gate.shut()
		timer := time.NewTimer(procWait)
		defer timer.Stop()
		select {
		case <-idle:
		case <-timer.C:
		}
		r.cancel()
		r.wg.Wait()
	})
}

// finish stops the workers and checks the run with the harness's criteria
// (judge, leftovers), logs the report, adds the run to the summary and
// writes the failure files when the test has failed. It returns the report
// and the history for the scenario's own checks, which come after: they
// register a clean-up that writes the failure files if they fail.
func (r *procRun) finish() (*chaos.Report, []chaos.Event) {
	t := r.t
	t.Helper()
	r.stop()
	events := r.rec.Events()
	rp := chaos.Check(events, chaos.CheckOptions{})
	t.Logf("%s on %s, %s, %d in-process clients and %d child processes, names %v, TTL %v",
		r.sc.label, r.sc.store.name, workloadName(r.sc), r.sc.clients, r.children, r.sc.names, r.sc.ttl)
	t.Logf("report:\n%s", rp.String())
	verdict := judge(t, r.sc, rp, soakOps)
	checkLeftovers(t, r.sc, events)
	failed := t.Failed()
	if failed {
		verdict = "FAIL"
		writeFailure(t, rp, events)
	}
	addRow(t, r.sc, rp, waitStats{}, verdict) // the waits of child processes are not measured
	t.Cleanup(func() {
		if !failed && t.Failed() {
			writeFailure(t, rp, events)
		}
	})
	return rp, events
}

// waitFor waits until cond holds, failing the test after within.
func (r *procRun) waitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", within, what)
		}
		<-tick.C
	}
}

func isChild(client string) bool { return strings.HasPrefix(client, "child-") }

// childEvents serves the events the children send (chaos.RemoteRecorder)
// to sink, as chaos.Recorder.Handler does to its Recorder.
func childEvents(sink chaos.Sink) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost {
			http.Error(w, "POST an event", http.StatusMethodNotAllowed)
			return
		}
		var e chaos.Event
		if err := json.NewDecoder(io.LimitReader(req.Body, 1<<20)).Decode(&e); err != nil {
			http.Error(w, "bad event: "+err.Error(), http.StatusBadRequest)
			return
		}
		sink.Add(e)
		w.WriteHeader(http.StatusNoContent)
	})
}

// watchSink passes events on to the Recorder and keeps, for the scenarios
// to wait on, what happened last on procName: the last grant of an
// in-process client, its last accepted write and the grant of the lease
// that made it, and the children's events.
type watchSink struct {
	rec       *chaos.Recorder
	lastGrant atomic.Int64 // End of the last in-process grant

	mu     sync.Mutex
	grants map[string]int64 // in-process leases of procName held: End of their grant
	pause  pauseWatchState
}

// pauseWatchState is what a pause waits on.
type pauseWatchState struct {
	lastWrite      int64       // Start of the last accepted in-process write
	lastWriteGrant int64       // End of the grant of the lease that made it
	childSent      int64       // Start of the children's last successful store acquire or renewal
	childLast      chaos.Event // the child event, stamped by the child, that started last
}

// freshWrite reports whether an in-process client wrote after stopped under
// a lease granted after a child's lease, last acquired or renewed at
// s.childSent, could have expired on the store.
func (s pauseWatchState) freshWrite(stopped int64, ttl time.Duration) bool {
	storeFree := s.childSent + int64(ttl) - int64(storeClockSlack)
	return s.lastWrite > stopped && s.lastWriteGrant > storeFree
}

func (w *watchSink) Add(e chaos.Event) {
	w.rec.Add(e)
	if e.Name != procName {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if isChild(e.Client) {
		if childStamped(e.Kind) && e.Start > w.pause.childLast.Start {
			w.pause.childLast = e
		}
		if (e.Kind == chaos.KindStoreAcquire || e.Kind == chaos.KindStoreRenew) && e.Outcome == chaos.OK {
			w.pause.childSent = max(w.pause.childSent, e.Start)
		}
		return
	}
	switch {
	case e.Kind == chaos.KindAcquire && e.Outcome == chaos.OK:
		raise(&w.lastGrant, e.End)
		if w.grants == nil {
			w.grants = map[string]int64{}
		}
		w.grants[e.Lease] = e.End
	case e.Kind == chaos.KindWrite && e.Outcome == chaos.OK && e.Start > w.pause.lastWrite:
		w.pause.lastWrite, w.pause.lastWriteGrant = e.Start, w.grants[e.Lease]
	case e.Kind == chaos.KindRelease:
		delete(w.grants, e.Lease)
	}
}

// pauseState returns what a pause waits on.
func (w *watchSink) pauseState() pauseWatchState {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pause
}

func raise(a *atomic.Int64, v int64) {
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}

// procGate holds the workers of procName back while it is closed.
type procGate struct {
	mu       sync.Mutex
	closed   bool
	opened   chan struct{} // closed when the gate opens
	inflight int
	idle     chan struct{} // closed when the gate is closed and inflight is 0
}

// enter waits until the gate is open and counts the caller in; false when
// ctx ended first.
func (g *procGate) enter(ctx context.Context) bool {
	g.mu.Lock()
	for g.closed {
		ch := g.opened
		g.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
		g.mu.Lock()
	}
	g.inflight++
	g.mu.Unlock()
	return true
}

func (g *procGate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inflight--
	if g.closed && g.inflight == 0 && g.idle != nil {
		close(g.idle)
		g.idle = nil
	}
}

// shut closes the gate and returns a channel closed when no worker is
// inside.
func (g *procGate) shut() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	idle := make(chan struct{})
	if !g.closed {
		g.closed, g.opened = true, make(chan struct{})
	}
	if g.inflight == 0 {
		close(idle)
	} else {
		if g.idle != nil {
			close(g.idle)
		}
		g.idle = idle
	}
	return idle
}

// close shuts the gate and waits until the workers inside have left.
func (g *procGate) close(t *testing.T) {
	t.Helper()
	idle := g.shut()
	timer := time.NewTimer(procWait)
	defer timer.Stop()
	select {
	case <-idle:
	case <-timer.C:
		t.Fatalf("the workers were still in their critical sections %v after the gate closed", procWait)
	}
}

func (g *procGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		g.closed = false
		close(g.opened)
	}
}

// childProc is a child process of the test.
type childProc struct {
	spec   childSpec
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string // the child's protocol lines, without childLine
	stderr lockedBuffer
	exited chan struct{} // closed once the child has exited and been waited for
}

// startChild runs the test binary as a child with role on the run's store,
// lock and resource. The test's clean-up kills it if it is still running;
// the kernel kills it if the test process dies first.
func (r *procRun) startChild(role string) *childProc {
	t := r.t
	t.Helper()
	r.children++
	spec := childSpec{ID: r.children, Role: role, Store: r.sc.store.spec, Name: procName, TTL: r.sc.ttl, Workload: r.sc.workload,
		Recorder: r.url + "/event", Resource: r.url + "/resource"}
	if role == rolePause {
		// Pause at any point of the lease, after renewals or before.
		spec.Think = r.sc.ttl
	}
	spec.Fair = r.sc.fair
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	c := &childProc{spec: spec, lines: make(chan string, 16), exited: make(chan struct{})}
	c.cmd = exec.Command(os.Args[0], "-test.run=^$")
	c.cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
	// The child runs in a process group of its own, so that only this
	// test signals it: a SIGCONT to the test's group (job control; the
	// kernel's SIGHUP and SIGCONT to a group that becomes orphaned while
	// one of its processes is stopped, as when the shell that started a
	// nohup'ed test exits) would resume a paused child.
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	c.cmd.Stderr = &c.stderr
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", c.client(), err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), childLine+" "); ok {
				c.lines <- line
			} else {
				fmt.Fprintln(&c.stderr, sc.Text())
			}
		}
		close(c.lines)
		_ = c.cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-c.exited:
		default:
			_ = c.cmd.Process.Kill()
			for range c.lines {
			}
			<-c.exited
		}
		if t.Failed() {
			if out := c.stderr.String(); out != "" {
				t.Logf("%s stderr:\n%s", c.client(), out)
			}
		}
	})
	return c
}

func (c *childProc) client() string { return c.spec.client() }

// waitOrDump waits, within within, until cond holds. When the child exits
// first, or the time runs out, the test fails with the child's stderr; a
// child still running is sent SIGQUIT first, so that its goroutines' stacks
// show where it stands.
func (c *childProc) waitOrDump(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-c.exited:
			t.Fatalf("%s exited (%v) before %s; stderr:\n%s", c.client(), c.cmd.ProcessState, what, c.stderr.String())
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			_ = c.cmd.Process.Signal(syscall.SIGQUIT)
			select {
			case <-c.exited:
				t.Fatalf("waited %v for %s of %s; its stderr (goroutines after SIGQUIT):\n%s", within, what, c.client(), c.stderr.String())
			case <-time.After(10 * time.Second):
				t.Fatalf("waited %v for %s of %s, which did not exit on SIGQUIT", within, what, c.client())
			}
		}
	}
}

// send writes a command line to the child.
func (c *childProc) send(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(c.stdin, line+"\n"); err != nil {
		t.Fatalf("write %q to %s: %v", line, c.client(), err)
	}
}

// next returns the child's next line.
func (c *childProc) next(t *testing.T, want string) string {
	t.Helper()
	timer := time.NewTimer(procWait)
	defer timer.Stop()
	select {
	case line, ok := <-c.lines:
		if !ok {
			<-c.exited
			t.Fatalf("%s exited (%v) while the test waited for %q; stderr:\n%s", c.client(), c.cmd.ProcessState, want, c.stderr.String())
		}
		return line
	case <-timer.C:
		t.Fatalf("%s said nothing for %v while the test waited for %q; stderr:\n%s", c.client(), procWait, want, c.stderr.String())
	}
	return ""
}

// expectLine reads the child's next line, which must be want.
func (c *childProc) expectLine(t *testing.T, want string) {
	t.Helper()
	if line := c.next(t, want); line != want {
		t.Fatalf("%s said %q, want %q", c.client(), line, want)
	}
}

// scan reads the child's next line with format.
func (c *childProc) scan(t *testing.T, format string, args ...any) {
	t.Helper()
	line := c.next(t, format)
	if _, err := fmt.Sscanf(line, format, args...); err != nil {
		t.Fatalf("%s said %q, want %q: %v", c.client(), line, format, err)
	}
}

func (c *childProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("send %v to %s: %v", sig, c.client(), err)
	}
}

// waitExit waits for the child to exit with code (-1: killed by a signal).
func (c *childProc) waitExit(t *testing.T, code int) {
	t.Helper()
	timer := time.NewTimer(procWait)
	defer timer.Stop()
	lines := c.lines
	for exited := false; !exited; {
		select {
		case _, ok := <-lines: // nothing more is expected from it
			if !ok {
				lines = nil
			}
		case <-c.exited:
			exited = true
		case <-timer.C:
			t.Fatalf("%s still running %v after it should have exited", c.client(), procWait)
		}
	}
	if got := c.cmd.ProcessState.ExitCode(); got != code {
		t.Fatalf("%s ended with %v, want exit code %d; stderr:\n%s", c.client(), c.cmd.ProcessState, code, c.stderr.String())
	}
}

// stopAtRest stops the child with SIGSTOP, and waits until every thread of
// it has stopped. A child stopped in the middle of a SQLite write would hold
// the database's write lock and block every other client until it is
// resumed: that is a stalled store, another fault than a paused lock
// holder, so such a stop is undone and made again a moment later.
func (c *childProc) stopAtRest(t *testing.T) {
	t.Helper()
	pid := c.cmd.Process.Pid
	for attempt := 1; ; attempt++ {
		c.signal(t, syscall.SIGSTOP)
		deadline := time.Now().Add(procWait)
		for !allStopped(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("%s did not stop within %v", c.client(), procWait)
			}
			time.Sleep(time.Millisecond)
		}
		if !holdsWriteLock(pid) {
			return
		}
		if attempt == 100 {
			b, _ := os.ReadFile("/proc/locks")
			t.Fatalf("%s held a write lock at each of %d stops (pid %d):\n%s", c.client(), attempt, pid, b)
		}
		c.signal(t, syscall.SIGCONT)
		time.Sleep(time.Duration(rand.N(5)+1) * time.Millisecond)
	}
}

// processStopped reports whether the main thread of pid is stopped: after a
// stop of every thread, it is no longer once the process is continued.
func processStopped(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'T'
}

// taskStates lists the state of each thread of pid ("123:T 124:S"), for
// messages.
func taskStates(pid int) string {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return err.Error()
	}
	var states []string
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, task.Name(), "stat"))
		if i := strings.LastIndexByte(string(b), ')'); err == nil && i >= 0 && i+2 < len(b) {
			states = append(states, task.Name()+":"+string(b[i+2]))
		}
	}
	return strings.Join(states, " ")
}

// allStopped reports whether every thread of pid is stopped.
func allStopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join(fmt.Sprintf("/proc/%d/task", pid), task.Name(), "stat"))
		if err != nil {
			return false
		}
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
			return false
		}
	}
	return true
}

// holdsWriteLock reports whether pid holds a POSIX write lock
// (/proc/locks). A SQLite connection in WAL mode always holds read locks
// (on the database and on the -shm file's dead-man switch), which block no
// one; a write lock is a transaction or a checkpoint in progress.
func holdsWriteLock(pid int) bool {
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		return false
	}
	want := strconv.Itoa(pid)
	for _, line := range strings.Split(string(b), "\n") {
		// "1: POSIX  ADVISORY  WRITE 12345 08:01:1234 0 EOF"
		if f := strings.Fields(line); len(f) > 4 && f[1] == "POSIX" && f[3] == "WRITE" && f[4] == want {
			return true
		}
	}
	return false
}

// lockedBuffer is a strings.Builder that a process may write to while the
// test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
