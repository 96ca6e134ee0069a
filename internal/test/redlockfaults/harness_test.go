package redlockfaults_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// contention describes a run of clients that fight over a few names.
type contention struct {
	clients int           // dlock clients, each on a backend of its own
	names   []string      // lock names; every client has one worker per name
	ttl     time.Duration // lease TTL; leases are renewed automatically
	run     time.Duration // how long the workers keep locking at least
	// until: past run, the workers go on until every name has been
	// granted this many times (a loaded machine grants fewer in run), up
	// to runLimit.
	until int
}

// runLimit bounds how long a contention run goes on for its grants
// (contention.until).
const runLimit = 30 * time.Second

// grantRecord is one grant as seen from outside the library: it starts when
// Lock returned and ends at the first of Unlock being called, Done being
// seen closed, and the lease's local validity deadline. The store cannot
// have given the lock to anyone else during it.
type grantRecord struct {
	name       string
	client     int
	fence      uint64
	start, end time.Time
	lost       error // the lease's Err when it was lost, else nil
}

// ledger collects the grants and failures of a contention run.
type ledger struct {
	t0 time.Time // start of the run, for readable offsets

	mu         sync.Mutex
	grants     []grantRecord
	errsByName map[string]int
	firstErr   error
	unlockErrs int
	losses     map[dlock.LostReason]int
	events     map[string][]string // by name: what the workers saw, for a failure's log
}

// event records what a worker of name saw, at an offset from the start.
func (l *ledger) event(name string, client int, format string, args ...any) {
	at := l.at(time.Now())
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events[name] = append(l.events[name], fmt.Sprintf("%s client %d: %s", at, client, fmt.Sprintf(format, args...)))
}

func (l *ledger) add(g grantRecord) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.grants = append(l.grants, g)
	var lost *dlock.LostError
	if errors.As(g.lost, &lost) {
		l.losses[lost.Reason]++
	}
}

func (l *ledger) lockFailed(name string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errsByName[name]++
	if l.firstErr == nil {
		l.firstErr = err
	}
}

func (l *ledger) unlockFailed() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.unlockErrs++
}

// at is a time as an offset from the start of the run.
func (l *ledger) at(t time.Time) string { return t.Sub(l.t0).Round(10 * time.Microsecond).String() }

// contend runs cfg against backends made by newBackend while faults runs in
// the test's goroutine (it may use t.Fatal and the proxies' methods; ctx
// ends when the run does), and returns the ledger once every worker has
// stopped and every client is closed.
func contend(t *testing.T, cfg contention, newBackend func(t *testing.T) driver.Backend, faults func(ctx context.Context)) *ledger {
	t.Helper()
	clients := make([]*dlock.Client, cfg.clients)
	for i := range clients {
		clients[i] = dlock.New(newBackend(t), dlock.WithTTL(cfg.ttl))
		warmUp(t, clients[i], cfg.ttl)
	}
	lg := &ledger{losses: make(map[dlock.LostReason]int), errsByName: make(map[string]int), events: make(map[string][]string)}
	ctx, cancel := context.WithCancel(t.Context())
	faultCtx, faultCancel := context.WithTimeout(ctx, cfg.run)
	defer faultCancel()
	var wg sync.WaitGroup
	// stop ends the run; deferred too, so that the workers stop and the
	// clients close even when faults fails the test.
	stop := sync.OnceFunc(func() {
		cancel()
		wg.Wait()
		for i, c := range clients {
			if err := c.Close(); err != nil {
				t.Logf("close client %d: %v", i, err)
			}
		}
	})
	defer stop()
	lg.t0 = time.Now()
	for i, c := range clients {
		for _, name := range cfg.names {
			wg.Add(1)
			go func() {
				defer wg.Done()
				work(ctx, lg, c, i, name, cfg.ttl)
			}()
		}
	}
	if faults != nil {
		faults(faultCtx)
	}
	<-faultCtx.Done()
	if cfg.until > 0 && !lg.enough(cfg.names, cfg.until) {
		for deadline := lg.t0.Add(runLimit); !lg.enough(cfg.names, cfg.until) && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("the run went on for %v in all, until every name had %d grants or %v passed", time.Since(lg.t0).Round(time.Millisecond), cfg.until, runLimit)
	}
	stop()
	return lg
}

// enough reports whether every one of names has been granted at least n
// times.
func (l *ledger) enough(names []string, n int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	count := make(map[string]int, len(names))
	for _, g := range l.grants {
		count[g.name]++
	}
	for _, name := range names {
		if count[name] < n {
			return false
		}
	}
	return true
}

// work locks name again and again until ctx ends, holding each grant for a
// random time: mostly a few milliseconds, one time in eight between half the
// TTL and one and a half, so that renewals are needed.
func work(ctx context.Context, lg *ledger, c *dlock.Client, client int, name string, ttl time.Duration) {
	m := c.Mutex(name, dlock.WithOnBusy(func(e *dlock.NotObtainedError) {
		lg.event(name, client, "busy: holder %q for %v", e.Holder, e.HolderTTL)
	}))
	pause := time.NewTimer(time.Hour)
	defer pause.Stop()
	hold := time.NewTimer(time.Hour)
	defer hold.Stop()
	for ctx.Err() == nil {
		l, err := m.Lock(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			lg.lockFailed(name, err)
			lg.event(name, client, "Lock: %v", err)
			// Back off at random, as an application would. With a node
			// down, contenders that split the live nodes between them all
			// get a *QuorumError, not "held by another", and their next
			// attempts, each as long as a node timeout (50ms), collide
			// again unless they spread out over more than that.
			sleep(ctx, pause, time.Millisecond+rand.N(100*time.Millisecond))
			continue
		}
		start := time.Now()
		lg.event(name, client, "granted, fence %d", l.Fence())
		d := time.Duration(rand.N(10)+1) * time.Millisecond
		if rand.N(8) == 0 {
			d = ttl/2 + rand.N(ttl)
		}
		hold.Reset(d)
		select {
		case <-hold.C:
		case <-l.Done():
		case <-ctx.Done():
		}
		end := time.Now()
		if dl := l.Deadline(); dl.Before(end) {
			end = dl
		}
		g := grantRecord{name: name, client: client, fence: l.Fence(), start: start, end: end}
		if err := l.Err(); err != nil {
			g.lost = err
		}
		lg.add(g)
		if g.lost == nil {
			uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := l.Unlock(uctx); err != nil {
				lg.unlockFailed()
			}
			cancel()
		}
		hold.Stop()
	}
}

// sleep waits for d or the end of ctx on timer, reused from call to call
// (since Go 1.23, Reset and Stop leave no stale tick behind).
func sleep(ctx context.Context, timer *time.Timer, d time.Duration) {
	timer.Reset(d)
	select {
	case <-timer.C:
	case <-ctx.Done():
		timer.Stop()
	}
}

// check fails the test when two grants of one name overlap or when fences
// do not grow in grant order, and logs what the run did. Each name must have
// been granted at least minGrants times, so that the run proves something.
func (l *ledger) check(t *testing.T, names []string, minGrants int) {
	t.Helper()
	l.checkExclusion(t, names, minGrants)
	for _, inv := range l.inversions() {
		t.Errorf("%s", inv)
	}
}

// checkExclusion is check without the fence order, for runs where the store
// may forget its fence counters (a node restarted without persistence); it
// logs the fence inversions instead.
func (l *ledger) checkExclusion(t *testing.T, names []string, minGrants int) {
	t.Helper()
	var counts []string
	for _, name := range names {
		gs := l.granted(name)
		// The longest time no one held the name: how long contention
		// stalled (a store failure, a missed wake-up, a long backoff).
		var gap time.Duration
		for i := 1; i < len(gs); i++ {
			gap = max(gap, gs[i].start.Sub(gs[i-1].end))
		}
		counts = append(counts, fmt.Sprintf("%s: %d (longest gap %v)", name, len(gs), gap.Round(time.Millisecond)))
		if len(gs) < minGrants {
			t.Errorf("%s: %d grants, want at least %d", name, len(gs), minGrants)
			l.mu.Lock()
			t.Logf("what the workers of %s saw:\n%s", name, strings.Join(l.events[name], "\n"))
			l.mu.Unlock()
		}
	}
	for _, o := range l.overlaps() {
		t.Errorf("%s", o)
	}
	l.mu.Lock()
	t.Logf("grants %s; lock errors %v (first: %v); unlock errors %d; losses %v",
		strings.Join(counts, ", "), l.errsByName, l.firstErr, l.unlockErrs, l.losses)
	l.mu.Unlock()
}

// granted returns the grants of name in the order they were made.
func (l *ledger) granted(name string) []grantRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	var gs []grantRecord
	for _, g := range l.grants {
		if g.name == name {
			gs = append(gs, g)
		}
	}
	slices.SortFunc(gs, func(a, b grantRecord) int { return a.start.Compare(b.start) })
	return gs
}

// names returns the names granted in the run, sorted.
func (l *ledger) names() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var names []string
	for _, g := range l.grants {
		if !slices.Contains(names, g.name) {
			names = append(names, g.name)
		}
	}
	slices.Sort(names)
	return names
}

// overlaps describes every grant that began while an earlier grant of the
// same name was still trusted by its holder.
func (l *ledger) overlaps() []string {
	var out []string
	for _, name := range l.names() {
		gs := l.granted(name)
		latest := 0 // index of the grant that ends last so far
		for i := 1; i < len(gs); i++ {
			g, o := gs[i], gs[latest]
			if g.start.Before(o.end) {
				out = append(out, fmt.Sprintf("%s: grants overlap: client %d fence %d held [%s, %s], client %d fence %d got it at %s",
					name, o.client, o.fence, l.at(o.start), l.at(o.end), g.client, g.fence, l.at(g.start)))
			}
			if g.end.After(o.end) {
				latest = i
			}
		}
	}
	return out
}

// inversions describes every grant whose fence is not larger than the fence
// of the grant of the same name before it.
func (l *ledger) inversions() []string {
	var out []string
	for _, name := range l.names() {
		gs := l.granted(name)
		for i := 1; i < len(gs); i++ {
			prev, g := gs[i-1], gs[i]
			if g.fence <= prev.fence {
				out = append(out, fmt.Sprintf("%s: fence went from %d (client %d at %s) to %d (client %d at %s)",
					name, prev.fence, prev.client, l.at(prev.start), g.fence, g.client, l.at(g.start)))
			}
		}
	}
	return out
}

// percentiles returns the 50th and 99th percentiles of ds.
func percentiles(ds []time.Duration) (p50, p99 time.Duration) {
	if len(ds) == 0 {
		return 0, 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2], s[min(len(s)-1, len(s)*99/100)]
}

// warmUp takes and frees a lock of its own once through c, trying for up to
// 10s, so that the run measures locking, not each client's first
// connections to every node: dialling, the handshake and loading the
// scripts take several round trips, which under the race detector on two
// busy cores can pass a node timeout of 50ms.
func warmUp(t *testing.T, c *dlock.Client, ttl time.Duration) {
	t.Helper()
	var err error
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		var l *dlock.Lease
		if l, err = c.Mutex("redlockfaults/warm-up", dlock.WithTTL(ttl)).TryLock(t.Context()); err == nil {
			_ = l.Unlock(t.Context())
			return
		}
	}
	t.Logf("warm-up: no lock within 10s: %v", err)
}
