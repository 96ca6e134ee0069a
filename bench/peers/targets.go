package peers

import (
	"fmt"
	"io"
	"math"
	"text/tabwriter"
	"time"

	"github.com/dlock-go/dlock/internal/bench"
)

// The subject names of the comparison, as TestCompare runs them and
// WriteTargets looks them up.
const (
	SubjectDlock       = "dlock"               // dlock's default Mutex over redislock
	SubjectDlockFair   = "dlock-fair"          // dlock.Fair() over redislock
	SubjectDlockPair   = "dlock-pair"          // dlock, two workers (goroutines) to a Client
	SubjectDlockFairP  = "dlock-fair-pair"     // dlock-fair, two workers to a Client
	SubjectRaw         = "raw"                 // bench.RawRedis: SET NX PX busy spin + compare-and-delete
	SubjectRedsync     = "redsync"             // RedsyncDefault, one node
	SubjectRedsyncTune = "redsync-tuned"       // RedsyncTuned, one node
	SubjectBSM         = "bsm-redislock"       // BSMDefault
	SubjectBSMTuned    = "bsm-redislock-tuned" // BSMTuned
	SubjectDlockRL3    = "dlock-redlock3"      // dlock over dlock's redlock package, 3 nodes
	SubjectRedsyncRL3  = "redsync-redlock3"    // RedsyncDefault over 3 nodes
)

// Headline is the workload the targets are about: 8 workers on one
// name, a 100µs critical section, each locking again as soon as it released.
var Headline = bench.Workload{Workers: 8, Names: 1, CS: 100 * time.Microsecond}

// Uncontended is one worker locking and unlocking one name.
var Uncontended = bench.Workload{Workers: 1, Names: 1}

// HotCS0 is the headline's workload without a critical section: the
// lock's own cost decides the rate.
var HotCS0 = bench.Workload{Workers: 8, Names: 1}

// RW is the read-write workload of the targets: 8 workers on one RWMutex,
// one writer to three readers (workers 0 and 4 write), CS 100µs.
var RW = bench.Workload{Kind: bench.KindRW, Workers: 8, Writers: 2, Names: 1, CS: 100 * time.Microsecond}

// Sem is the semaphore workload of the targets: 8 workers on one
// Semaphore of 3 permits, CS 100µs.
var Sem = bench.Workload{Kind: bench.KindSemaphore, Workers: 8, Permits: 3, Names: 1, CS: 100 * time.Microsecond}

// WriteTargets writes the hot-key targets, each from rep alone (one run,
// one machine): the ratio, the target, and whether it is met, for dlock's
// fair and default Mutex, each worker with a Client of its own and two
// workers to a Client (the -pair subjects). Waits are compared as
// blocked waits (those during which another worker was granted the lock):
// a peer whose releasing worker takes the lock straight back serves most
// grants with no wait at all, which hides its starved waiters from the
// plain p99 (shown too, with p99.9). A ratio whose rows or baseline rep
// lacks is shown as "n/a". The peers' tuned settings have no target; their
// ratios are shown for reference. RW and Sem have targets for dlock and
// dlock-pair against raw's spins of the same shape (the fair subjects have
// neither kind, the peers neither lock).
func WriteTargets(w io.Writer, rep *bench.Report) error {
	head, unc, cs0 := Headline.Label(), Uncontended.Label(), HotCS0.Label()
	find := func(subject, workload string) *bench.Result {
		if r := rep.Find(subject, workload); r != nil && r.Grants > 0 {
			return r
		}
		return nil
	}
	wait50 := func(r *bench.Result) float64 { return float64(r.Wait.P50) }
	wait99 := func(r *bench.Result) float64 { return float64(r.Wait.P99) }
	ratio := func(a, b *bench.Result, f func(*bench.Result) float64) float64 {
		if a == nil || b == nil || f(b) == 0 {
			return math.NaN()
		}
		return f(a) / f(b)
	}

	fmt.Fprintf(w, "\ntargets (ratios from this run; headline = %s):\n", head)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(what string, v float64, op string, want float64) {
		verdict, target := "", "-"
		if op != "" {
			target = fmt.Sprintf("%s %g", op, want)
			switch {
			case math.IsNaN(v):
			case op == "≤" && v <= want, op == "≥" && v >= want:
				verdict = "ok"
			default:
				verdict = "MISSED"
			}
		}
		val := "n/a"
		if !math.IsNaN(v) {
			val = fmt.Sprintf("%.3g", v)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", what, val, target, verdict)
	}

	raw, rawu := find(SubjectRaw, head), find(SubjectRaw, unc)
	tput := func(r *bench.Result) float64 { return r.Throughput }
	blocked99 := func(r *bench.Result) float64 { return float64(r.Blocked.P99) }
	wait999 := func(r *bench.Result) float64 { return float64(r.Wait.P999) }
	// Uncontended: the time of a cycle, i.e. the inverse of grants/s.
	row("dlock uncontended cycle / raw's", ratio(rawu, find(SubjectDlock, unc), tput), "≤", 1.3)
	for _, d := range []string{SubjectDlockFair, SubjectDlock, SubjectDlockFairP, SubjectDlockPair} {
		dl := find(d, head)
		row(d+" headline grants/s / raw's", ratio(dl, raw, tput), "≥", 1)
		for _, p := range []struct {
			subject string
			target  bool
		}{{SubjectRedsync, true}, {SubjectBSM, true}, {SubjectRedsyncTune, false}, {SubjectBSMTuned, false}} {
			op := ""
			if p.target {
				op = "≥"
			}
			pr := find(p.subject, head)
			row(d+" headline grants/s / "+p.subject+"'s", ratio(dl, pr, tput), op, 1)
			row(p.subject+" headline blocked-wait p99 / "+d+"'s", ratio(pr, dl, blocked99), op, 20)
			row(p.subject+" headline wait p99 / "+d+"'s", ratio(pr, dl, wait99), "", 0)
			row(p.subject+" headline wait p99.9 / "+d+"'s", ratio(pr, dl, wait999), "", 0)
		}
		row(d+" headline Jain", jainOf(dl), "≥", 0.99)
		ho := math.NaN()
		if ping, ok := rep.Baselines["ping"]; ok && dl != nil && dl.Handoff.N > 0 && ping.P50 > 0 {
			ho = float64(dl.Handoff.P50) / float64(ping.P50)
		}
		row(d+" headline handoff p50 / ping p50", ho, "≤", 2)
		cmds, scripts := math.NaN(), math.NaN()
		if dl != nil && dl.Ops != nil {
			cmds, scripts = dl.OpsPerCycle, bench.ScriptCalls(dl.Ops)
		}
		op := "" // the target is on fair grants
		if d == SubjectDlockFair || d == SubjectDlockFairP {
			op = "≤"
		}
		row(d+" headline commands per grant", cmds, op, 20)
		row(d+" headline script calls per grant", scripts, "", 0)
		d0 := find(d, cs0)
		row(d+" CS 0 grants/s / raw's", ratio(d0, find(SubjectRaw, cs0), tput), "≥", 0.8)
		row(d+" CS 0 grants/s / "+SubjectRedsync+"'s", ratio(d0, find(SubjectRedsync, cs0), tput), "≥", 1)
		row(d+" CS 0 grants/s / "+SubjectBSM+"'s", ratio(d0, find(SubjectBSM, cs0), tput), "≥", 1)
	}
	for _, r := range []string{SubjectRaw, SubjectRedsync, SubjectBSM} {
		cmds, scripts := math.NaN(), math.NaN()
		if x := find(r, head); x != nil && x.Ops != nil {
			cmds, scripts = x.OpsPerCycle, bench.ScriptCalls(x.Ops)
		}
		row(r+" headline commands per grant", cmds, "", 0)
		row(r+" headline script calls per grant", scripts, "", 0)
	}
	for _, k := range []struct {
		what string
		w    bench.Workload
	}{{"rw", RW}, {"sem", Sem}} {
		rr := find(SubjectRaw, k.w.Label())
		for _, d := range []string{SubjectDlockFair, SubjectDlock, SubjectDlockFairP, SubjectDlockPair} {
			dl := find(d, k.w.Label())
			row(d+" "+k.what+" grants/s / raw's", ratio(dl, rr, tput), "≥", 1)
			row(d+" "+k.what+" Jain", jainOf(dl), "≥", 0.99)
		}
		row(SubjectRaw+" "+k.what+" Jain", jainOf(rr), "", 0)
	}
	row(SubjectDlockRL3+" uncontended wait p50 / dlock's (1 node)", ratio(find(SubjectDlockRL3, unc), find(SubjectDlock, unc), wait50), "", 0)
	rl, rs := find(SubjectDlockRL3, head), find(SubjectRedsyncRL3, head)
	row(SubjectDlockRL3+" headline grants/s / "+SubjectRedsyncRL3+"'s", ratio(rl, rs, tput), "≥", 1)
	row(SubjectRedsyncRL3+" headline blocked-wait p99 / "+SubjectDlockRL3+"'s", ratio(rs, rl, blocked99), "≥", 10)
	return tw.Flush()
}

// jainOf returns r's Jain index, NaN without r.
func jainOf(r *bench.Result) float64 {
	if r == nil {
		return math.NaN()
	}
	return r.Jain
}
