package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/memlock"
	"github.com/dlock-go/dlock/redislock"
)

// The shapes: 8 workers, 1 writer to 3 readers; 3 permits.
var (
	rwShape  = Workload{Kind: KindRW, Workers: 8, Writers: 2, Names: 1, CS: 100 * time.Microsecond}
	semShape = Workload{Kind: KindSemaphore, Workers: 8, Permits: 3, Names: 1, CS: 100 * time.Microsecond}
)

func TestWorkloadKindLabels(t *testing.T) {
	for _, c := range []struct {
		w    Workload
		want string
	}{
		{rwShape, "rw-8w-2wr-cs100µs"},
		{semShape, "sem3-8w-cs100µs"},
		{Workload{Kind: KindRW, Workers: 4, Writers: 1, Names: 16}, "rw-4w-1wr-16n-cs0s"},
		{Workload{Kind: KindSemaphore, Workers: 8, Permits: 2, Names: 64, CS: time.Millisecond}, "sem2-8w-64n-cs1ms"},
		{Workload{Workers: 8, Names: 1, CS: 100 * time.Microsecond}, "hot-8w-cs100µs"},
	} {
		if got := c.w.Label(); got != c.want {
			t.Errorf("Label of %+v = %q, want %q", c.w, got, c.want)
		}
	}
}

func TestWorkloadKindChecks(t *testing.T) {
	with := func(w Workload) Workload { w.Duration = time.Second; return w }
	for _, c := range []struct {
		w    Workload
		want string // in the error; "" for none
	}{
		{with(rwShape), ""},
		{with(semShape), ""},
		{with(Workload{Kind: KindRW, Workers: 2, Writers: 1, Names: 1}), ""},
		{with(Workload{Kind: KindRW, Workers: 1, Writers: 1, Names: 1}), "needs at least 2 workers"},
		{with(Workload{Kind: KindRW, Workers: 8, Writers: 0, Names: 1}), "writers must be between 1 and 7 (workers − 1), not 0"},
		{with(Workload{Kind: KindRW, Workers: 8, Writers: 8, Names: 1}), "writers must be between 1 and 7 (workers − 1), not 8"},
		{with(Workload{Kind: KindSemaphore, Workers: 8, Names: 1}), "permits must be at least 1, not 0"},
		{with(Workload{Workers: 8, Names: 1, Writers: 2}), "writers (2) are for read-write workloads only"},
		{with(Workload{Kind: KindRW, Workers: 8, Writers: 2, Permits: 3, Names: 1}), "permits (3) are for semaphore workloads only"},
		{with(Workload{Kind: "queue", Workers: 8, Names: 1}), `unknown kind "queue"`},
	} {
		err := c.w.check()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("check %s: %v, want none", c.w.Label(), err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("check %+v: %v, want an error with %q", c.w, err, c.want)
		}
	}
}

func TestWorkloadWritersSpreadEvenly(t *testing.T) {
	for _, c := range []struct {
		workers, writers int
		want             []int
	}{
		{8, 2, []int{0, 4}},
		{8, 1, []int{0}},
		{8, 3, []int{0, 2, 5}},
		{8, 7, []int{0, 1, 2, 3, 4, 5, 6}},
		{3, 2, []int{0, 1}},
	} {
		w := Workload{Kind: KindRW, Workers: c.workers, Writers: c.writers}
		var got []int
		for id := range c.workers {
			if w.writer(id) {
				got = append(got, id)
			}
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%d writers of %d workers: ids %v, want %v", c.writers, c.workers, got, c.want)
		}
	}
}

// TestSummarizeRW checks the statistics of a made-up read-write history on
// 3 workers, writer 0 and readers 1 and 2: a reader's wait is blocked only
// by a writer's grant, a writer's by any; handoffs follow writers'
// releases only; Jain is the lower of the writers' and the readers'.
func TestSummarizeRW(t *testing.T) {
	t0 := time.Unix(0, 0)
	at := func(us int) time.Time { return t0.Add(time.Duration(us) * time.Microsecond) }
	cycles := [][]cycle{
		{ // writer 0: calls at 2 while both readers hold, granted at 40
			{worker: 0, called: at(2), granted: at(40), released: at(50)},
		},
		{ // reader 1: two reads; the second waits out the writer
			{worker: 1, shared: true, called: at(0), granted: at(1), released: at(30)},
			{worker: 1, shared: true, called: at(31), granted: at(55), released: at(70)},
		},
		{ // reader 2: granted at 3 while reader 1 holds (no writer grant
			// inside its call), then a read called at 35, granted at 52
			{worker: 2, shared: true, called: at(1), granted: at(3), released: at(35)},
			{worker: 2, shared: true, called: at(36), granted: at(52), released: at(60)},
		},
	}
	res := Result{Elapsed: time.Second}
	summarize(&res, cycles, Workload{Kind: KindRW, Workers: 3, Writers: 1, Names: 1})
	if res.Grants != 5 || !slices.Equal(res.GrantsPerWorker, []int{1, 2, 2}) {
		t.Fatalf("grants %d %v, want 5 [1 2 2]", res.Grants, res.GrantsPerWorker)
	}
	// Blocked: the writer (38µs, through reader 2's grant at 3) and both
	// readers' second reads (24µs and 16µs, through the writer's grant at
	// 40); reader 2's first read spanned reader 1's grant only.
	if res.Blocked.N != 3 || res.Blocked.Max != 38*time.Microsecond || res.Blocked.P50 != 24*time.Microsecond {
		t.Errorf("blocked %+v, want 3: 16µs, 24µs, 38µs", res.Blocked)
	}
	// Handoff: after the writer's release at 50 the next grant is reader
	// 2's at 52, waiting since 36: 2µs. Readers' releases are none.
	if res.Handoff.N != 1 || res.Handoff.P50 != 2*time.Microsecond {
		t.Errorf("handoff %+v, want one of 2µs", res.Handoff)
	}
	// The writers' Jain is 1 (one writer); the readers' 1: their lower, 1.
	if res.Jain != 1 {
		t.Errorf("Jain %v, want 1", res.Jain)
	}
	// Readers 1 and 2 uneven (3 and 1 grants): the readers' Jain.
	cycles[2] = cycles[2][:1]
	cycles[1] = append(cycles[1], cycle{worker: 1, shared: true, called: at(71), granted: at(72), released: at(80)})
	summarize(&res, cycles, Workload{Kind: KindRW, Workers: 3, Writers: 1, Names: 1})
	if want := 16.0 / (2 * 10); math.Abs(res.Jain-want) > 1e-9 {
		t.Errorf("Jain %v, want the readers' %v", res.Jain, want)
	}
}

// TestSummarizeSemaphore: a permit's wait is blocked by any grant inside
// it, and a semaphore run has no handoffs.
func TestSummarizeSemaphore(t *testing.T) {
	t0 := time.Unix(0, 0)
	at := func(us int) time.Time { return t0.Add(time.Duration(us) * time.Microsecond) }
	cycles := [][]cycle{
		{{worker: 0, shared: true, called: at(0), granted: at(1), released: at(20)}},
		{{worker: 1, shared: true, called: at(0), granted: at(2), released: at(20)}},
		{{worker: 2, shared: true, called: at(3), granted: at(21), released: at(30)}},
	}
	res := Result{Elapsed: time.Second}
	summarize(&res, cycles, Workload{Kind: KindSemaphore, Workers: 3, Permits: 2, Names: 1})
	// Worker 1's call spanned worker 0's grant at 1; worker 2's spanned
	// none (both grants came before its call).
	if res.Blocked.N != 1 || res.Blocked.Max != 2*time.Microsecond {
		t.Errorf("blocked %+v, want one of 2µs", res.Blocked)
	}
	if res.Handoff.N != 0 {
		t.Errorf("handoff %+v, want none", res.Handoff)
	}
	if res.Grants != 3 || res.Jain != 1 {
		t.Errorf("grants %d, Jain %v, want 3 and 1", res.Grants, res.Jain)
	}
}

// holdChecker watches the holds of a subject's workers as they are
// granted and released: it records every overlap that the kind forbids,
// and which worker took which side. A hold is counted from its grant's
// return to the start of its release, inside the hold on the store, so
// an overlap it sees is one on the store.
type holdChecker struct {
	mu                        sync.Mutex
	writers, readers, permits int
	maxPermits                int
	overlaps                  []string
	roles                     map[int]string
}

func newHoldChecker(permits int) *holdChecker {
	return &holdChecker{maxPermits: permits, roles: map[int]string{}}
}

// wrap returns s with its workers' RW and semaphore calls checked.
func (hc *holdChecker) wrap(s Subject) Subject {
	newWorker := s.NewWorker
	s.NewWorker = func(ctx context.Context, id int) (Worker, error) {
		w, err := newWorker(ctx, id)
		if err != nil {
			return nil, err
		}
		return WithKinds(w, checkedRW{hc, id, w.(RWLocker)}, checkedSem{hc, id, w.(PermitAcquirer)}), nil
	}
	return s
}

// enter counts a hold of role ("write", "read", "permit") by worker id.
func (hc *holdChecker) enter(id int, role string) {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	if r, ok := hc.roles[id]; ok && r != role {
		hc.overlaps = append(hc.overlaps, fmt.Sprintf("worker %d took %s and %s", id, r, role))
	}
	hc.roles[id] = role
	switch role {
	case "write":
		if hc.writers > 0 || hc.readers > 0 {
			hc.overlaps = append(hc.overlaps, fmt.Sprintf("writer %d granted beside %d writers, %d readers", id, hc.writers, hc.readers))
		}
		hc.writers++
	case "read":
		if hc.writers > 0 {
			hc.overlaps = append(hc.overlaps, fmt.Sprintf("reader %d granted beside %d writers", id, hc.writers))
		}
		hc.readers++
	case "permit":
		if hc.permits++; hc.permits > hc.maxPermits {
			hc.overlaps = append(hc.overlaps, fmt.Sprintf("worker %d granted permit %d of %d", id, hc.permits, hc.maxPermits))
		}
	}
}

func (hc *holdChecker) leave(role string) {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	switch role {
	case "write":
		hc.writers--
	case "read":
		hc.readers--
	case "permit":
		hc.permits--
	}
}

func (hc *holdChecker) take(id int, role string, h Held, err error) (Held, error) {
	if err != nil {
		return nil, err
	}
	hc.enter(id, role)
	return checkedHeld{hc, role, h}, nil
}

type checkedRW struct {
	hc *holdChecker
	id int
	rw RWLocker
}

func (c checkedRW) RLock(ctx context.Context, name string) (Held, error) {
	h, err := c.rw.RLock(ctx, name)
	return c.hc.take(c.id, "read", h, err)
}

func (c checkedRW) WLock(ctx context.Context, name string) (Held, error) {
	h, err := c.rw.WLock(ctx, name)
	return c.hc.take(c.id, "write", h, err)
}

type checkedSem struct {
	hc  *holdChecker
	id  int
	sem PermitAcquirer
}

func (c checkedSem) AcquirePermit(ctx context.Context, name string, permits int) (Held, error) {
	h, err := c.sem.AcquirePermit(ctx, name, permits)
	return c.hc.take(c.id, "permit", h, err)
}

type checkedHeld struct {
	hc   *holdChecker
	role string
	h    Held
}

func (c checkedHeld) Unlock(ctx context.Context) error {
	c.hc.leave(c.role)
	return c.h.Unlock(ctx)
}

// runKinds runs the rw and semaphore shapes on s, each checked by a
// holdChecker, and checks the results: grants for every worker's role, no
// errors, no overlap the kind forbids, writers at ids 0 and 4.
func runKinds(t *testing.T, s Subject, d time.Duration) {
	t.Helper()
	for _, w := range []Workload{rwShape, semShape} {
		w.Duration = d
		hc := newHoldChecker(w.Permits)
		r, err := Run(context.Background(), hc.wrap(s), w, nil)
		if err != nil {
			t.Fatalf("%s %s: %v", s.Name, w.Label(), err)
		}
		if r.Workload != w.Label() || r.Errors != 0 || r.Grants == 0 || len(r.GrantsPerWorker) != 8 || r.Wait.N != r.Grants {
			t.Errorf("%s %s: workload %q, %d grants %v, %d errors (%s)", s.Name, w.Label(), r.Workload, r.Grants, r.GrantsPerWorker, r.Errors, r.FirstError)
		}
		if len(hc.overlaps) > 0 {
			t.Errorf("%s %s: %d forbidden overlaps, the first: %s", s.Name, w.Label(), len(hc.overlaps), hc.overlaps[0])
		}
		for id := range 8 {
			want := "permit"
			if w.Kind == KindRW {
				want = map[bool]string{true: "write", false: "read"}[id == 0 || id == 4]
			}
			if hc.roles[id] != want {
				t.Errorf("%s %s: worker %d took %q, want %q", s.Name, w.Label(), id, hc.roles[id], want)
			}
		}
		if w.Kind == KindSemaphore && r.Handoff.N != 0 {
			t.Errorf("%s %s: %d handoffs, want none", s.Name, w.Label(), r.Handoff.N)
		}
		t.Logf("%s %s: %.0f grants/s, per worker %v, Jain %.3f, blocked p99 %v, handoff %d", s.Name, w.Label(), r.Throughput, r.GrantsPerWorker, r.Jain, r.Blocked.P99, r.Handoff.N)
	}
}

func TestRunKindsDlockMemlock(t *testing.T) {
	store := memlock.New()
	runKinds(t, Dlock("dlock", func(ctx context.Context, id int) (driver.Backend, func() error, error) {
		return store, nil, nil
	}), 300*time.Millisecond)
}

func TestRunKindsRedis(t *testing.T) {
	srv := testserver.StartRedis(t)
	newClient := func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr()}) }
	runKinds(t, RawRedis("raw", newClient, 10*time.Second), 500*time.Millisecond)
	runKinds(t, Dlock("dlock", func(ctx context.Context, id int) (driver.Backend, func() error, error) {
		rdb := newClient()
		return redislock.New(rdb), rdb.Close, nil
	}), 500*time.Millisecond)
	runKinds(t, Dlock("dlock-fair", func(ctx context.Context, id int) (driver.Backend, func() error, error) {
		rdb := newClient()
		return redislock.New(rdb), rdb.Close, nil
	}, dlock.Fair()), 500*time.Millisecond)
}

// TestRunKindUnsupported: a subject whose workers take no read-write
// locks or semaphores (a plain Worker; dlock with Fair on memlock, which
// has no fair read-write locks or semaphores) fails the run with ErrKindUnsupported, before any grant.
func TestRunKindUnsupported(t *testing.T) {
	store := memlock.New()
	newBackend := func(ctx context.Context, id int) (driver.Backend, func() error, error) { return store, nil, nil }
	plain := Dlock("plain", newBackend)
	newWorker := plain.NewWorker
	plain.NewWorker = func(ctx context.Context, id int) (Worker, error) {
		w, err := newWorker(ctx, id)
		return struct{ Worker }{w}, err
	}
	for _, s := range []Subject{plain, Dlock("dlock-fair", newBackend, dlock.Fair())} {
		for _, w := range []Workload{rwShape, semShape} {
			w.Duration = time.Second
			r, err := Run(context.Background(), s, w, nil)
			if !errors.Is(err, ErrKindUnsupported) || r.Grants != 0 {
				t.Errorf("%s %s: %v, %d grants; want ErrKindUnsupported", s.Name, w.Label(), err, r.Grants)
			}
		}
	}
}
