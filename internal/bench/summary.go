// How a run's cycles become its statistics: waits, blocked waits,
// handoffs and fairness, for every kind of workload.

package bench

import (
	"sort"
	"time"
)

// summarize fills the result's statistics from the cycles of workload w.
func summarize(res *Result, cycles [][]cycle, w Workload) {
	res.GrantsPerWorker = make([]int, len(cycles))
	var all []cycle
	var waits, unlocks []time.Duration
	for i, cs := range cycles {
		res.GrantsPerWorker[i] = len(cs)
		for _, c := range cs {
			waits = append(waits, c.granted.Sub(c.called))
			unlocks = append(unlocks, c.unlockTook)
		}
		all = append(all, cs...)
	}
	res.Grants = len(all)
	if res.Elapsed > 0 {
		res.Throughput = float64(res.Grants) / res.Elapsed.Seconds()
	}
	res.Jain = jainOf(res.GrantsPerWorker, w)
	res.Wait = Summarize(waits)
	res.WaitCurve = curve(waits) // sorted by Summarize
	res.Unlock = Summarize(unlocks)

	sort.Slice(all, func(i, j int) bool {
		if all[i].name != all[j].name {
			return all[i].name < all[j].name
		}
		return all[i].granted.Before(all[j].granted)
	})
	res.Handoff = Summarize(handoffs(all, w.Kind))
	res.Blocked = Summarize(blockedWaits(all, w.Kind))
}

// jainOf returns the Jain index of a run's grants per worker: over all the
// workers, or in a KindRW workload the lower of the writers' and the
// readers' (they do different work).
func jainOf(perWorker []int, w Workload) float64 {
	if w.Kind != KindRW {
		return Jain(perWorker)
	}
	var writers, readers []int
	for id, n := range perWorker {
		if w.writer(id) {
			writers = append(writers, n)
		} else {
			readers = append(readers, n)
		}
	}
	return min(Jain(writers), Jain(readers))
}

// handoffs returns the handoff latencies of all, sorted by name and grant:
// per name, a grant to a different worker that called Lock before the
// previous holder's release returned. In a KindRW workload the previous
// holder must be a writer (readers' holds overlap, so the next grant need
// not follow their release); a KindSemaphore workload has none, as a
// release frees one of several permits and the next grant may have taken
// another.
func handoffs(all []cycle, kind string) []time.Duration {
	if kind == KindSemaphore {
		return nil
	}
	var out []time.Duration
	for i := 1; i < len(all); i++ {
		prev, next := all[i-1], all[i]
		if prev.name != next.name || prev.worker == next.worker || prev.shared || !next.called.Before(prev.released) {
			continue
		}
		out = append(out, max(next.granted.Sub(prev.released), 0))
	}
	return out
}

// blockedWaits returns the waits of the grants of all (sorted by name and
// grant) whose Lock call spanned a conflicting grant of the same name: a
// writer's grant for a reader; any grant for a writer, a Mutex or a
// permit. A worker is never granted while its own Lock is pending, so
// every grant inside the call is someone else's.
func blockedWaits(all []cycle, kind string) []time.Duration {
	var blocked []time.Duration
	for lo := 0; lo < len(all); {
		hi := lo
		for hi < len(all) && all[hi].name == all[lo].name {
			hi++
		}
		grants := all[lo:hi] // one name, in grant order
		var writers []cycle  // in a KindRW workload, what blocks a reader
		for _, c := range grants {
			if kind == KindRW && !c.shared {
				writers = append(writers, c)
			}
		}
		for _, c := range grants {
			conflicts := grants
			if kind == KindRW && c.shared {
				conflicts = writers
			}
			i := sort.Search(len(conflicts), func(i int) bool { return conflicts[i].granted.After(c.called) })
			if i < len(conflicts) && conflicts[i].granted.Before(c.granted) {
				blocked = append(blocked, c.granted.Sub(c.called))
			}
		}
		lo = hi
	}
	return blocked
}
