package chaos

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// hist builds synthetic histories: times are plain numbers.
type hist struct{ events []Event }

func (h *hist) grant(lease, name string, mode Mode, limit int, fence uint64, start, end, deadline int64) {
	h.events = append(h.events, Event{Kind: KindAcquire, Client: strings.Split(lease, "/")[0], Name: name, Lease: lease, Mode: mode, Limit: limit, Fence: fence, Start: start, End: end, Deadline: deadline, Outcome: OK})
}

func (h *hist) unlock(lease, name string, at, deadline int64) {
	h.events = append(h.events, Event{Kind: KindRelease, Name: name, Lease: lease, Start: at, End: at + 1, Deadline: deadline, Outcome: OK})
}

func (h *hist) loss(lease, name string, at, deadline int64) {
	h.events = append(h.events, Event{Kind: KindLoss, Name: name, Lease: lease, Start: at, End: at, Deadline: deadline, Outcome: OK})
}

func (h *hist) access(kind Kind, lease, name string, fence uint64, at int64, ok bool, stock int64) {
	o := OK
	if !ok {
		o = Failed
	}
	h.events = append(h.events, Event{Kind: kind, Client: strings.Split(lease, "/")[0], Name: name, Lease: lease, Fence: fence, Start: at, End: at + 1, Outcome: o, Value: stock})
}

func (h *hist) init(name string, stock int64) {
	h.events = append(h.events, Event{Kind: KindInit, Name: name, Value: stock, Outcome: OK})
}

func TestCheckCleanHistory(t *testing.T) {
	var h hist
	h.init("x", 10)
	h.grant("a/1", "x", Exclusive, 0, 1, 0, 10, 1000)
	h.access(KindRead, "a/1", "x", 1, 20, true, 10)
	h.access(KindWrite, "a/1", "x", 1, 30, true, 9)
	h.unlock("a/1", "x", 40, 1000)
	h.grant("b/1", "x", Exclusive, 0, 2, 5, 50, 2000)
	h.access(KindRead, "b/1", "x", 2, 60, true, 9)
	h.access(KindWrite, "b/1", "x", 2, 70, true, 8)
	h.unlock("b/1", "x", 80, 2000)
	r := Check(h.events, CheckOptions{ClockSlack: -1})
	if r.Violations() != 0 || r.Grants != 2 || r.Writes != 2 || r.LateWrites != 0 {
		t.Fatalf("clean history: %s\n%s", r.Summary(), r)
	}
	if got := r.Names["x"]; got.Initial.Stock != 10 || got.Final.Stock != 8 || got.Writes != 2 {
		t.Errorf("name summary = %+v", got)
	}
}

// TestCheckFindsPausedHolder is the history of a holder paused past its
// deadline whose late write overwrote the next holder's: on an unfenced
// resource the checker must find the lost update, the stale access and the
// late write, and porcupine must reject the name.
func TestCheckFindsPausedHolder(t *testing.T) {
	var h hist
	h.init("x", 10)
	h.grant("a/1", "x", Exclusive, 0, 1, 0, 10, 100)
	h.access(KindRead, "a/1", "x", 1, 20, true, 10)
	// a is paused; its deadline (100) passes; b takes the lock.
	h.grant("b/1", "x", Exclusive, 0, 2, 150, 160, 1000)
	h.access(KindRead, "b/1", "x", 2, 170, true, 10)
	h.access(KindWrite, "b/1", "x", 2, 180, true, 9)
	h.unlock("b/1", "x", 190, 1000)
	h.access(KindWrite, "a/1", "x", 1, 300, true, 9) // a wakes and writes 10-1
	h.unlock("a/1", "x", 310, 100)
	r := Check(h.events, CheckOptions{ClockSlack: -1})
	if len(r.Overlaps) != 0 {
		t.Errorf("overlaps = %d, want 0 (a's window ended at its deadline)", len(r.Overlaps))
	}
	if r.StaleAccepted != 1 || r.LateWrites != 1 || r.LostUpdates != 1 {
		t.Errorf("stale accepted %d, late writes %d, lost updates %d; want 1 each", r.StaleAccepted, r.LateWrites, r.LostUpdates)
	}
	if len(r.NonLinearizable) != 1 || r.NonLinearizable[0] != "x" {
		t.Errorf("non-linearizable = %v, want [x]", r.NonLinearizable)
	}
	dir := t.TempDir()
	paths, err := r.WriteFiles(dir, h.events)
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 3 {
		t.Fatalf("files = %v, want history, report and porcupine view", paths)
	}
	html, err := os.ReadFile(filepath.Join(dir, "porcupine-x.html"))
	if err != nil || !strings.Contains(string(html), "read stock 10, wrote stock 9") {
		t.Errorf("porcupine view missing the operations (err %v)", err)
	}
	hist, _ := os.ReadFile(filepath.Join(dir, "history.txt"))
	if !strings.Contains(string(hist), "lease=a/1 fence=1 stock 9 ok") {
		t.Errorf("history does not show a's late write:\n%s", hist)
	}
}

// TestCheckFencedResourceRefusal: the same pause against a fenced resource
// leaves a refused write and a consistent, linearizable history.
func TestCheckFencedResourceRefusal(t *testing.T) {
	var h hist
	h.init("x", 10)
	h.grant("a/1", "x", Exclusive, 0, 1, 0, 10, 100)
	h.access(KindRead, "a/1", "x", 1, 20, true, 10)
	h.grant("b/1", "x", Exclusive, 0, 2, 150, 160, 1000)
	h.access(KindRead, "b/1", "x", 2, 170, true, 10)
	h.access(KindWrite, "b/1", "x", 2, 180, true, 9)
	h.unlock("b/1", "x", 190, 1000)
	h.access(KindWrite, "a/1", "x", 1, 300, false, 9)
	r := Check(h.events, CheckOptions{ClockSlack: -1})
	if r.Violations() != 0 || r.StaleRejected != 1 || r.LateWrites != 0 {
		t.Fatalf("fenced pause: %s", r.Summary())
	}
}

func TestCheckOverlapsAndKinds(t *testing.T) {
	var h hist
	// Two exclusive leases at once.
	h.grant("a/1", "m", Exclusive, 0, 1, 0, 10, 100)
	h.grant("b/1", "m", Exclusive, 0, 2, 0, 50, 200)
	// Readers together are fine; a writer among them is not.
	h.grant("r1/1", "rw", Shared, 0, 1, 0, 10, 100)
	h.grant("r2/1", "rw", Shared, 0, 2, 0, 20, 100)
	h.grant("w/1", "rw", Exclusive, 0, 3, 0, 50, 300)
	h.unlock("w/1", "rw", 250, 300)
	h.unlock("r1/1", "rw", 90, 100)
	h.unlock("r2/1", "rw", 90, 100)
	h.grant("w2/1", "rw", Exclusive, 0, 4, 300, 400, 500) // after all: fine
	// Three permits of two at once.
	h.grant("p1/1", "sem", Permit, 2, 1, 0, 10, 100)
	h.grant("p2/1", "sem", Permit, 2, 2, 0, 20, 100)
	h.grant("p3/1", "sem", Permit, 2, 3, 0, 30, 100)
	h.grant("p4/1", "sem", Permit, 2, 4, 100, 110, 200) // others expired at 100: fine
	r := Check(h.events, CheckOptions{ClockSlack: -1})
	var ex, rw, sem int
	for _, o := range r.Overlaps {
		switch o.B.Name {
		case "m":
			ex++
		case "rw":
			rw++
		case "sem":
			sem++
			if o.Permits != 3 {
				t.Errorf("permit overlap counts %d permits, want 3", o.Permits)
			}
		}
	}
	if ex != 1 || rw != 2 || sem != 1 {
		t.Errorf("overlaps: mutex %d (want 1), rw %d (want 2), semaphore %d (want 1)\n%s", ex, rw, sem, r)
	}
}

func TestCheckFences(t *testing.T) {
	var h hist
	h.grant("a/1", "x", Exclusive, 0, 5, 0, 10, 20)
	h.grant("b/1", "x", Exclusive, 0, 3, 30, 40, 50) // went back
	h.grant("c/1", "x", Exclusive, 0, 7, 60, 70, 80)
	h.grant("d/1", "x", Exclusive, 0, 7, 90, 95, 99) // repeated
	h.grant("r1/1", "y", Shared, 0, 4, 0, 10, 50)
	h.grant("r2/1", "y", Shared, 0, 4, 5, 10, 50) // readers sharing a fence: allowed
	r := Check(h.events, CheckOptions{ClockSlack: -1})
	if r.FenceRegressions != 2 || r.DuplicateFences != 1 {
		t.Errorf("fence regressions %d (want 2: b, d), duplicates %d (want 1)", r.FenceRegressions, r.DuplicateFences)
	}
}

func TestCheckLateLossReport(t *testing.T) {
	var h hist
	h.grant("a/1", "x", Exclusive, 0, 1, 0, 10, 100)
	h.loss("a/1", "x", 90, 100)
	h.grant("b/1", "x", Exclusive, 0, 2, 0, 110, 300)
	h.loss("b/1", "x", 310, 300) // told after its deadline
	r := Check(h.events, CheckOptions{ClockSlack: -1})
	if r.Losses != 2 || r.LateLossReports != 1 {
		t.Errorf("losses %d (want 2), late reports %d (want 1)", r.Losses, r.LateLossReports)
	}
}

// TestCheckReadersInAnyOrder: readers of one period may reach the resource
// out of fence order; a writer's higher fence makes an older reader stale,
// and a reader's higher fence an older writer.
func TestCheckReadersInAnyOrder(t *testing.T) {
	var h hist
	h.init("x", 10)
	read := func(lease string, fence uint64, at int64) {
		h.events = append(h.events, Event{Kind: KindRead, Client: "r", Name: "x", Lease: lease, Fence: fence, Mode: Shared, Start: at, End: at + 1, Outcome: OK, Value: 10})
	}
	read("r/2", 2, 10)
	read("r/1", 1, 20)                              // older reader after a newer one: fine
	h.access(KindWrite, "w/1", "x", 1, 30, true, 9) // writer older than a reader: stale
	h.access(KindWrite, "w/3", "x", 3, 40, true, 9)
	read("r/0", 2, 50) // a reader older than the writer: stale
	r := Check(h.events, CheckOptions{ClockSlack: -1})
	if r.StaleAccepted != 2 {
		t.Errorf("stale accepted = %d, want 2 (w/1 after r/2, r/0 after w/3)", r.StaleAccepted)
	}
}

func TestResourceFencesReaders(t *testing.T) {
	rec := NewRecorder()
	res := NewResource(rec, true)
	ctx := t.Context()
	read := func(fence uint64, mode Mode) error {
		_, err := res.Read(ctx, Access{Name: "x", Lease: "l", Fence: fence, Mode: mode})
		return err
	}
	for _, step := range []struct {
		fence uint64
		mode  Mode
		want  error
	}{
		{5, Shared, nil}, {4, Shared, nil}, // readers in any order
		{3, Exclusive, ErrStale}, // a writer older than a reader
		{6, Exclusive, nil},
		{5, Shared, ErrStale}, // a reader older than a writer
		{7, Shared, nil},
	} {
		if err := read(step.fence, step.mode); err != step.want {
			t.Errorf("%s access with fence %d: %v, want %v", step.mode, step.fence, err, step.want)
		}
	}
}

// TestCheckWindowFollowsBackgroundRenewals: a holder that renewed in the
// background and then died records only its grant; its window must run to
// the deadline its last renewal gave it.
func TestCheckWindowFollowsBackgroundRenewals(t *testing.T) {
	var h hist
	h.grant("a/1", "x", Exclusive, 0, 1, 0, 10, 500)
	h.events = append(h.events,
		Event{Kind: KindStoreAcquire, Client: "a", Name: "prefix:x", Token: "tok", Fence: 1, Start: 1, End: 9, Deadline: 501, Outcome: OK},
		Event{Kind: KindStoreRenew, Client: "a", Name: "prefix:x", Token: "tok", Start: 160, End: 170, Deadline: 660, Outcome: OK},
		Event{Kind: KindStoreRenew, Client: "a", Name: "prefix:x", Token: "other", Start: 300, End: 310, Deadline: 900, Outcome: OK},
	)
	h.grant("b/1", "x", Exclusive, 0, 2, 510, 520, 1100)
	r := Check(h.events, CheckOptions{ClockSlack: -1})
	if len(r.Overlaps) != 1 {
		t.Fatalf("overlaps = %d, want 1: a's renewal made it valid until 660", len(r.Overlaps))
	}
	if got := r.Overlaps[0].A.End; got != 660 {
		t.Errorf("a's window ends at %d, want 660 (another token's renewal must not count)", got)
	}
}

func TestCheckReaderFences(t *testing.T) {
	var h hist
	h.grant("r1/1", "x", Shared, 0, 5, 0, 10, 100)
	h.grant("r2/1", "x", Shared, 0, 5, 20, 30, 100)     // after r1, same fence: Redlock readers may
	h.grant("w/1", "x", Exclusive, 0, 5, 200, 210, 300) // a writer must be above
	h.grant("r3/1", "x", Shared, 0, 4, 400, 410, 500)   // a reader below an earlier reader
	r := Check(h.events, CheckOptions{ClockSlack: -1})
	if r.FenceRegressions != 2 {
		t.Errorf("fence regressions = %d, want 2 (w/1 and r3/1)", r.FenceRegressions)
	}
}

func TestCheckWriteWithoutLease(t *testing.T) {
	var h hist
	h.init("x", 1)
	h.access(KindWrite, "ghost/1", "x", 9, 10, true, 0)
	r := Check(h.events, CheckOptions{ClockSlack: -1})
	if r.LateWrites != 1 {
		t.Errorf("late writes = %d, want 1 for a write under no lease", r.LateWrites)
	}
}

// TestCheckClockSlack: a store that ends a lease a millisecond before the
// client's deadline (its clock counts milliseconds) is within the lock's
// promise; two milliseconds past the slack is not.
func TestCheckClockSlack(t *testing.T) {
	ms := int64(time.Millisecond)
	for _, tc := range []struct {
		next int64
		want int
	}{{499 * ms, 0}, {496 * ms, 1}} {
		var h hist
		h.grant("a/1", "x", Exclusive, 0, 1, 0, 10*ms, 500*ms)
		h.grant("b/1", "x", Exclusive, 0, 2, tc.next-ms, tc.next, 900*ms)
		if got := len(Check(h.events, CheckOptions{}).Overlaps); got != tc.want {
			t.Errorf("next grant at %v: %d overlaps, want %d", time.Duration(tc.next), got, tc.want)
		}
	}
}
