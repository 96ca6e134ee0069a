package bench

import (
	"context"
	"math"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/memlock"
	"github.com/dlock-go/dlock/redislock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRunRedis(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := context.Background()
	newClient := func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr()}) }
	counter := RedisCounter{newClient()}
	defer counter[0].Close()
	subject := func(name string, opts ...dlock.Option) Subject {
		trips := new(Trips)
		s := Dlock(name, func(ctx context.Context, id int) (driver.Backend, func() error, error) {
			rdb := newClient()
			rdb.AddHook(trips.RedisHook())
			return redislock.New(rdb), rdb.Close, nil
		}, opts...)
		s.Counter, s.Trips = counter, trips
		return s
	}
	sub, fair := subject("dlock"), subject("dlock-fair", dlock.Fair())
	rawTrips := new(Trips)
	raw := RawRedis("raw", func() redis.UniversalClient {
		rdb := newClient()
		rdb.AddHook(rawTrips.RedisHook())
		return rdb
	}, 10*time.Second)
	raw.Counter, raw.Trips = counter, rawTrips
	rep := &Report{Machine: ThisMachine()}
	rtt, err := RedisRTT(ctx, counter[0], 200)
	if err != nil {
		t.Fatal(err)
	}
	rep.Baselines = map[string]Percentiles{"ping": rtt}
	for _, w := range []Workload{
		{Workers: 1, Names: 1, Duration: time.Second},
		{Workers: 8, Names: 1, CS: 100 * time.Microsecond, Duration: 2 * time.Second},
	} {
		for _, s := range []Subject{raw, sub, fair} {
			r, err := Run(ctx, s, w, nil)
			if err != nil {
				t.Fatal(err)
			}
			rep.Results = append(rep.Results, r)
		}
	}
	if err := rep.WriteTable(os.Stdout); err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		t.Logf("%s %s store commands per cycle: %v", r.Subject, r.Workload, r.Ops)
		if r.Grants == 0 || r.Errors != 0 {
			t.Errorf("%s %s: %d grants, %d errors (%s)", r.Subject, r.Workload, r.Grants, r.Errors, r.FirstError)
		}
		// One worker: every cycle is one acquire and one release, but for a
		// few calls of set-up (a script's first EVALSHA fails and is sent
		// again as EVAL); one more per cycle would be thousands.
		if extra := r.TripsPerCycle*float64(r.Grants) - 2*float64(r.Grants); r.Params.Workers == 1 && (extra < -0.5 || extra > 10) {
			t.Errorf("%s %s: %.5f round trips per cycle (%.0f beyond 2 per cycle), want 2", r.Subject, r.Workload, r.TripsPerCycle, extra)
		}
		if r.OpsPerCycle == 0 {
			t.Errorf("%s %s: no store commands counted", r.Subject, r.Workload)
		}
		// Each grant takes CPU on both sides: the server runs at least one
		// command, the workers at least make a request.
		if r.StoreCPUPerCycle <= 0 || r.ClientCPUPerCycle <= 0 {
			t.Errorf("%s %s: CPU per grant %v on the client, %v on the store; want both counted",
				r.Subject, r.Workload, r.ClientCPUPerCycle, r.StoreCPUPerCycle)
		}
		// One worker: dlock's acquire and release are a script each, raw's
		// release alone is one.
		want := 2.0
		if r.Subject == "raw" {
			want = 1
		}
		if r.Params.Workers == 1 && math.Abs(r.ScriptsPerCycle-want) > 0.01 {
			t.Errorf("%s %s: %.3f script calls per cycle, want %v", r.Subject, r.Workload, r.ScriptsPerCycle, want)
		}
	}
}

func TestRunMemlock(t *testing.T) {
	store := memlock.New()
	sub := Dlock("dlock", func(ctx context.Context, id int) (driver.Backend, func() error, error) {
		return store, nil, nil
	})
	r, err := Run(context.Background(), sub, Workload{Workers: 4, Names: 3, Duration: 300 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Grants == 0 || r.Errors != 0 || len(r.GrantsPerWorker) != 4 || r.Wait.N != r.Grants {
		t.Errorf("memlock run: %+v", r)
	}
}

func TestDlockSharedGivesPerClientWorkersOneClient(t *testing.T) {
	store := memlock.New()
	var opened, closed []int
	sub := DlockShared("dlock-pair", 2, func(ctx context.Context, id int) (driver.Backend, func() error, error) {
		opened = append(opened, id)
		return store, func() error { closed = append(closed, id); return nil }, nil
	})
	for range 2 { // a subject runs many workloads
		opened, closed = nil, nil
		r, err := Run(context.Background(), sub, Workload{Workers: 5, Names: 1, Duration: 200 * time.Millisecond}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if r.Grants == 0 || r.Errors != 0 || len(r.GrantsPerWorker) != 5 {
			t.Errorf("run: %+v", r)
		}
		if want := []int{0, 2, 4}; !slices.Equal(opened, want) || !slices.Equal(closed, want) {
			t.Errorf("Clients of workers %v opened, of %v closed; want %v: workers 0 and 1, 2 and 3, 4 alone", opened, closed, want)
		}
	}
}

// TestSummarize checks the statistics on a made-up history: worker 0 takes
// the name back twice while worker 1 waits through both grants.
func TestSummarize(t *testing.T) {
	t0 := time.Unix(0, 0)
	at := func(us int) time.Time { return t0.Add(time.Duration(us) * time.Microsecond) }
	cycles := [][]cycle{
		{ // worker 0: never blocked, releases at 20 and 45
			{worker: 0, called: at(0), granted: at(10), released: at(20)},
			{worker: 0, called: at(21), granted: at(25), released: at(45)},
		},
		{ // worker 1: calls at 5, granted at 50 after worker 0's second release
			{worker: 1, called: at(5), granted: at(50), released: at(60)},
		},
	}
	var res Result
	res.Elapsed = time.Second
	summarize(&res, cycles, Workload{Names: 1})
	if res.Grants != 3 || res.GrantsPerWorker[0] != 2 || res.GrantsPerWorker[1] != 1 {
		t.Fatalf("grants %d %v, want 3 [2 1]", res.Grants, res.GrantsPerWorker)
	}
	// Only worker 1's grant is a handoff (0 → 1, 5µs after the release);
	// worker 0 taking its own release back is not.
	if res.Handoff.N != 1 || res.Handoff.P50 != 5*time.Microsecond {
		t.Errorf("handoff %+v, want one of 5µs", res.Handoff)
	}
	// Worker 1 waited 45µs through worker 0's second grant; worker 0's
	// waits (10µs, 4µs) spanned nobody's grant.
	if res.Blocked.N != 1 || res.Blocked.Max != 45*time.Microsecond {
		t.Errorf("blocked %+v, want one of 45µs", res.Blocked)
	}
	if res.Wait.N != 3 || res.Wait.Max != 45*time.Microsecond || res.Wait.P50 != 10*time.Microsecond {
		t.Errorf("wait %+v, want 3 waits, p50 10µs, max 45µs", res.Wait)
	}
	if want := 9.0 / (2 * 5); math.Abs(res.Jain-want) > 1e-9 {
		t.Errorf("Jain %v, want %v", res.Jain, want)
	}
}

func TestParseCommandStats(t *testing.T) {
	got := parseCommandStats("# Commandstats\r\ncmdstat_set:calls=12,usec=3,usec_per_call=0.25\r\ncmdstat_info:calls=4,usec=1\r\ncmdstat_evalsha:calls=7,usec=9\r\nnoise\r\n")
	if len(got) != 2 || got["set"] != 12 || got["evalsha"] != 7 {
		t.Errorf("parseCommandStats = %v, want set 12, evalsha 7 (info left out)", got)
	}
}

func TestParseCPU(t *testing.T) {
	got, err := parseCPU("# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:0.250000\r\nused_cpu_sys_children:9.000000\r\nused_cpu_user_children:9.000000\r\n")
	if want := 1750 * time.Millisecond; err != nil || got != want {
		t.Errorf("parseCPU = %v, %v; want %v (system and user, without the children's)", got, err, want)
	}
	for _, bad := range []string{"# CPU\r\nused_cpu_sys:1.5\r\n", "used_cpu_sys:x\r\nused_cpu_user:1\r\n"} {
		if got, err := parseCPU(bad); err == nil {
			t.Errorf("parseCPU(%q) = %v, want an error", bad, got)
		}
	}
}
