package chaostest

// The criteria about waits, checked from the history: no wait may end early
// (a Lock must not return an error while its wait has time left), and no
// lock may sit free after a release, while a waiter waits, for longer than
// the bound the scenario's fault allows.

import (
	"cmp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/locktest/chaos"
)

// waitSlack is how much before its WithWait a failed wait may return and
// still count as ended by its deadline: the timer's and the recorder's
// granularity.
const waitSlack = 5 * time.Millisecond

// waitStats is what checkWaits found.
type waitStats struct {
	early   int           // waits that ended early
	maxIdle time.Duration // longest idle time after a release
	ok      bool          // the scenario's criteria held
	checked bool          // measured at all (not for child processes)
}

// checkWaits checks the waits of a history whose run's context ended at
// runEnd: it counts the acquires that returned an error before their wait
// ended (sc.wait, or the run) and were not cancelled on purpose, and
// measures, per name, how long the lock sat free after each release while
// a waiter waited (idleTimes). It logs both; it fails the test when
// sc.waitsHold and a wait ended early, or when sc.idleBound is set and an
// idle time passed it.
func checkWaits(t *testing.T, sc scenario, events []chaos.Event, runEnd int64) waitStats {
	t.Helper()
	st := waitStats{ok: true, checked: true}
	var firstEarly []string
	byErr := make(map[string]int)
	for _, e := range events {
		if e.Kind != chaos.KindAcquire || e.Outcome == chaos.OK || e.End >= runEnd {
			continue
		}
		if cancelledOnPurpose(e.Err) {
			continue
		}
		if sc.wait > 0 && time.Duration(e.End-e.Start) >= sc.wait-waitSlack {
			continue
		}
		st.early++
		byErr[firstLine(e.Err)]++
		if len(firstEarly) < 3 {
			firstEarly = append(firstEarly, e.Client+" "+e.Name+" after "+time.Duration(e.End-e.Start).Round(time.Millisecond).String()+": "+e.Err)
		}
	}
	idle := idleTimes(events, runEnd)
	over := 0
	var worst idleTime
	for _, it := range idle {
		if it.d > st.maxIdle {
			st.maxIdle, worst = it.d, it
		}
		if sc.idleBound > 0 && it.d > sc.idleBound {
			over++
		}
	}
	waitText := "until the run ends"
	if sc.wait > 0 {
		waitText = sc.wait.String()
	}
	t.Logf("waits (%s each): %d ended early with an error; %d releases with a waiter, the longest the lock then sat free %v%s",
		waitText, st.early, len(idle), st.maxIdle.Round(time.Millisecond), worst.describe(events))
	if st.early > 0 {
		t.Logf("waits that ended early, by error: %v; first: %s", byErr, strings.Join(firstEarly, "; "))
		if sc.waitsHold {
			st.ok = false
			t.Errorf("%d waits ended early with an error while they had time left", st.early)
		}
	}
	if over > 0 {
		st.ok = false
		t.Errorf("%d times a lock sat free after a release for longer than %v while a waiter waited (longest %v%s)",
			over, sc.idleBound, st.maxIdle.Round(time.Millisecond), worst.describe(events))
	}
	return st
}

// cancelledOnPurpose reports whether an acquire's error is a cancellation:
// before the run ended, only the worker cancels (chaos.Worker.CancelRate),
// and such a wait did not fail early.
func cancelledOnPurpose(err string) bool {
	for _, text := range cancelledText {
		if strings.Contains(err, text) {
			return true
		}
	}
	return false
}

// firstLine is the first line of an error text, cut to 120 bytes.
func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 120 {
		s = s[:120]
	}
	return s
}

// idleTime is how long one name sat free after one release.
type idleTime struct {
	name  string
	from  int64 // the release returned, or the first waiter came later
	d     time.Duration
	next  string // the lease granted next, "" when none before the run ended
	lease string // the released lease
}

func (it idleTime) describe(events []chaos.Event) string {
	if it.name == "" {
		return ""
	}
	next := "no grant before the run ended"
	if it.next != "" {
		next = "then " + it.next + " was granted"
	}
	return " (" + it.name + ", release of " + it.lease + " at " + offset(events, it.from).String() + "; " + next + ")"
}

// idleTimes measures, for every successful release of an exclusive lease
// (and every loss, from the lease's deadline), how long its name then sat
// free while somebody wanted it: the time between the release's return and
// the return of the next grant of the name (or the run's end, when none
// came) during which some acquire of the name was under way. A release
// after which nobody asked for the name before the next grant is not
// counted. Names with shared holds are
// left out: their holds need not come one at a time.
func idleTimes(events []chaos.Event, runEnd int64) []idleTime {
	type nameEvents struct {
		acquires []chaos.Event // every outcome, by Start
		grants   []chaos.Event // by End
		releases []chaos.Event
		shared   bool
	}
	byName := make(map[string]*nameEvents)
	get := func(name string) *nameEvents {
		n := byName[name]
		if n == nil {
			n = &nameEvents{}
			byName[name] = n
		}
		return n
	}
	for _, e := range events {
		switch e.Kind {
		case chaos.KindAcquire:
			n := get(e.Name)
			n.shared = n.shared || e.Mode != chaos.Exclusive
			n.acquires = append(n.acquires, e)
			if e.Outcome == chaos.OK {
				n.grants = append(n.grants, e)
			}
		case chaos.KindRelease:
			if e.Outcome == chaos.OK {
				get(e.Name).releases = append(get(e.Name).releases, e)
			}
		case chaos.KindLoss:
			// A lost lease frees its name on the store by its deadline
			// (the store's expiry; a loss is reported before it): from
			// then on it counts as released.
			e.Start = max(e.End, e.Deadline)
			e.End = e.Start
			get(e.Name).releases = append(get(e.Name).releases, e)
		}
	}
	var out []idleTime
	for name, n := range byName {
		if n.shared {
			continue
		}
		slices.SortFunc(n.acquires, func(a, b chaos.Event) int { return cmp.Compare(a.Start, b.Start) })
		slices.SortFunc(n.grants, func(a, b chaos.Event) int { return cmp.Compare(a.End, b.End) })
		// latest[i]: the latest End of acquires[0..i].
		latest := make([]int64, len(n.acquires))
		for i, a := range n.acquires {
			latest[i] = a.End
			if i > 0 {
				latest[i] = max(latest[i], latest[i-1])
			}
		}
		for _, r := range n.releases {
			// The next grant: the first to return after the release
			// began (a grant may return before the release does).
			stop, next := runEnd, ""
			i, _ := slices.BinarySearchFunc(n.grants, r.Start, func(g chaos.Event, t int64) int { return cmp.Compare(g.End, t+1) })
			for ; i < len(n.grants); i++ {
				if n.grants[i].Lease != r.Lease {
					stop, next = n.grants[i].End, n.grants[i].Lease
					break
				}
			}
			if stop <= r.End {
				continue
			}
			// The time in (r.End, stop) during which some acquire of the
			// name was under way: the union of their intervals, clipped.
			// Acquires that began by r.End and were still running then
			// count from r.End (latest tells whether any was).
			from, cur, sum := int64(-1), r.End, time.Duration(0)
			j, _ := slices.BinarySearchFunc(n.acquires, r.End, func(a chaos.Event, t int64) int { return cmp.Compare(a.Start, t+1) })
			if j > 0 && latest[j-1] > r.End {
				from, cur = r.End, min(latest[j-1], stop)
				sum = time.Duration(cur - r.End)
			}
			for ; j < len(n.acquires) && n.acquires[j].Start < stop; j++ {
				a := n.acquires[j]
				if from < 0 {
					from = a.Start
				}
				start, end := max(a.Start, cur), min(a.End, stop)
				if end > start {
					sum += time.Duration(end - start)
					cur = end
				}
			}
			if from < 0 {
				continue
			}
			out = append(out, idleTime{name: name, from: from, d: sum, next: next, lease: r.Lease})
		}
	}
	return out
}

// distinct returns names without repeats, in their first order.
func distinct(names []string) []string {
	var out []string
	for _, n := range names {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}
