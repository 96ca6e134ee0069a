package cli_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/test/testserver"
)

// kindsJSON mirrors ls --json and inspect --json with the fields of shared
// holds, queues and writer intents.
type kindsJSON struct {
	lockJSON
	Shared []struct {
		Owner       string `json:"owner"`
		Fence       uint64 `json:"fence"`
		HeldForMS   *int64 `json:"held_for_ms"`
		ExpiresInMS int64  `json:"expires_in_ms"`
	} `json:"shared"`
	Limit         int  `json:"limit"`
	Queued        int  `json:"queued"`
	WriterWaiting bool `json:"writer_waiting"`
}

// holding is a dlock run whose command holds the lock until the test lets
// it go.
type holding struct {
	*proc
	dir, id string
	kind    string // $DLOCK_KIND
	fence   uint64 // $DLOCK_FENCE
	fair    bool   // $DLOCK_FAIR is 1
	pid     string // "|pid N|", as in its owner string
}

// hold starts dlock run with args (flags and the lock's name), whose
// command writes "$DLOCK_KIND $DLOCK_FENCE $DLOCK_FAIR" to DIR/ID.in and
// then runs until DIR/ID.go exists. With wait it returns once the command
// runs.
func hold(t *testing.T, e *env, dir, id string, wait bool, args ...string) *holding {
	t.Helper()
	script := fmt.Sprintf(`echo "$DLOCK_KIND $DLOCK_FENCE $DLOCK_FAIR" > "$DIR/%[1]s.tmp" && mv "$DIR/%[1]s.tmp" "$DIR/%[1]s.in"; `+
		`while [ ! -e "$DIR/%[1]s.go" ]; do sleep 0.05; done`, id)
	p := e.start(append(args, "--", "sh", "-c", script)...)
	h := &holding{proc: p, dir: dir, id: id, pid: fmt.Sprintf("|pid %d|", p.cmd.Process.Pid)}
	if wait {
		h.running(t)
	}
	return h
}

// running waits until h's command runs, and reads its kind, fence and
// fairness.
func (h *holding) running(t *testing.T) {
	t.Helper()
	var fair string
	n, err := fmt.Sscan(waitFile(t, filepath.Join(h.dir, h.id+".in"), h.proc), &h.kind, &h.fence, &fair)
	if n < 2 {
		t.Fatalf("%s: %v", h.id, err)
	}
	h.fair = fair == "1"
}

// isRunning reports whether h's command has started.
func (h *holding) isRunning() bool {
	_, err := os.Stat(filepath.Join(h.dir, h.id+".in"))
	return err == nil
}

// let ends h's command, and waits for dlock to exit 0.
func (h *holding) let(t *testing.T) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(h.dir, h.id+".go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	expect(t, h.wait(), 0)
}

// lsLine returns the line of ls's table for the lock name, and the header.
func lsLine(t *testing.T, e *env, name string) (header, line string) {
	t.Helper()
	r := e.run("ls")
	expect(t, r, 0)
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	for _, l := range lines[1:] {
		if strings.HasPrefix(l, name+" ") {
			return lines[0], l
		}
	}
	t.Fatalf("ls does not list %q:\n%s", name, r.stdout)
	return "", ""
}

// inspectJSON returns inspect --json's answer for name.
func inspectJSON(t *testing.T, e *env, name string) kindsJSON {
	t.Helper()
	r := e.run("inspect", "--json", name)
	var j kindsJSON
	if err := json.Unmarshal([]byte(r.stdout), &j); err != nil {
		t.Fatalf("inspect --json %s: %v (exit %d)\n%s%s", name, err, r.code, r.stdout, r.stderr)
	}
	return j
}

// TestRunShared: two --shared runs hold the lock at once; a plain run (the
// writer) waits for both, and once it waits new readers wait behind it; ls,
// inspect and release --force show and remove the readers.
func TestRunShared(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		dir := t.TempDir()
		e := newEnv(t, backend, "DIR="+dir)

		// Both readers hold it together: the second is not made to wait
		// (--wait 0) while the first runs.
		r1 := hold(t, e, dir, "r1", true, "run", "--shared", "book")
		r2 := hold(t, e, dir, "r2", true, "run", "--shared", "book")
		if r1.kind != "shared" || r2.kind != "shared" || r1.fence == r2.fence {
			t.Errorf("readers: %s %d, %s %d", r1.kind, r1.fence, r2.kind, r2.fence)
		}

		expect(t, e.run("run", "book", "--", "echo", "ran"), 75, `"book": 2 readers hold it (the last expires in`, "not waiting (--wait 0)")

		header, line := lsLine(t, e, "book")
		if !regexp.MustCompile(`^NAME +OWNER +FENCE +HELD FOR +EXPIRES IN +HOLDS +SHARED +WAITING$`).MatchString(header) ||
			!regexp.MustCompile(`^book +- +- +- +- +- +2 readers +-$`).MatchString(line) {
			t.Errorf("ls:\n%s\n%s", header, line)
		}
		r := e.run("inspect", "book")
		expect(t, r, 0)
		if !strings.Contains(r.stdout, "\n\nREADER ") || !strings.Contains(r.stdout, r1.pid) || !strings.Contains(r.stdout, r2.pid) ||
			!regexp.MustCompile(fmt.Sprintf(`\n\S+\|pid \d+\|\S+ +%d +[\d.]+m?s +[\d.]+s\n`, r1.fence)).MatchString(r.stdout) {
			t.Errorf("inspect book:\n%s", r.stdout)
		}
		j := inspectJSON(t, e, "book")
		if !j.Held || j.Owner != "" || len(j.Shared) != 2 || j.Limit != 0 || j.WriterWaiting ||
			!strings.Contains(j.Shared[0].Owner+j.Shared[1].Owner, r1.pid) || j.Shared[0].ExpiresInMS <= 0 || j.Shared[0].HeldForMS == nil {
			t.Errorf("inspect --json: %+v", j)
		}

		// The writer waits for the readers; a new reader now waits for it.
		w := hold(t, e, dir, "w", false, "run", "--wait", "60s", "book")
		waitStderr(t, w.proc, `"book": 2 readers hold it`)
		expect(t, e.run("run", "--shared", "book", "--", "echo", "ran"), 75,
			`"book": a writer is waiting (owner `, w.pid, "not waiting (--wait 0)")
		if _, line := lsLine(t, e, "book"); !regexp.MustCompile(`^book +- +- +- +- +- +2 readers +writer$`).MatchString(line) {
			t.Errorf("ls with a writer waiting: %q", line)
		}
		if j := inspectJSON(t, e, "book"); !j.WriterWaiting {
			t.Errorf("inspect --json with a writer waiting: %+v", j)
		}
		late := hold(t, e, dir, "late", false, "run", "--shared", "--wait", "60s", "book")
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("the store:\n%s\nthe writer's stderr:\n%s\nthe late reader's stderr:\n%s",
					e.run("inspect", "book").stdout, w.proc.stderrSoFar(), late.proc.stderrSoFar())
			}
		})
		waitStderr(t, late.proc, `"book": a writer is waiting (owner `)

		r1.let(t)
		waitStderr(t, w.proc, `"book": now 1 reader holds it`)
		if w.isRunning() {
			t.Fatal("the writer runs beside a reader")
		}
		r2.let(t)
		w.running(t)
		if w.kind != "exclusive" || w.fence <= r2.fence || w.fence <= r1.fence {
			t.Errorf("writer: %s %d after readers %d, %d", w.kind, w.fence, r1.fence, r2.fence)
		}
		expect(t, e.run("run", "--shared", "book", "--", "echo", "ran"), 75, `"book" is held by `, w.pid)
		if late.isRunning() {
			t.Fatal("a reader runs beside the writer")
		}
		w.let(t)
		late.running(t)
		if late.fence <= w.fence {
			t.Errorf("the late reader's fence %d is not above the writer's %d", late.fence, w.fence)
		}

		// release --force names every reader it removed; they stop.
		other := hold(t, e, dir, "other", true, "run", "--shared", "book")
		r = e.run("release", "--force", "book")
		expect(t, r, 0)
		lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
		if len(lines) != 3 || lines[0] != `released "book", held by 2 readers:` ||
			!regexp.MustCompile(`^  \S+\|pid \d+\|\S+ \(fence \d+, held for [\d.]+m?s\)$`).MatchString(lines[1]) ||
			!strings.Contains(r.stdout, late.pid) || !strings.Contains(r.stdout, other.pid) {
			t.Errorf("release --force:\n%s", r.stdout)
		}
		expect(t, late.wait(), 76, `lost lock "book"`)
		expect(t, other.wait(), 76, `lost lock "book"`)
	})
}

// TestRunSemaphore: --semaphore 2 lets two runs hold the name at once and
// makes a third wait for a permit; ls and inspect show the permits.
func TestRunSemaphore(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		dir := t.TempDir()
		e := newEnv(t, backend, "DIR="+dir)
		p1 := hold(t, e, dir, "p1", true, "run", "--semaphore", "2", "pool")
		p2 := hold(t, e, dir, "p2", true, "run", "--semaphore", "2", "pool")
		if p1.kind != "semaphore" || p2.kind != "semaphore" || p1.fence == p2.fence {
			t.Errorf("permits: %s %d, %s %d", p1.kind, p1.fence, p2.kind, p2.fence)
		}
		expect(t, e.run("run", "--semaphore", "2", "pool", "--", "echo", "ran"), 75,
			`"pool": 2 of 2 permits in use (next expires in`, "not waiting (--wait 0)")

		if _, line := lsLine(t, e, "pool"); !regexp.MustCompile(`^pool +- +- +- +- +- +2/2 permits +-$`).MatchString(line) {
			t.Errorf("ls: %q", line)
		}
		r := e.run("inspect", "pool")
		expect(t, r, 0)
		if !strings.Contains(r.stdout, "\n\nPERMIT HOLDER ") || !strings.Contains(r.stdout, p1.pid) || !strings.Contains(r.stdout, p2.pid) {
			t.Errorf("inspect pool:\n%s", r.stdout)
		}
		if j := inspectJSON(t, e, "pool"); j.Limit != 2 || len(j.Shared) != 2 {
			t.Errorf("inspect --json: %+v", j)
		}

		p3 := hold(t, e, dir, "p3", false, "run", "--semaphore", "2", "--wait", "60s", "pool")
		waitStderr(t, p3.proc, `"pool": 2 of 2 permits in use (next expires in`)
		if p3.isRunning() {
			t.Fatal("a third permit holder runs")
		}
		// A plain run on the name waits for every permit.
		expect(t, e.run("run", "pool", "--", "echo", "ran"), 75, `"pool": 2 of 2 permits in use (the last expires in`)
		p1.let(t)
		p3.running(t)
		if p3.fence <= p2.fence {
			t.Errorf("fence %d after %d", p3.fence, p2.fence)
		}
		p2.let(t)
		p3.let(t)
	})
}

// TestRunKindConflict: while permits of --semaphore 3 are held, --semaphore
// 2 and --shared on the name fail at once (exit 64, even with --wait)
// naming both kinds; once the permits are gone, --shared takes the name.
func TestRunKindConflict(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		dir := t.TempDir()
		e := newEnv(t, backend, "DIR="+dir)
		p1 := hold(t, e, dir, "p1", true, "run", "--semaphore", "3", "pool")
		start := time.Now()
		expect(t, e.run("run", "--semaphore", "2", "--wait", "60s", "pool", "--", "echo", "ran"), 64,
			`semaphore "pool" of 2 permits refused: the name is held by permits of a semaphore of 3 (1 hold, by `)
		expect(t, e.run("run", "--shared", "--wait", "60s", "pool", "--", "echo", "ran"), 64,
			`read lock "pool" refused: the name is held by permits of a semaphore of 3`)
		if took := time.Since(start); took > 20*time.Second {
			t.Errorf("the conflicting runs took %v, want no wait", took)
		}
		p1.let(t)
		r := e.run("run", "--shared", "pool", "--", "echo", "ran")
		expect(t, r, 0)
		if !strings.Contains(r.stdout, "ran") {
			t.Errorf("--shared after the permits: stdout %q", r.stdout)
		}
	})
}

// TestRunSemaphoreAtMostN: three runs with --semaphore 2, two rounds each,
// log when their commands start and end: never more than two at once.
func TestRunSemaphoreAtMostN(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		out := filepath.Join(t.TempDir(), "log")
		e := newEnv(t, backend, "OUT="+out)
		script := `echo "start $(date +%s%N) $DLOCK_FENCE" >> "$OUT"; sleep 0.3; echo "end $(date +%s%N) $DLOCK_FENCE" >> "$OUT"`
		var wg sync.WaitGroup
		results := make(chan result, 6)
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 2 {
					results <- e.run("run", "--semaphore", "2", "--wait", "60s", "--ttl", "2s", "--kill-grace", "200ms", "sem", "--", "sh", "-c", script)
				}
			}()
		}
		wg.Wait()
		close(results)
		for r := range results {
			expect(t, r, 0)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		type event struct {
			at    int64
			delta int
		}
		var events []event
		fences := map[uint64]int{}
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			kind := strings.Fields(l)[0]
			at, fence := parseEvent(t, l, kind)
			fences[fence]++
			if kind == "start" {
				events = append(events, event{at, +1})
			} else {
				events = append(events, event{at, -1})
			}
		}
		if len(events) != 12 || len(fences) != 6 {
			t.Fatalf("%d events with %d fences, want 12 with 6:\n%s", len(events), len(fences), b)
		}
		// Ends sort before starts at the same time: touching is not overlapping.
		sort.Slice(events, func(i, j int) bool {
			return events[i].at < events[j].at || events[i].at == events[j].at && events[i].delta < events[j].delta
		})
		n, most := 0, 0
		for _, ev := range events {
			n += ev.delta
			most = max(most, n)
		}
		if most > 2 {
			t.Errorf("%d commands ran at once with --semaphore 2:\n%s", most, b)
		}
	})
}

// TestRunFair: waiters of a --fair lock get it in the order they came, and
// each says its place in the queue; ls shows the queue.
func TestRunFair(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		dir := t.TempDir()
		order := filepath.Join(dir, "order")
		e := newEnv(t, backend, "DIR="+dir, "ORDER="+order)
		h := hold(t, e, dir, "h", true, "run", "--fair", "q")
		if h.kind != "fair" || !h.fair {
			t.Errorf("DLOCK_KIND %q, DLOCK_FAIR set %v; want fair and 1", h.kind, h.fair)
		}
		var waiters []*proc
		for i := 1; i <= 3; i++ {
			p := e.start("run", "--fair", "--wait", "60s", "q", "--", "sh", "-c", fmt.Sprintf(`echo %d >> "$ORDER"`, i))
			// The next one starts once this one is queued: the order of
			// arrival is known.
			waitStderr(t, p, `"q" is held by `)
			waitStderr(t, p, []string{"", "1st", "2nd", "3rd"}[i]+" in the queue")
			waiters = append(waiters, p)
		}
		if !strings.Contains(waiters[0].stderrSoFar(), h.pid) {
			t.Errorf("the first waiter does not name the holder:\n%s", waiters[0].stderrSoFar())
		}
		if _, line := lsLine(t, e, "q"); !regexp.MustCompile(`^q +\S+\|pid \d+\|\S+ +\d+ +[\d.]+m?s +[\d.]+s +1 +- +3 queued$`).MatchString(line) {
			t.Errorf("ls: %q", line)
		}
		if j := inspectJSON(t, e, "q"); j.Queued != 3 || !strings.Contains(j.Owner, h.pid) {
			t.Errorf("inspect --json: %+v", j)
		}
		expect(t, e.run("run", "--fair", "q", "--", "echo", "ran"), 75, `"q" is held by `, h.pid)

		r := e.run("release", "--force", "q")
		expect(t, r, 0)
		if !strings.Contains(r.stdout, h.pid) || !strings.HasSuffix(r.stdout, "\n3 waiters stay in its queue\n") {
			t.Errorf("release --force:\n%s", r.stdout)
		}
		expect(t, h.wait(), 76, `lost lock "q"`)
		for _, p := range waiters {
			expect(t, p.wait(), 0)
		}
		if got := waitFile(t, order, nil); got != "1\n2\n3\n" {
			t.Errorf("the waiters ran in the order %q, want 1 2 3", got)
		}
	})
}

// leftFree checks that the store keeps nothing of the lock name but its
// fence counter and its records of recent releases and late requests
// (which expire by themselves): no hold, no queue entry, no writer intent.
func leftFree(t *testing.T, e *env, rdb *testserver.Redis, name string) {
	t.Helper()
	if r := e.run("inspect", name); r.code != 1 || r.stdout != fmt.Sprintf("lock %q is not held\n", name) {
		t.Errorf("inspect %s: exit %d\n%s%s", name, r.code, r.stdout, r.stderr)
	}
	keys, err := rdb.Client(t).Keys(t.Context(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if !strings.HasSuffix(k, ":fence") && !strings.HasSuffix(k, ":r") && !strings.HasSuffix(k, ":late") {
			t.Errorf("key %q left on the store (keys %v)", k, keys)
		}
	}
}

// TestRunFairSemaphore: runs of --semaphore 1 --fair get the permit in the
// order they came, each saying its place in the queue; a fair run that does
// not wait yields to the queue; the name is left free. On one Redis node, a
// Sentinel set and a Cluster.
func TestRunFairSemaphore(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		u, rdb := redisURL(t)
		testRunFairSemaphore(t, u, rdb)
	})
	t.Run("sentinel", func(t *testing.T) {
		t.Parallel()
		set := testserver.StartSentinel(t)
		testRunFairSemaphore(t, "redis+sentinel://"+strings.Join(set.SentinelAddrs(), ",")+"/"+set.MasterName(), set.Primary(t))
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		c := testserver.StartCluster(t, 1)
		testRunFairSemaphore(t, "redis+cluster://"+c.Addrs()[0], c.Node(0))
	})
}

// testRunFairSemaphore is TestRunFairSemaphore on the store at u, whose
// keys are on rdb.
func testRunFairSemaphore(t *testing.T, u string, rdb *testserver.Redis) {
	dir := t.TempDir()
	e := newEnv(t, u, "DIR="+dir)
	p1 := hold(t, e, dir, "p1", true, "run", "--semaphore", "1", "--fair", "fpool")
	if p1.kind != "semaphore" || !p1.fair {
		t.Errorf("DLOCK_KIND %q, DLOCK_FAIR set %v; want semaphore and 1", p1.kind, p1.fair)
	}
	p2 := hold(t, e, dir, "p2", false, "run", "--semaphore", "1", "--fair", "--wait", "60s", "fpool")
	waitStderr(t, p2.proc, `"fpool": 1 of 1 permits in use (next expires in`)
	waitStderr(t, p2.proc, "1st in the queue")
	p3 := hold(t, e, dir, "p3", false, "run", "--fair", "--semaphore", "1", "--wait", "60s", "fpool")
	waitStderr(t, p3.proc, "2nd in the queue")
	if _, line := lsLine(t, e, "fpool"); !regexp.MustCompile(`^fpool +- +- +- +- +- +1/1 permits +2 queued$`).MatchString(line) {
		t.Errorf("ls: %q", line)
	}
	expect(t, e.run("run", "--semaphore", "1", "--fair", "fpool", "--", "echo", "ran"), 75, `"fpool": 1 of 1 permits in use`)

	p1.let(t)
	p2.running(t)
	if p3.isRunning() {
		t.Fatal("the third run got the permit beside the second")
	}
	p2.let(t)
	p3.running(t)
	if p2.fence <= p1.fence || p3.fence <= p2.fence || !p3.fair {
		t.Errorf("fences %d, %d, %d (DLOCK_FAIR set %v); want increasing and 1", p1.fence, p2.fence, p3.fence, p3.fair)
	}
	p3.let(t)
	leftFree(t, e, rdb, "fpool")
}

// TestRunFairShared: --fair --shared runs hold the name together; a fair
// writer queued behind them goes before a fair reader that came after it,
// and each waiter says its place; the name is left free.
func TestRunFairShared(t *testing.T) {
	t.Parallel()
	u, rdb := redisURL(t)
	dir := t.TempDir()
	e := newEnv(t, u, "DIR="+dir)
	r1 := hold(t, e, dir, "r1", true, "run", "--fair", "--shared", "book")
	r2 := hold(t, e, dir, "r2", true, "run", "--shared", "--fair", "book")
	if r1.kind != "shared" || !r1.fair || r2.kind != "shared" || r1.fence == r2.fence {
		t.Errorf("readers: %s %d (DLOCK_FAIR set %v), %s %d", r1.kind, r1.fence, r1.fair, r2.kind, r2.fence)
	}
	w := hold(t, e, dir, "w", false, "run", "--fair", "--wait", "60s", "book")
	waitStderr(t, w.proc, `"book": 2 readers hold it`)
	waitStderr(t, w.proc, "1st in the queue")
	late := hold(t, e, dir, "late", false, "run", "--fair", "--shared", "--wait", "60s", "book")
	waitStderr(t, late.proc, `"book": a writer is waiting (owner `)
	waitStderr(t, late.proc, "and readers let it go first; 2nd in the queue")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the store:\n%s\nthe writer's stderr:\n%s\nthe late reader's stderr:\n%s",
				e.run("inspect", "book").stdout, w.proc.stderrSoFar(), late.proc.stderrSoFar())
		}
	})

	r1.let(t)
	r2.let(t)
	w.running(t)
	if late.isRunning() {
		t.Fatal("a reader runs beside the writer")
	}
	w.let(t)
	late.running(t)
	if w.fence <= r2.fence || late.fence <= w.fence || !late.fair {
		t.Errorf("fences: readers %d, %d, writer %d, late reader %d (DLOCK_FAIR set %v)", r1.fence, r2.fence, w.fence, late.fence, late.fair)
	}
	late.let(t)
	leftFree(t, e, rdb, "book")
}

// TestRunFairSharedNeedsRedis: on SQLite, --fair with --shared or
// --semaphore is refused (exit 64) before anything is taken or run, naming
// the flags and the store.
func TestRunFairSharedNeedsRedis(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "locks.db")
	e := newEnv(t, "sqlite://"+path)
	for _, flags := range [][]string{{"--fair", "--shared"}, {"--semaphore", "2", "--fair"}} {
		r := e.run(append(append([]string{"run"}, flags...), "--wait", "5s", "k", "--", "echo", "ran")...)
		want := "--fair --shared"
		if flags[0] == "--semaphore" {
			want = "--fair --semaphore"
		}
		expect(t, r, 64, want+" needs a store with fair read-write locks and semaphores; SQLite file "+path+
			" has none (Redis has them: redis://, rediss://, redis+sentinel://, redis+cluster://)", "usage: dlock run")
		if r.stdout != "" {
			t.Errorf("run %v ran its command: %q", flags, r.stdout)
		}
	}
	if r := e.run("ls"); r.code != 0 || strings.Contains(r.stdout, "k ") {
		t.Errorf("ls after the refusals: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	expect(t, e.run("run", "--fair", "k", "--", "true"), 0) // a fair exclusive lock works
}

// TestRunUnsupportedRefusedWithStoreDown: a kind of lock or a lock-delay
// that the store does not keep is a usage error (64) whether or not the
// store answers, not a store that cannot be reached (69): scripts see one
// answer whatever state the store is in.
func TestRunUnsupportedRefusedWithStoreDown(t *testing.T) {
	t.Parallel()
	fairShared := []string{"--fair --shared needs a store with fair read-write locks and semaphores;",
		"(Redis has them: redis://, rediss://, redis+sentinel://, redis+cluster://)"}
	lockDelay := []string{"--lock-delay needs a Redis or Redlock backend;", "keeps no lock-delay"}
	for _, c := range []struct {
		url   string
		flags []string
		want  []string
	}{
		{"postgres://u@127.0.0.1:1/x", []string{"--fair", "--shared"}, fairShared},
		{"etcd://127.0.0.1:1", []string{"--fair", "--shared"}, fairShared},
		{"postgres://u@127.0.0.1:1/x", []string{"--lock-delay", "1s"}, lockDelay},
		{"mysql://u@127.0.0.1:1/x", []string{"--lock-delay", "1s"}, lockDelay},
		{"etcd://127.0.0.1:1", []string{"--lock-delay", "1s"}, lockDelay},
		{"redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", []string{"--semaphore", "3"}, []string{"--semaphore needs a store with semaphores; redlock over 3 nodes"}},
		{"redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", []string{"--fair"}, []string{"--fair needs a store with fair locks; redlock over 3 nodes"}},
	} {
		e := newEnv(t, c.url)
		args := append(append([]string{"run", "--connect-timeout", "2s"}, c.flags...), "k", "--", "echo", "ran")
		r := e.run(args...)
		expect(t, r, 64, append(c.want, "usage: dlock run")...)
		if r.stdout != "" {
			t.Errorf("%s %v: the command ran: %q", c.url, c.flags, r.stdout)
		}
	}
}

// TestRunKindEnv: DLOCK_KIND names the kind, DLOCK_FAIR is 1 on a fair run
// and unset otherwise (whatever was inherited), and every kind draws its
// fence from the name's one counter.
func TestRunKindEnv(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sqliteURL(t), "DLOCK_KIND=stale", "DLOCK_FAIR=stale")
	var last uint64
	for _, c := range []struct {
		flags []string
		kind  string
		fair  string
	}{
		{nil, "exclusive", "unset"},
		{[]string{"--fair"}, "fair", "1"},
		{[]string{"--shared"}, "shared", "unset"},
		{[]string{"--semaphore", "4"}, "semaphore", "unset"},
	} {
		args := append(append([]string{"run"}, c.flags...), "k", "--", "sh", "-c", `echo "$DLOCK_KIND $DLOCK_FENCE ${DLOCK_FAIR-unset}"`)
		r := e.run(args...)
		expect(t, r, 0)
		var kind, fair string
		var fence uint64
		if _, err := fmt.Sscan(r.stdout, &kind, &fence, &fair); err != nil || kind != c.kind || fair != c.fair || fence <= last {
			t.Errorf("run %v: %q (%v), want kind %s, DLOCK_FAIR %s and a fence above %d", c.flags, r.stdout, err, c.kind, c.fair, last)
		}
		last = fence
	}
}

// TestRunKindsNeedCapability: Redlock has no semaphores, no fair locks and
// no fair readers: dlock says so as a usage error before it takes anything.
func TestRunKindsNeedCapability(t *testing.T) {
	t.Parallel()
	var nodes []*testserver.Redis
	var addrs []string
	for range 3 {
		n := testserver.StartRedis(t)
		nodes = append(nodes, n)
		addrs = append(addrs, n.Addr())
	}
	e := newEnv(t, "redlock://"+strings.Join(addrs, ","))
	for _, c := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--semaphore", "3"}, "--semaphore needs a store with semaphores; redlock over 3 nodes"},
		{[]string{"--fair", "--wait", "5s"}, "--fair needs a store with fair locks; redlock over 3 nodes"},
		{[]string{"--fair", "--shared", "--wait", "5s"}, "--fair --shared needs a store with fair read-write locks and semaphores; redlock over 3 nodes"},
		{[]string{"--semaphore", "2", "--fair"}, "--fair --semaphore needs a store with fair read-write locks and semaphores; redlock over 3 nodes"},
	} {
		r := e.run(append(append([]string{"run"}, c.flags...), "k", "--", "echo", "ran")...)
		expect(t, r, 64, c.want, "usage: dlock run")
		if r.stdout != "" {
			t.Errorf("run %v ran its command: %q", c.flags, r.stdout)
		}
	}
	for i, n := range nodes {
		if keys, err := n.Client(t).Keys(t.Context(), "*").Result(); err != nil || len(keys) != 0 {
			t.Errorf("node %d has keys %v (%v)", i, keys, err)
		}
	}
	expect(t, e.run("run", "k", "--", "true"), 0) // a plain lock works
}

// TestRunPlainSharedBehindQueuedWriterNamesIt: a plain --shared or
// --semaphore run that waits behind a --fair writer, which waits for the
// holds to go, says that the writer waits and names it, from its first
// message to the last, as the run starves and joins the queue behind the
// writer; and it gets in after the writer.
func TestRunPlainSharedBehindQueuedWriterNamesIt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, who string }{{"--shared", "readers"}, {"--semaphore=2", "permit holders"}} {
		t.Run(tc.name, func(t *testing.T) {
			u, rdb := redisURL(t)
			dir := t.TempDir()
			e := newEnv(t, u, "DIR="+dir)
			h := hold(t, e, dir, "h", true, "run", tc.name, "book")
			w := hold(t, e, dir, "w", false, "run", "--fair", "--wait", "60s", "book")
			waitStderr(t, w.proc, "1st in the queue")
			late := hold(t, e, dir, "late", false, "run", tc.name, "--wait", "60s", "book")
			waitStderr(t, late.proc, `"book": a writer is waiting (owner `)
			time.Sleep(1500 * time.Millisecond) // it starves and queues behind the writer meanwhile
			for _, line := range strings.Split(late.proc.stderrSoFar(), "\n") {
				if strings.Contains(line, `"book"`) && (!strings.Contains(line, "a writer is waiting (owner ") ||
					!strings.Contains(line, w.pid) || !strings.Contains(line, tc.who+" let it go first")) {
					t.Errorf("the waiting reader's message %q does not name the waiting writer (%s)", line, w.pid)
				}
			}
			h.let(t)
			w.running(t)
			if late.isRunning() {
				t.Fatal("the late run runs beside the writer")
			}
			w.let(t)
			late.running(t)
			late.let(t)
			leftFree(t, e, rdb, "book")
		})
	}
}

// TestRunSharedBehindKilledWriterWaitsForTheNext: a plain --shared run
// queued behind two --fair writers whose first is killed waits for the
// second, and names it, once the first's entry and intent lapse: the
// second heads the queue with no intent until its next queue refresh, and
// the reader must not pass it.
func TestRunSharedBehindKilledWriterWaitsForTheNext(t *testing.T) {
	t.Parallel()
	u, rdb := redisURL(t)
	dir := t.TempDir()
	e := newEnv(t, u, "DIR="+dir)
	h := hold(t, e, dir, "h", true, "run", "--shared", "book")
	w1 := hold(t, e, dir, "w1", false, "run", "--fair", "--wait", "60s", "book")
	waitStderr(t, w1.proc, "1st in the queue")
	time.Sleep(800 * time.Millisecond) // out of step with the first writer's queue refreshes
	w2 := hold(t, e, dir, "w2", false, "run", "--fair", "--wait", "60s", "book")
	waitStderr(t, w2.proc, "2nd in the queue")
	late := hold(t, e, dir, "late", false, "run", "--shared", "--wait", "60s", "book")
	waitStderr(t, late.proc, `"book": a writer is waiting (owner `)
	if err := w1.proc.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the store:\n%s\nthe second writer's stderr:\n%s\nthe late reader's stderr:\n%s",
				e.run("inspect", "book").stdout, w2.proc.stderrSoFar(), late.proc.stderrSoFar())
		}
	})
	for time.Since(killed) < 7*time.Second {
		if late.isRunning() {
			t.Fatalf("the reader runs %v after the first writer was killed, before the second writer", time.Since(killed).Round(time.Millisecond))
		}
		time.Sleep(20 * time.Millisecond)
	}
	lines := strings.Split(strings.TrimSpace(late.proc.stderrSoFar()), "\n")
	if last := lines[len(lines)-1]; !strings.Contains(last, "a writer is waiting (owner ") || !strings.Contains(last, w2.pid) {
		t.Errorf("the reader's last message %q does not name the second writer (%s)", last, w2.pid)
	}
	h.let(t)
	w2.running(t)
	if late.isRunning() {
		t.Fatal("the reader runs beside the writer")
	}
	w2.let(t)
	late.running(t)
	late.let(t)
	leftFree(t, e, rdb, "book")
}
