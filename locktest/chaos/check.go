package chaos

import (
	"cmp"
	"slices"
	"strings"
	"time"
)

// CheckOptions tunes Check.
type CheckOptions struct {
	// LinearizabilityTimeout bounds porcupine's search for each name; 0
	// means one minute. A name whose search times out is listed in
	// Report.Unchecked.
	LinearizabilityTimeout time.Duration
	// ClockSlack is how much before a lease's local deadline its store may
	// end it without breaking the lock's promise: stores count expiry in
	// milliseconds on their wall clock. A window that ends at its deadline
	// ends this much earlier. 0 means 2ms; a negative value means none.
	ClockSlack time.Duration
}

// defaultClockSlack is CheckOptions.ClockSlack's default.
const defaultClockSlack = 2 * time.Millisecond

// Window is the time during which one lease's holder could trust it: from
// the moment its acquire returned to the first of Unlock being called, the
// loss being reported to it, and its last local deadline.
type Window struct {
	Lease  string
	Client string
	Name   string
	Mode   Mode
	Limit  int
	Fence  uint64
	Start  int64
	End    int64
	Ended  string // "unlock", "loss" or "deadline"
}

// Overlap is an exclusion violation: two windows of one name that must not
// meet did (an exclusive lease with any other), or more permits of a
// semaphore were valid at once than it has (A is the permit that went over).
type Overlap struct {
	A, B    Window
	Permits int // permit overlaps: permits valid at once, B's included
}

// NameSummary is what the resource saw of one name.
type NameSummary struct {
	Initial Value // the value Init gave it
	Final   Value // the value after the last accepted write
	Writes  int   // accepted writes
}

// Report is the result of Check. Counts are over the whole history.
type Report struct {
	Events         int
	Grants         int // acquires that returned a lease
	AcquireFailed  int // acquires that returned ErrNotObtained (a cancelled or timed-out wait included), ErrConflict or ErrInvalid
	AcquireUnknown int // acquires that ended in another error: the store failed or could not be reached
	Releases       int // Unlock calls that returned nil
	ReleaseFailed  int // Unlock calls answered ErrNotHeld or ErrLost
	ReleaseUnknown int // Unlock calls with no answer
	Renewals       int // manual refreshes that succeeded
	StoreCalls     int // store calls recorded by Observe (background renewals included)
	Losses         int // leases lost before Unlock, as reported to their holders
	// LateLossReports counts losses reported to the holder after the
	// lease's local deadline, unless a read of the lease after the deadline
	// said it was lost (Event.ReadTold): a holder told too late.
	LateLossReports int

	// Overlaps are the exclusion violations: leases of one name valid at
	// once that must not be (read-write and semaphore rules included).
	Overlaps []Overlap
	// FenceRegressions counts grants whose fence was not above the fence of
	// a grant that had completed before they were requested.
	FenceRegressions int
	// DuplicateFences counts grants that share a fence with another lease
	// of the same name, one of them exclusive.
	DuplicateFences int

	Reads, Writes int // resource accesses accepted
	// StaleRejected counts accesses a fenced resource refused.
	StaleRejected int
	// StaleAccepted counts accesses the resource accepted although it had
	// already accepted a higher fence, or the same fence from another
	// lease (for a reader: a writer's higher fence): on a fenced resource,
	// a failure of fencing.
	StaleAccepted int
	// LateWrites counts accepted writes made after the writer's window had
	// ended (the writer no longer held the lock), or by a lease the
	// history has no grant of.
	LateWrites int
	// LostUpdates counts accepted writes whose lease had not read the value
	// they overwrote: another holder's update was lost (an oversold unit in
	// the stock workload, a vanished member in the set workload).
	LostUpdates int
	// NegativeStock counts accepted writes of a stock below zero.
	NegativeStock int
	// NonLinearizable lists the names whose resource history porcupine
	// found not linearizable as critical sections (read, then write what
	// was read, updated); Unchecked those whose search timed out.
	NonLinearizable []string
	Unchecked       []string

	// Names summarises each name the resource saw.
	Names map[string]NameSummary

	linear map[string][]operation // porcupine input per name, for WriteFiles
	t0     int64
}

// Violations counts every broken property: overlaps, stale accesses
// accepted, lost updates, negative stock, fence regressions and
// duplicates, names not linearizable and late loss reports. Late writes are
// not counted: whether they are harmful is what the other counts tell.
func (r *Report) Violations() int {
	return len(r.Overlaps) + r.StaleAccepted + r.LostUpdates + r.NegativeStock + r.FenceRegressions +
		r.DuplicateFences + len(r.NonLinearizable) + r.LateLossReports
}

// leaseRec gathers the events of one lease.
type leaseRec struct {
	acq      Event
	release  *Event
	loss     *Event
	deadline int64
}

// Check checks a history: the exclusion of lease windows per name (with the
// read-write and semaphore rules), the order and uniqueness of fences, the
// resource's accesses against the fence rule, lost updates, the stock floor,
// the linearizability of each name's critical sections (porcupine), and
// that every loss reached its holder before the lease's local deadline.
func Check(events []Event, opts CheckOptions) *Report {
	if opts.LinearizabilityTimeout <= 0 {
		opts.LinearizabilityTimeout = time.Minute
	}
	switch {
	case opts.ClockSlack == 0:
		opts.ClockSlack = defaultClockSlack
	case opts.ClockSlack < 0:
		opts.ClockSlack = 0
	}
	events = slices.Clone(events)
	slices.SortStableFunc(events, func(a, b Event) int {
		return cmp.Or(cmp.Compare(a.Start, b.Start), cmp.Compare(a.End, b.End))
	})
	r := &Report{Events: len(events), Names: make(map[string]NameSummary)}
	if len(events) > 0 {
		r.t0 = events[0].Start
	}
	leases := make(map[string]*leaseRec)
	for i := range events {
		e := &events[i]
		switch e.Kind {
		case KindAcquire:
			switch e.Outcome {
			case OK:
				r.Grants++
				leases[e.Lease] = &leaseRec{acq: *e, deadline: e.Deadline}
			case Failed:
				r.AcquireFailed++
			default:
				r.AcquireUnknown++
			}
		case KindRenew:
			if lr := leases[e.Lease]; lr != nil && e.Outcome == OK {
				r.Renewals++
				lr.deadline = max(lr.deadline, e.Deadline)
			}
		case KindLoss:
			r.Losses++
			if e.Deadline != 0 && e.End > e.Deadline && !e.ReadTold {
				r.LateLossReports++
			}
			if lr := leases[e.Lease]; lr != nil {
				lr.loss = e
				lr.deadline = max(lr.deadline, e.Deadline)
			}
		case KindRelease:
			switch e.Outcome {
			case OK:
				r.Releases++
			case Failed:
				r.ReleaseFailed++
			default:
				r.ReleaseUnknown++
			}
			if lr := leases[e.Lease]; lr != nil {
				lr.release = e
				lr.deadline = max(lr.deadline, e.Deadline)
			}
		case KindStoreAcquire, KindStoreRenew, KindStoreRelease, KindStoreWithdraw:
			r.StoreCalls++
		}
	}
	extendByStore(events, leases)
	windows := make(map[string]Window, len(leases))
	for id, lr := range leases {
		w := Window{Lease: id, Client: lr.acq.Client, Name: lr.acq.Name, Mode: lr.acq.Mode, Limit: lr.acq.Limit,
			Fence: lr.acq.Fence, Start: lr.acq.End, End: lr.deadline - int64(opts.ClockSlack), Ended: "deadline"}
		if lr.loss != nil && lr.loss.End < w.End {
			w.End, w.Ended = lr.loss.End, "loss"
		}
		if lr.release != nil && lr.release.Start < w.End {
			w.End, w.Ended = lr.release.Start, "unlock"
		}
		windows[id] = w
	}
	r.checkExclusion(windows)
	r.checkFences(leases)
	r.checkResource(events, windows, opts.LinearizabilityTimeout)
	return r
}

// extendByStore finds each lease's owner token (the successful store
// acquire of the same client with the same fence, on a key that ends with
// the lease's name) and moves the lease's deadline to the latest deadline a
// successful store call of that token gave it: renewals made in the
// background are seen only there, and a holder that dies while it holds
// records nothing else.
func extendByStore(events []Event, leases map[string]*leaseRec) {
	type grantKey struct {
		client string
		fence  uint64
	}
	byGrant := make(map[grantKey][]*leaseRec)
	for _, lr := range leases {
		k := grantKey{lr.acq.Client, lr.acq.Fence}
		byGrant[k] = append(byGrant[k], lr)
	}
	byToken := make(map[string][]*leaseRec)
	for _, e := range events {
		if e.Kind != KindStoreAcquire || e.Outcome != OK {
			continue
		}
		for _, lr := range byGrant[grantKey{e.Client, e.Fence}] {
			if strings.HasSuffix(e.Name, lr.acq.Name) && e.End <= lr.acq.End {
				byToken[e.Token] = append(byToken[e.Token], lr)
			}
		}
	}
	for _, e := range events {
		if (e.Kind != KindStoreRenew && e.Kind != KindStoreAcquire) || e.Outcome != OK || e.Deadline == 0 {
			continue
		}
		for _, lr := range byToken[e.Token] {
			if e.Start >= lr.acq.Start && (lr.release == nil || e.Start < lr.release.Start) && (lr.loss == nil || e.Start < lr.loss.End) {
				lr.deadline = max(lr.deadline, e.Deadline)
			}
		}
	}
}

// checkExclusion sweeps each name's windows in start order.
func (r *Report) checkExclusion(windows map[string]Window) {
	byName := make(map[string][]Window)
	for _, w := range windows {
		if w.End <= w.Start {
			continue // never valid: granted after its own deadline
		}
		byName[w.Name] = append(byName[w.Name], w)
	}
	for _, name := range sortedKeys(byName) {
		ws := byName[name]
		slices.SortFunc(ws, func(a, b Window) int { return cmp.Or(cmp.Compare(a.Start, b.Start), strings.Compare(a.Lease, b.Lease)) })
		var active []Window
		for _, w := range ws {
			active = slices.DeleteFunc(active, func(a Window) bool { return a.End <= w.Start })
			permits := 1
			for _, a := range active {
				switch {
				case a.Mode == Exclusive || w.Mode == Exclusive:
					r.Overlaps = append(r.Overlaps, Overlap{A: a, B: w})
				case a.Mode == Permit && w.Mode == Permit:
					permits++
				}
			}
			if w.Mode == Permit && w.Limit > 0 && permits > w.Limit {
				r.Overlaps = append(r.Overlaps, Overlap{A: active[len(active)-1], B: w, Permits: permits})
			}
			active = append(active, w)
		}
	}
}

// checkFences finds, per name, grants whose fence is not above one that
// had completed before they were requested, and fences given to two leases.
func (r *Report) checkFences(leases map[string]*leaseRec) {
	byName := make(map[string][]Event)
	for _, lr := range leases {
		byName[lr.acq.Name] = append(byName[lr.acq.Name], lr.acq)
	}
	for _, name := range sortedKeys(byName) {
		grants := byName[name]
		byEnd := slices.Clone(grants)
		slices.SortFunc(byEnd, func(a, b Event) int { return cmp.Compare(a.End, b.End) })
		slices.SortFunc(grants, func(a, b Event) int { return cmp.Compare(a.Start, b.Start) })
		// Highest fences of the grants completed before g was requested:
		// g must be above every exclusive one, and above every shared one
		// unless g is shared too (Redlock readers may share a fence).
		var (
			i                 int
			exclusive, shared uint64
		)
		for _, g := range grants {
			for i < len(byEnd) && byEnd[i].End < g.Start {
				if byEnd[i].Mode == Exclusive {
					exclusive = max(exclusive, byEnd[i].Fence)
				} else {
					shared = max(shared, byEnd[i].Fence)
				}
				i++
			}
			if g.Fence <= exclusive || g.Fence < shared || (g.Fence == shared && g.Mode == Exclusive) {
				r.FenceRegressions++
			}
		}
		type holders struct {
			n         int
			exclusive bool
		}
		seen := make(map[uint64]*holders)
		for _, g := range grants {
			h := seen[g.Fence]
			if h == nil {
				h = &holders{}
				seen[g.Fence] = h
			}
			h.n++
			h.exclusive = h.exclusive || g.Mode == Exclusive
		}
		for _, h := range seen {
			if h.n > 1 && h.exclusive {
				r.DuplicateFences += h.n - 1
			}
		}
	}
}

// checkResource replays the resource's accesses in the order it served
// them.
func (r *Report) checkResource(events []Event, windows map[string]Window, timeout time.Duration) {
	type reg struct {
		value     Value
		fence     uint64
		exclusive uint64          // highest fence of an exclusive access
		atFence   map[string]bool // leases whose accesses carried fence
		lastRead  map[string]Value
		sum       NameSummary
		reads     map[string]Event // first accepted read per lease
		ops       []operation
	}
	regs := make(map[string]*reg)
	get := func(name string) *reg {
		g := regs[name]
		if g == nil {
			g = &reg{atFence: make(map[string]bool), lastRead: make(map[string]Value), reads: make(map[string]Event)}
			regs[name] = g
		}
		return g
	}
	for _, e := range events {
		switch e.Kind {
		case KindInit:
			g := get(e.Name)
			g.value = Value{Stock: e.Value, Members: e.Members}
			g.sum.Initial, g.sum.Final = g.value, g.value
		case KindRead, KindWrite:
			g := get(e.Name)
			if e.Outcome != OK {
				r.StaleRejected++
				continue
			}
			switch {
			case e.Mode == Shared:
				// Readers may come in any order among themselves (and
				// share a fence on Redlock); only a writer's higher
				// fence makes a reader stale.
				if e.Fence < g.exclusive {
					r.StaleAccepted++
				}
				if e.Fence > g.fence {
					g.fence = e.Fence
					clear(g.atFence)
				}
				if e.Fence == g.fence {
					g.atFence[e.Lease] = true
				}
			case e.Fence > g.fence:
				g.fence, g.exclusive = e.Fence, e.Fence
				clear(g.atFence)
				g.atFence[e.Lease] = true
			case e.Fence == g.fence && (g.atFence[e.Lease] || len(g.atFence) == 0):
				g.exclusive = e.Fence
				g.atFence[e.Lease] = true
			default:
				r.StaleAccepted++
			}
			if e.Kind == KindRead {
				r.Reads++
				v := Value{Stock: e.Value, Members: e.Members}
				g.lastRead[e.Lease] = v
				if _, ok := g.reads[e.Lease]; !ok {
					g.reads[e.Lease] = e
					g.ops = append(g.ops, operation{client: e.Client, lease: e.Lease, read: v, call: e.Start, ret: e.End})
				}
				continue
			}
			r.Writes++
			g.sum.Writes++
			if read, ok := g.lastRead[e.Lease]; !ok || !sameValue(read, g.value) {
				r.LostUpdates++
			}
			if e.Value < 0 {
				r.NegativeStock++
			}
			if w, ok := windows[e.Lease]; !ok || e.Start > w.End {
				r.LateWrites++
			}
			g.value = Value{Stock: e.Value, Members: e.Members}
			g.sum.Final = g.value
			// The write completes the lease's critical section.
			for i := len(g.ops) - 1; i >= 0; i-- {
				if g.ops[i].lease == e.Lease {
					g.ops[i].wrote, g.ops[i].written, g.ops[i].ret = true, g.value, e.End
					break
				}
			}
		}
	}
	r.linear = make(map[string][]operation)
	for _, name := range sortedKeys(regs) {
		g := regs[name]
		r.Names[name] = g.sum
		if len(g.ops) == 0 {
			continue
		}
		r.linear[name] = g.ops
		switch checkLinear(g.sum.Initial, g.ops, timeout) {
		case resultIllegal:
			r.NonLinearizable = append(r.NonLinearizable, name)
		case resultUnknown:
			r.Unchecked = append(r.Unchecked, name)
		}
	}
}

func sameValue(a, b Value) bool { return a.Stock == b.Stock && slices.Equal(a.Members, b.Members) }

func sortedKeys[M ~map[string]V, V any](m M) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
