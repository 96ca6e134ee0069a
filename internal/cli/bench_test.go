package cli_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/bench"
	"github.com/dlock-go/dlock/internal/test/testserver"
)

// benchShort are the flags of a short bench: 200ms per run, the uncontended
// and hot workloads, one critical section.
var benchShort = []string{"--duration", "200ms", "--workloads", "uncontended,hot", "--cs", "100us"}

// benchReport is a report of dlock bench --json, with its notes.
type benchReport struct {
	bench.Report
	Notes []string `json:"notes"`
}

// parseBench parses the output of dlock bench --json.
func parseBench(t *testing.T, r result) []benchReport {
	t.Helper()
	var reps []benchReport
	if err := json.Unmarshal([]byte(r.stdout), &reps); err != nil {
		t.Fatalf("bench --json: %v\n%s", err, r.stdout)
	}
	return reps
}

// checkResults checks that rep has a result for each subject on each
// workload, each with grants, no errors, and the store's operations per
// cycle (with round trips when trips is set).
func checkResults(t *testing.T, rep benchReport, subjects, workloads []string, trips bool) {
	t.Helper()
	if len(rep.Results) != len(subjects)*len(workloads) {
		t.Errorf("%s: %d results, want %d", rep.Store, len(rep.Results), len(subjects)*len(workloads))
	}
	for _, w := range workloads {
		for _, s := range subjects {
			r := rep.Find(s, w)
			switch {
			case r == nil:
				t.Errorf("%s: no result for %s on %s", rep.Store, s, w)
			case r.Grants <= 0 || r.Errors != 0:
				t.Errorf("%s: %s on %s: %d grants, %d errors (%s)", rep.Store, s, w, r.Grants, r.Errors, r.FirstError)
			case r.OpsPerCycle <= 0 || (trips && r.TripsPerCycle <= 0):
				t.Errorf("%s: %s on %s: %.2f store ops and %.2f round trips per cycle", rep.Store, s, w, r.OpsPerCycle, r.TripsPerCycle)
			}
		}
	}
	if rep.Machine.CPUs < 1 || rep.Started.IsZero() {
		t.Errorf("%s: machine %+v, started %v", rep.Store, rep.Machine, rep.Started)
	}
}

// noLocksLeft checks that dlock ls finds no lock on the store.
func noLocksLeft(t *testing.T, e *env, backend string) {
	t.Helper()
	r := e.run("ls", "--backend", backend)
	if r.code != 0 || r.stdout != "no locks held\n" {
		t.Errorf("ls after bench on %s: %d\n%s%s", backend, r.code, r.stdout, r.stderr)
	}
}

// TestBenchJSON benches Redis and SQLite in one run: a report per store,
// with its baseline and every subject's runs, nothing on stderr, and no
// lock left behind.
func TestBenchJSON(t *testing.T) {
	t.Parallel()
	redisBackend, _ := redisURL(t)
	sqliteBackend := sqliteURL(t)
	e := newEnv(t, "")
	charts := t.TempDir()
	r := e.run(append([]string{"bench", "--json", "--charts", charts, redisBackend, sqliteBackend}, benchShort...)...)
	expect(t, r, 0)
	if r.stderr != "" {
		t.Errorf("stderr is not empty:\n%s", r.stderr)
	}
	reps := parseBench(t, r)
	if len(reps) != 2 {
		t.Fatalf("%d reports, want 2:\n%s", len(reps), r.stdout)
	}
	subjects := []string{"dlock", "dlock-fair", "dlock-pair", "dlock-fair-pair", "raw"}
	workloads := []string{"uncontended", "hot-8w-cs100µs"}

	rd := reps[0]
	if !strings.HasPrefix(rd.Store, "redis at ") || rd.Baselines["ping"].N != 1000 || rd.Baselines["ping"].P50 <= 0 {
		t.Errorf("redis report: store %q, baselines %+v", rd.Store, rd.Baselines)
	}
	checkResults(t, rd, subjects, workloads, true)

	sq := reps[1]
	if !strings.HasPrefix(sq.Store, "SQLite file ") || sq.Baselines["select1"].N != 1000 {
		t.Errorf("sqlite report: store %q, baselines %+v", sq.Store, sq.Baselines)
	}
	checkResults(t, sq, subjects, workloads, false)
	for _, rep := range reps {
		if len(rep.Notes) != 0 {
			t.Errorf("%s: notes %q", rep.Store, rep.Notes)
		}
		if w := rep.Find("dlock", "hot-8w-cs100µs"); w != nil && (w.Params.Workers != 8 || w.Params.CS != 100*time.Microsecond || len(w.GrantsPerWorker) != 8) {
			t.Errorf("%s: hot workload %+v, grants per worker %v", rep.Store, w.Params, w.GrantsPerWorker)
		}
	}
	// One chart per store and workload, beside the JSON, with a series per
	// subject.
	for _, name := range []string{"bench-1-redis-uncontended.svg", "bench-1-redis-hot-8w-cs100us.svg",
		"bench-2-sqlite-uncontended.svg", "bench-2-sqlite-hot-8w-cs100us.svg"} {
		data, err := os.ReadFile(filepath.Join(charts, name))
		if err != nil {
			t.Errorf("chart: %v", err)
			continue
		}
		if n := strings.Count(string(data), `class="series"`); n != len(subjects) {
			t.Errorf("%s: %d series, want %d", name, n, len(subjects))
		}
	}
	noLocksLeft(t, e, redisBackend)
	noLocksLeft(t, e, sqliteBackend)
}

// TestBenchKinds runs rw and sem on Redis and SQLite: dlock and its pair
// subject on both, with the shapes the flags give; raw on Redis only; the
// fair subjects on neither, each left out with a note.
func TestBenchKinds(t *testing.T) {
	t.Parallel()
	redisBackend, _ := redisURL(t)
	sqliteBackend := sqliteURL(t)
	e := newEnv(t, "")
	charts := t.TempDir()
	r := e.run("bench", "--json", "--charts", charts, "--workloads", "rw,sem", "--workers", "6", "--writers", "3", "--permits", "2",
		"--duration", "200ms", redisBackend, sqliteBackend)
	expect(t, r, 0)
	reps := parseBench(t, r)
	if len(reps) != 2 {
		t.Fatalf("%d reports, want 2:\n%s", len(reps), r.stdout)
	}
	workloads := []string{"rw-6w-3wr-cs100µs", "sem2-6w-cs100µs"}
	checkResults(t, reps[0], []string{"dlock", "dlock-pair", "dlock-fair", "dlock-fair-pair", "raw"}, workloads, true)
	checkResults(t, reps[1], []string{"dlock", "dlock-pair"}, workloads, false)
	for i, rep := range reps {
		if w := rep.Find("dlock", workloads[0]); w != nil && (w.Params.Kind != bench.KindRW || w.Params.Writers != 3 || len(w.GrantsPerWorker) != 6) {
			t.Errorf("%s: rw workload %+v, grants per worker %v", rep.Store, w.Params, w.GrantsPerWorker)
		}
		if w := rep.Find("dlock", workloads[1]); w != nil && (w.Params.Kind != bench.KindSemaphore || w.Params.Permits != 2 || w.Handoff.N != 0) {
			t.Errorf("%s: sem workload %+v, %d handoffs", rep.Store, w.Params, w.Handoff.N)
		}
		var want []string // Redis runs every subject on both
		if i == 1 {
			want = []string{
				"no dlock-fair on rw-6w-3wr-cs100µs: sqlite stores have no fair read-write locks",
				"no dlock-fair-pair on rw-6w-3wr-cs100µs: sqlite stores have no fair read-write locks",
				"no dlock-fair on sem2-6w-cs100µs: sqlite stores have no fair semaphores",
				"no dlock-fair-pair on sem2-6w-cs100µs: sqlite stores have no fair semaphores",
				"no raw on rw-6w-3wr-cs100µs: the raw baseline has them on Redis only",
				"no raw on sem2-6w-cs100µs: the raw baseline has them on Redis only",
			}
		}
		for _, n := range want {
			if !slices.Contains(rep.Notes, n) {
				t.Errorf("%s: no note %q in %q", rep.Store, n, rep.Notes)
			}
		}
		if len(rep.Notes) != len(want) {
			t.Errorf("%s: notes %q, want %d", rep.Store, rep.Notes, len(want))
		}
	}
	// A chart per store and workload, a series per subject that ran.
	for name, series := range map[string]int{"bench-1-redis-rw-6w-3wr-cs100us.svg": 5, "bench-1-redis-sem2-6w-cs100us.svg": 5,
		"bench-2-sqlite-rw-6w-3wr-cs100us.svg": 2, "bench-2-sqlite-sem2-6w-cs100us.svg": 2} {
		data, err := os.ReadFile(filepath.Join(charts, name))
		if err != nil {
			t.Errorf("chart: %v", err)
		} else if n := strings.Count(string(data), `class="series"`); n != series {
			t.Errorf("%s: %d series, want %d", name, n, series)
		}
	}
	noLocksLeft(t, e, redisBackend)
	noLocksLeft(t, e, sqliteBackend)
}

// TestBenchTable: the store comes from DLOCK_BACKEND, or is the default
// SQLite file; the table has the baseline and a row per run.
func TestBenchTable(t *testing.T) {
	row := func(subject, workload string) *regexp.Regexp {
		return regexp.MustCompile(`(?m)^ *` + regexp.QuoteMeta(subject) + ` +` + regexp.QuoteMeta(workload) + ` +\d+ +[\d.]+ `)
	}
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		backend, _ := redisURL(t)
		e := newEnv(t, backend)
		r := e.run("bench", "--subjects", "raw,dlock", "--workers", "3", "--duration", "200ms", "--workloads", "hot,uncontended", "--cs", "0")
		expect(t, r, 0)
		for _, want := range []string{"machine: ", "\nstore:   redis at ", "\nbaseline ping: p50 ", "subject  ", "workload  ", "grants/s", "errors"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("table does not contain %q:\n%s", want, r.stdout)
			}
		}
		// In the order asked: workload by workload, the subjects of each.
		var at []int
		for _, sw := range [][2]string{{"raw", "hot-3w-cs0s"}, {"dlock", "hot-3w-cs0s"}, {"raw", "uncontended"}, {"dlock", "uncontended"}} {
			loc := row(sw[0], sw[1]).FindStringIndex(r.stdout)
			if loc == nil {
				t.Fatalf("no row for %s %s:\n%s", sw[0], sw[1], r.stdout)
			}
			at = append(at, loc[0])
		}
		for i := 1; i < len(at); i++ {
			if at[i] < at[i-1] {
				t.Errorf("rows out of order:\n%s", r.stdout)
			}
		}
		if strings.Contains(r.stdout, "dlock-fair") {
			t.Errorf("dlock-fair ran without being asked for:\n%s", r.stdout)
		}
		noLocksLeft(t, e, backend)
	})
	t.Run("default store", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, "")
		r := e.run("bench", "--subjects", "dlock", "--workloads", "uncontended", "--duration", "200ms")
		expect(t, r, 0)
		if !strings.Contains(r.stdout, "store:   SQLite file "+e.state) || !strings.Contains(r.stdout, "baseline select1: ") ||
			!row("dlock", "uncontended").MatchString(r.stdout) {
			t.Errorf("bench on the default store:\n%s", r.stdout)
		}
	})
}

// TestBenchRedlock: Redlock has no raw baseline and no fair lock, which
// the report says; its baselines are one per node.
func TestBenchRedlock(t *testing.T) {
	t.Parallel()
	var addrs []string
	for range 3 {
		addrs = append(addrs, testserver.StartRedis(t).Addr())
	}
	// A node timeout a loaded machine cannot miss: the report is checked,
	// not Redlock's timeouts.
	backend := "redlock://" + strings.Join(addrs, ",") + "?node_timeout=2s"
	e := newEnv(t, "")
	r := e.run("bench", "--workloads", "uncontended", "--duration", "200ms", "--json", backend)
	expect(t, r, 0)
	reps := parseBench(t, r)
	if len(reps) != 1 {
		t.Fatalf("%d reports, want 1:\n%s", len(reps), r.stdout)
	}
	rep := reps[0]
	checkResults(t, rep, []string{"dlock", "dlock-pair"}, []string{"uncontended"}, true)
	for i := 1; i <= 3; i++ {
		if rep.Baselines["ping-node-"+strconv.Itoa(i)].N == 0 {
			t.Errorf("no baseline for node %d: %+v", i, rep.Baselines)
		}
	}
	if notes := strings.Join(rep.Notes, "\n"); len(rep.Notes) != 3 || !strings.Contains(notes, "no dlock-fair:") || !strings.Contains(notes, "no dlock-fair-pair:") || !strings.Contains(notes, "no raw baseline on Redlock") {
		t.Errorf("notes %q", rep.Notes)
	}

	r = e.run("bench", "--workloads", "uncontended", "--subjects", "raw", "--duration", "200ms", backend)
	expect(t, r, 0)
	if !strings.Contains(r.stdout, "note: no raw baseline on Redlock") {
		t.Errorf("table does not say that Redlock has no raw baseline:\n%s", r.stdout)
	}
	noLocksLeft(t, e, backend)
}

// TestBenchUsage: bad flags and URLs are usage errors, an unreachable store
// exits 69, each with a one-line message.
func TestBenchUsage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sqliteURL(t))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--duration", "soon"}, `--duration "soon": want a duration`},
		{[]string{"--duration", "0"}, "--duration must be positive, not 0s"},
		{[]string{"--workers", "0"}, "--workers must be at least 1, not 0"},
		{[]string{"--names", "-3"}, "--names must be at least 1, not -3"},
		{[]string{"--workloads", "hot,cold"}, `--workloads: unknown "cold"; want a comma list of uncontended, hot, keys`},
		{[]string{"--workloads", ""}, `--workloads: unknown ""`},
		{[]string{"--subjects", "dlock,redsync"}, `--subjects: unknown "redsync"; want a comma list of dlock, dlock-fair, dlock-pair, dlock-fair-pair, raw`},
		{[]string{"--cs", "0,fast"}, `--cs: "fast" is not a duration`},
		{[]string{"--workloads", "rw", "--writers", "0"}, "--writers must be between 1 and 7 (--workers − 1) for rw, not 0"},
		{[]string{"--workloads", "hot,rw", "--writers", "8"}, "--writers must be between 1 and 7 (--workers − 1) for rw, not 8"},
		{[]string{"--workloads", "rw", "--workers", "1"}, "--workers must be at least 2 for rw (a writer and a reader), not 1"},
		{[]string{"--workloads", "sem", "--permits", "0"}, "--permits must be between 1 and 1048576 for sem, not 0"},
		{[]string{"--workloads", "rw,sem,cold"}, `--workloads: unknown "cold"; want a comma list of uncontended, hot, keys, rw, sem`},
		{[]string{"--cs", "-1ms"}, "--cs: -1ms is negative"},
		{[]string{"--json=maybe"}, `--json "maybe": want true or false`},
		{[]string{"localhost:6379"}, `store "localhost:6379": not a URL`},
		{[]string{"redis://u:hunter2@localhost:99999/0"}, `store "redis://u:xxxxx@localhost:99999/0": port 99999 is out of range`},
	} {
		r := e.run(append([]string{"bench"}, c.args...)...)
		if strings.HasPrefix(c.want, "store ") { // as for --backend: no usage line
			expect(t, r, 64, c.want)
			oneLine(t, r)
		} else {
			expect(t, r, 64, c.want, "usage: dlock bench [flags] [URL...]")
		}
		if strings.Contains(r.stderr, "hunter2") {
			t.Errorf("stderr shows the password:\n%s", r.stderr)
		}
	}
	// A bad URL is refused before any store is benched.
	r := e.run("bench", sqliteURL(t), "memcached://localhost:11211")
	expect(t, r, 64, `unknown scheme "memcached"`)
	if r.stdout != "" {
		t.Errorf("stdout before a usage error:\n%s", r.stdout)
	}

	r = e.run("bench", "--connect-timeout", "2s", "redis://127.0.0.1:"+strconv.Itoa(closedPort(t))+"/0")
	expect(t, r, 69, "cannot reach redis at 127.0.0.1:")
	oneLine(t, r)

	r = e.run("help", "bench")
	expect(t, r, 0)
	for _, f := range []string{"--subjects ", "--workloads ", "--workers ", "--names ", "--writers ", "--permits ", "--cs ", "--duration ", "--json ", "--charts ", "--backend ", "--connect-timeout "} {
		if !strings.Contains(r.stdout, f) {
			t.Errorf("dlock help bench does not document %s", f)
		}
	}
	if r = e.run("help"); !regexp.MustCompile(`(?m)^  bench +\S`).MatchString(r.stdout) {
		t.Errorf("dlock help does not list bench:\n%s", r.stdout)
	}
}

// TestBenchInterrupt: SIGINT ends a long bench at once, exit 130, and the
// locks its workers held are released, dlock's and the raw baseline's.
func TestBenchInterrupt(t *testing.T) {
	t.Parallel()
	backend, srv := redisURL(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	e := newEnv(t, backend)
	rawKeys := func() []string {
		keys, err := rdb.Keys(context.Background(), "dlock-bench/*").Result()
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}
	dlockLocks := func() bool {
		r := e.run("ls", "--json", "dlock-bench/")
		if r.code != 0 {
			t.Fatalf("ls: %d %s", r.code, r.stderr)
		}
		return strings.TrimSpace(r.stdout) != "[]"
	}
	for _, c := range []struct {
		subject string
		held    func() bool // a worker holds a lock
	}{
		{"dlock", dlockLocks},
		{"raw", func() bool { return len(rawKeys()) > 0 }},
	} {
		// A long critical section: the signal comes while a worker holds
		// the lock, and its release would be cancelled with the run.
		p := e.start("bench", "--subjects", c.subject, "--workloads", "hot", "--workers", "2", "--cs", "100ms", "--duration", "10m")
		deadline := time.Now().Add(30 * time.Second)
		for !c.held() {
			select {
			case <-p.done:
				t.Fatalf("bench %s ended (%d) before it held a lock:\n%s", c.subject, p.res.code, p.res.stderr)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("bench %s held no lock within 30s", c.subject)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		r := p.wait()
		expect(t, r, 130, "dlock: SIGINT: bench stopped")
		if r.stdout != "" {
			t.Errorf("bench %s printed a report after SIGINT:\n%s", c.subject, r.stdout)
		}
		if dlockLocks() {
			t.Errorf("bench %s left dlock locks behind:\n%s", c.subject, e.run("ls").stdout)
		}
		if keys := rawKeys(); len(keys) > 0 {
			t.Errorf("bench %s left raw locks behind: %q", c.subject, keys)
		}
	}
}

// TestBenchOtherStores runs the uncontended workload on MariaDB, PostgreSQL,
// Redis Sentinel and a one-node Redis Cluster: every subject, its raw
// baseline included, completes grants with the store's operations counted.
func TestBenchOtherStores(t *testing.T) {
	stores := []struct {
		name     string
		baseline string
		trips    bool
		start    func(t *testing.T) string
	}{
		{"mysql", "select1", false, func(t *testing.T) string {
			m := testserver.StartMariaDB(t)
			m.CreateDatabase(t, "locks")
			return "mysql://root@" + m.Addr() + "/locks"
		}},
		{"postgres", "select1", false, func(t *testing.T) string {
			p := testserver.StartPostgres(t)
			p.CreateDatabase(t, "locks")
			return p.URL("locks")
		}},
		{"redis+sentinel", "ping", true, func(t *testing.T) string {
			set := testserver.StartSentinel(t)
			return "redis+sentinel://" + strings.Join(set.SentinelAddrs(), ",") + "/" + set.MasterName()
		}},
		{"redis+cluster", "ping", true, func(t *testing.T) string {
			return "redis+cluster://" + testserver.StartCluster(t, 1).Addrs()[0]
		}},
	}
	for _, s := range stores {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			backend := s.start(t)
			e := newEnv(t, "")
			r := e.run("bench", "--workloads", "uncontended", "--duration", "200ms", "--json", backend)
			expect(t, r, 0)
			reps := parseBench(t, r)
			if len(reps) != 1 {
				t.Fatalf("%d reports, want 1:\n%s", len(reps), r.stdout)
			}
			if reps[0].Baselines[s.baseline].N == 0 {
				t.Errorf("no %s baseline: %+v", s.baseline, reps[0].Baselines)
			}
			checkResults(t, reps[0], []string{"dlock", "dlock-fair", "dlock-pair", "dlock-fair-pair", "raw"}, []string{"uncontended"}, s.trips)
			noLocksLeft(t, e, backend)
		})
	}
}
