// The report of a check, in plain words.

package chaos

import (
	"fmt"
	"strings"
	"time"
)

// Summary is the report on one line.
func (r *Report) Summary() string {
	lin := "yes"
	switch {
	case len(r.NonLinearizable) > 0:
		lin = "NO"
	case len(r.Unchecked) > 0:
		lin = "unknown"
	}
	return fmt.Sprintf("grants=%d overlaps=%d fence-regressions=%d dup-fences=%d stale-rejected=%d stale-accepted=%d late-writes=%d lost-updates=%d negative=%d losses=%d late-loss-reports=%d linearizable=%s",
		r.Grants, len(r.Overlaps), r.FenceRegressions, r.DuplicateFences, r.StaleRejected, r.StaleAccepted, r.LateWrites, r.LostUpdates, r.NegativeStock, r.Losses, r.LateLossReports, lin)
}

// String is the report in plain words, one finding per line.
func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d grants (%d acquires refused, %d had no answer); %d unlocks succeeded (%d found the lease gone, %d had no answer); %d store calls.\n",
		r.Grants, r.AcquireFailed, r.AcquireUnknown, r.Releases, r.ReleaseFailed, r.ReleaseUnknown, r.StoreCalls)
	if r.Losses == 0 {
		b.WriteString("No lease was lost.\n")
	} else {
		fmt.Fprintf(&b, "%d leases lost; %d of them reported to their holder after the local deadline.\n", r.Losses, r.LateLossReports)
	}
	if len(r.Overlaps) == 0 {
		b.WriteString("Exclusion held: no two leases of one name were valid at once.\n")
	} else {
		fmt.Fprintf(&b, "Exclusion BROKEN: %d overlaps of lease windows, first: %s\n", len(r.Overlaps), r.describeOverlap(r.Overlaps[0]))
	}
	if r.FenceRegressions == 0 && r.DuplicateFences == 0 {
		b.WriteString("Fences rose with every grant.\n")
	} else {
		fmt.Fprintf(&b, "Fences BROKEN: %d grants got a fence no higher than an earlier grant's; %d fences were given twice.\n", r.FenceRegressions, r.DuplicateFences)
	}
	fmt.Fprintf(&b, "Resource: %d reads and %d writes accepted, %d stale accesses refused, %d stale accepted, %d writes made after the writer's lease had ended.\n",
		r.Reads, r.Writes, r.StaleRejected, r.StaleAccepted, r.LateWrites)
	if r.LostUpdates == 0 && r.NegativeStock == 0 {
		b.WriteString("No update was lost; the stock never went below zero.\n")
	} else {
		fmt.Fprintf(&b, "%d updates LOST (each an oversold unit or a vanished member); %d writes of a negative stock.\n", r.LostUpdates, r.NegativeStock)
	}
	switch {
	case len(r.NonLinearizable) > 0:
		fmt.Fprintf(&b, "Linearizability (porcupine): NOT linearizable: %s.\n", strings.Join(r.NonLinearizable, ", "))
	case len(r.Unchecked) > 0:
		fmt.Fprintf(&b, "Linearizability (porcupine): search timed out for %s.\n", strings.Join(r.Unchecked, ", "))
	default:
		fmt.Fprintf(&b, "Linearizability (porcupine): every name's critical sections are linearizable (%d names).\n", len(r.linear))
	}
	for _, name := range sortedKeys(r.Names) {
		s := r.Names[name]
		fmt.Fprintf(&b, "  %s: %s -> %s after %d writes\n", name, describeValue(s.Initial), describeValue(s.Final), s.Writes)
	}
	return b.String()
}

func (r *Report) at(t int64) string {
	return time.Duration(t - r.t0).Round(time.Microsecond).String()
}

func (r *Report) describeWindow(w Window) string {
	return fmt.Sprintf("%s lease %s (%s, fence %d, %s to %s, ended by %s)", w.Client, w.Lease, w.Mode, w.Fence, r.at(w.Start), r.at(w.End), w.Ended)
}

func (r *Report) describeOverlap(o Overlap) string {
	if o.Permits > 0 {
		return fmt.Sprintf("%d permits of %d in use on %q when %s began", o.Permits, o.B.Limit, o.B.Name, r.describeWindow(o.B))
	}
	return fmt.Sprintf("on %q, %s and %s", o.B.Name, r.describeWindow(o.A), r.describeWindow(o.B))
}

func describeValue(v Value) string {
	if len(v.Members) == 0 {
		return fmt.Sprintf("stock %d", v.Stock)
	}
	return fmt.Sprintf("%d members", len(v.Members))
}
