package chaos_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/locktest/chaos"
	"github.com/dlock-go/dlock/memlock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// workers makes n workers on one in-memory store, each with its own
// Client over an observed backend.
func workers(t *testing.T, n int, rec *chaos.Recorder, res chaos.Accessor, wl chaos.Workload, ttl time.Duration) []*chaos.Worker {
	store := memlock.New()
	ws := make([]*chaos.Worker, n)
	for i := range ws {
		c := dlock.New(chaos.Observe(store, rec, ""), dlock.WithTTL(ttl))
		t.Cleanup(func() { c.Close() })
		ws[i] = &chaos.Worker{ID: i, Locks: c, Resource: res, Sink: rec, Workload: wl, Think: time.Millisecond}
	}
	return ws
}

func TestRunIsCleanOnAHealthyStore(t *testing.T) {
	for _, tc := range []struct {
		name     string
		workload chaos.Workload
		fenced   bool
	}{{"stock-fenced", chaos.Stock, true}, {"stock", chaos.Stock, false}, {"set", chaos.Set, false}} {
		t.Run(tc.name, func(t *testing.T) {
			rec := chaos.NewRecorder()
			res := chaos.NewResource(rec, tc.fenced)
			res.Init("a", chaos.Value{Stock: 1000})
			res.Init("b", chaos.Value{Stock: 1000})
			ws := workers(t, 3, rec, res, tc.workload, time.Second)
			chaos.Run(t.Context(), ws, []chaos.Target{{Name: "a"}, {Name: "b"}}, 300, 0)
			r := chaos.Check(rec.Events(), chaos.CheckOptions{})
			t.Log(r)
			if r.Violations() != 0 || r.StaleRejected != 0 || r.LateWrites != 0 {
				t.Fatalf("healthy store: %s", r.Summary())
			}
			if r.Grants < 300 || r.Writes < 290 || r.StoreCalls < 2*r.Grants {
				t.Fatalf("too little recorded: %s, %d store calls", r.Summary(), r.StoreCalls)
			}
			if got := res.Names(); len(got) != 2 || got[0] != "a" || got[1] != "b" || res.Fenced() != tc.fenced {
				t.Errorf("resource: names %v, fenced %v", got, res.Fenced())
			}
			for _, name := range []string{"a", "b"} {
				s := r.Names[name]
				if tc.workload == chaos.Stock && s.Initial.Stock-s.Final.Stock != int64(s.Writes) {
					t.Errorf("%s: stock %d -> %d after %d purchases", name, s.Initial.Stock, s.Final.Stock, s.Writes)
				}
				if tc.workload == chaos.Set && len(s.Final.Members) != s.Writes {
					t.Errorf("%s: %d members after %d adds", name, len(s.Final.Members), s.Writes)
				}
			}
		})
	}
}

func TestRunKindsAreClean(t *testing.T) {
	rec := chaos.NewRecorder()
	res := chaos.NewResource(rec, true)
	ws := workers(t, 4, rec, res, chaos.Stock, time.Second)
	targets := []chaos.Target{
		{Name: "rw", Mode: chaos.Shared}, {Name: "rw", Mode: chaos.Exclusive, RW: true},
		{Name: "sem", Mode: chaos.Permit, Limit: 2},
	}
	chaos.Run(t.Context(), ws, targets, 300, 0)
	r := chaos.Check(rec.Events(), chaos.CheckOptions{})
	if r.Violations() != 0 || r.StaleRejected != 0 {
		t.Fatalf("kinds: %s\n%s", r.Summary(), r)
	}
}

// TestRunFindsAPausedHolder pauses one holder between its read and its
// write until its lease has expired and another holder has written: on an
// unfenced resource its late write must show as a lost update, on a fenced
// one as a refused access with nothing lost.
func TestRunFindsAPausedHolder(t *testing.T) {
	for _, fenced := range []bool{false, true} {
		t.Run(map[bool]string{false: "unfenced", true: "fenced"}[fenced], func(t *testing.T) {
			rec := chaos.NewRecorder()
			res := chaos.NewResource(rec, fenced)
			res.Init("x", chaos.Value{Stock: 10})
			ws := workers(t, 2, rec, res, chaos.Stock, 200*time.Millisecond)
			paused, other := ws[0], ws[1]
			paused.IgnoreLoss = true
			// In one process a pause cannot stop the renewals; without
			// them the lease runs out as a paused holder's would.
			paused.Options = []dlock.Option{dlock.WithAutoRenew(false)}
			var wrote atomic.Bool
			paused.BeforeWrite = func(ctx context.Context, l *dlock.Lease) {
				<-l.Done() // the lease runs out while "paused"
				for !wrote.Load() {
					res, err := other.Step(ctx, chaos.Target{Name: "x"})
					if err != nil {
						t.Error(err)
						return
					}
					wrote.Store(res.Wrote)
				}
			}
			res1, err := paused.Step(t.Context(), chaos.Target{Name: "x"})
			if err != nil {
				t.Fatal(err)
			}
			r := chaos.Check(rec.Events(), chaos.CheckOptions{})
			t.Log(r)
			if !res1.Lost || r.Losses != 1 || r.LateLossReports != 0 {
				t.Errorf("the paused lease: lost %v, losses %d, late reports %d", res1.Lost, r.Losses, r.LateLossReports)
			}
			if len(r.Overlaps) != 0 {
				t.Errorf("overlaps = %d, want none: the paused holder's window ended when it was told", len(r.Overlaps))
			}
			if fenced {
				if res1.Wrote || r.StaleRejected != 1 || r.Violations() != 0 || r.Names["x"].Final.Stock != 9 {
					t.Errorf("fenced: late write accepted %v; %s", res1.Wrote, r.Summary())
				}
				return
			}
			if !res1.Wrote || r.LateWrites != 1 || r.LostUpdates != 1 || r.StaleAccepted != 1 || len(r.NonLinearizable) != 1 {
				t.Errorf("unfenced: the late write must be found: %s", r.Summary())
			}
		})
	}
}

// TestRemote runs a worker against a resource and a recorder served over
// HTTP, as a child process would.
func TestRemote(t *testing.T) {
	rec := chaos.NewRecorder()
	res := chaos.NewResource(rec, true)
	res.Init("x", chaos.Value{Stock: 5})
	mux := http.NewServeMux()
	mux.Handle("/event", rec.Handler())
	mux.Handle("/resource/", res.Handler())
	srv := httptest.NewServer(mux)
	defer srv.Close()
	remote := &chaos.RemoteRecorder{URL: srv.URL + "/event"}
	c := dlock.New(chaos.Observe(memlock.New(), remote, "child"), dlock.WithTTL(time.Second))
	defer c.Close()
	w := &chaos.Worker{Client: "child", Locks: c, Resource: chaos.RemoteResource{URL: srv.URL + "/resource"}, Sink: remote}
	for range 6 {
		if _, err := w.Step(t.Context(), chaos.Target{Name: "x"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := remote.Err(); err != nil {
		t.Fatal(err)
	}
	// A stale fence is refused through HTTP as ErrStale.
	err := chaos.RemoteResource{URL: srv.URL + "/resource"}.Write(t.Context(), chaos.Access{Name: "x", Fence: 1}, chaos.Value{})
	if err != chaos.ErrStale {
		t.Fatalf("stale remote write: %v, want ErrStale", err)
	}
	r := chaos.Check(rec.Events(), chaos.CheckOptions{})
	if r.Grants != 6 || r.Writes != 5 || r.Names["x"].Final.Stock != 0 || r.StaleRejected != 1 || r.Violations() != 0 {
		t.Fatalf("remote: %s", r.Summary())
	}
}

// ttlSpy records the TTLs a backend is sent.
type ttlSpy struct {
	driver.Backend
	acquire, renew atomic.Int64
}

func (s *ttlSpy) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	s.acquire.Store(int64(req.TTL))
	return s.Backend.Acquire(ctx, req)
}

func (s *ttlSpy) Renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	s.renew.Store(int64(ttl))
	return s.Backend.Renew(ctx, key, token, ttl)
}

func TestObserveClockRate(t *testing.T) {
	spy := &ttlSpy{Backend: memlock.New()}
	rec := chaos.NewRecorder()
	b := chaos.Observe(spy, rec, "c", chaos.WithStoreClockRate(2))
	if _, ok := b.(driver.Notifier); ok {
		t.Fatal("a backend without notifications must not gain them")
	}
	if _, ok := b.(driver.BatchRenewer); ok {
		t.Fatal("a backend without batch renewal must not gain it")
	}
	c := dlock.New(b, dlock.WithTTL(time.Second))
	defer c.Close()
	l, err := c.Mutex("x").Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if a, r := time.Duration(spy.acquire.Load()), time.Duration(spy.renew.Load()); a != 500*time.Millisecond || r != 500*time.Millisecond {
		t.Errorf("TTLs sent: acquire %v, renew %v; want 500ms (1s at rate 2)", a, r)
	}
	kinds := map[chaos.Kind]int{}
	for _, e := range rec.Events() {
		kinds[e.Kind]++
		// The deadline a store call gives is the client's: the TTL it
		// asked for, not the one the skewed store was sent.
		if (e.Kind == chaos.KindStoreAcquire || e.Kind == chaos.KindStoreRenew) && time.Duration(e.Deadline-e.Start) != time.Second {
			t.Errorf("%s deadline = start + %v, want start + 1s", e.Kind, time.Duration(e.Deadline-e.Start))
		}
	}
	if kinds[chaos.KindStoreAcquire] != 1 || kinds[chaos.KindStoreRenew] != 1 || kinds[chaos.KindStoreRelease] != 1 {
		t.Errorf("store events: %v", kinds)
	}
	if _, ok := chaos.Observe(memlock.New(), rec, "c").(driver.Notifier); !ok {
		t.Error("memlock's notifications were lost")
	}
	if !chaos.Observe(memlock.New(), rec, "c").(driver.Capabler).Supports(driver.CapFair) {
		t.Error("memlock's capabilities were lost")
	}
}

func TestObserveRecordsWithdraw(t *testing.T) {
	rec := chaos.NewRecorder()
	b := chaos.Observe(memlock.New(), rec, "c")
	w, ok := b.(driver.Withdrawer)
	if !ok {
		t.Fatal("memlock's withdrawal was lost")
	}
	if err := w.Withdraw(t.Context(), "x", "tok"); err != nil {
		t.Fatal(err)
	}
	ev := rec.Events()
	if len(ev) != 1 || ev[0].Kind != chaos.KindStoreWithdraw || ev[0].Token != "tok" || ev[0].Name != "x" || ev[0].Outcome != chaos.OK {
		t.Errorf("events after a withdrawal: %+v; want one store-withdraw of token tok on x, OK", ev)
	}
	if got := chaos.KindStoreWithdraw.String(); got != "store-withdraw" {
		t.Errorf("KindStoreWithdraw.String() = %q", got)
	}
}
