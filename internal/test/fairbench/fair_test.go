// Package fairbench measures how evenly and how fast a contended lock changes
// hands, for Fair() and for the default lock, on a real redis-server and a
// real PostgreSQL (both wake waiters by notification):
//
//	go test -run XXX -bench Fairness -benchtime 1x ./internal/test/fairbench/
//
// Sixteen owners, each with a Client and a Redis connection of its own (as
// sixteen processes would), lock one name for a fixed time, hold it for a
// short critical section, unlock and lock again at once. Reported per run:
//
//	jain        Jain's fairness index of grants per owner (1 = perfectly even, 1/16 = one owner got all)
//	handoff-p50 / -p99  µs from the call of a releasing Unlock to the return of the next grant to a *different* owner
//	ping-p50    µs of a PING (Redis) or SELECT 1 (PostgreSQL) on the same server in the same run (the baseline)
//	grants/s    grants per second over all owners
package fairbench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/sqllock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const owners = 16

// event is one grant: who got it, when the grant returned, and when the
// owner called Unlock.
type event struct {
	owner             int
	granted, released time.Time
}

// result summarises one run.
type result struct {
	grants   []int // per owner
	handoffs []time.Duration
	elapsed  time.Duration
}

func (r result) jain() float64 {
	var sum, sq float64
	for _, g := range r.grants {
		sum += float64(g)
		sq += float64(g) * float64(g)
	}
	if sq == 0 {
		return 0
	}
	return sum * sum / (float64(len(r.grants)) * sq)
}

func (r result) total() int {
	n := 0
	for _, g := range r.grants {
		n += g
	}
	return n
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(math.Ceil(p*float64(len(s))))-1]
}

// contend runs owners on one name for d, each holding the lock for cs;
// newBackend gives each owner a backend of its own.
func contend(t testing.TB, newBackend func() driver.Backend, fair bool, d, cs time.Duration) result {
	t.Helper()
	opts := []dlock.Option{dlock.WithTTL(5 * time.Second)}
	if fair {
		opts = append(opts, dlock.Fair())
	}
	name := fmt.Sprintf("fairbench/%v/%d", fair, time.Now().UnixNano())
	mutexes := make([]*dlock.Mutex, owners)
	for i := range mutexes {
		c := dlock.New(newBackend())
		t.Cleanup(func() { _ = c.Close() })
		mutexes[i] = c.Mutex(name, opts...)
	}

	var (
		mu     sync.Mutex
		events []event
		wg     sync.WaitGroup
		errs   = make(chan error, owners)
	)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	for i, m := range mutexes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				l, err := m.Lock(ctx)
				if err != nil {
					if ctx.Err() == nil {
						errs <- err
					}
					return
				}
				granted := time.Now()
				if cs > 0 {
					spin(cs)
				}
				released := time.Now()
				if err := l.Unlock(context.Background()); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				events = append(events, event{owner: i, granted: granted, released: released})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	slices.SortFunc(events, func(a, b event) int { return a.granted.Compare(b.granted) })
	r := result{grants: make([]int, owners), elapsed: elapsed}
	for i, e := range events {
		r.grants[e.owner]++
		if i > 0 && events[i-1].owner != e.owner {
			r.handoffs = append(r.handoffs, e.granted.Sub(events[i-1].released))
		}
	}
	return r
}

// spin busy-waits for d: a critical section that does work, not a sleep
// that would hand the CPU to the waiters.
func spin(d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); {
	}
}

// median returns the median time of 200 calls of fn.
func median(t testing.TB, fn func() error) time.Duration {
	var rtts []time.Duration
	for range 200 {
		s := time.Now()
		if err := fn(); err != nil {
			t.Fatal(err)
		}
		rtts = append(rtts, time.Since(s))
	}
	return percentile(rtts, 0.5)
}

// store is one server under test: a backend per owner and a baseline round trip.
type store struct {
	newBackend func() driver.Backend
	ping       func() error
}

func redisStore(t testing.TB) store {
	srv := testserver.StartRedis(t)
	rdb := srv.Client(t)
	return store{
		newBackend: func() driver.Backend { return redislock.New(srv.Client(t)) },
		ping:       func() error { return rdb.Ping(context.Background()).Err() },
	}
}

func postgresStore(t testing.TB) store {
	srv := testserver.StartPostgres(t)
	db := srv.DB(t, "postgres")
	return store{
		newBackend: func() driver.Backend { return sqllock.NewPostgres(srv.DB(t, "postgres")) },
		ping: func() error {
			var one int
			return db.QueryRowContext(context.Background(), "SELECT 1").Scan(&one)
		},
	}
}

func BenchmarkFairness(b *testing.B) {
	for _, backend := range []struct {
		name  string
		start func(testing.TB) store
	}{{"redis", redisStore}, {"postgres", postgresStore}} {
		for _, fair := range []bool{false, true} {
			b.Run(backend.name+"/"+map[bool]string{false: "default", true: "fair"}[fair], func(b *testing.B) {
				st := backend.start(b)
				ping := median(b, st.ping)
				for range b.N {
					r := contend(b, st.newBackend, fair, 3*time.Second, 100*time.Microsecond)
					b.ReportMetric(r.jain(), "jain")
					b.ReportMetric(float64(percentile(r.handoffs, 0.5).Microseconds()), "handoff-p50-µs")
					b.ReportMetric(float64(percentile(r.handoffs, 0.99).Microseconds()), "handoff-p99-µs")
					b.ReportMetric(float64(ping.Microseconds()), "ping-p50-µs")
					b.ReportMetric(float64(r.total())/r.elapsed.Seconds(), "grants/s")
					b.Logf("grants per owner: %v", r.grants)
				}
			})
		}
	}
}

// TestFairRoundRobin checks the property the benchmark measures, briefly:
// with Fair, sixteen owners that lock again at once are served in turn, so
// every owner gets a share and the index is close to 1. It asserts no speed.
func TestFairRoundRobin(t *testing.T) {
	st := redisStore(t)
	r := contend(t, st.newBackend, true, 2*time.Second, 0)
	t.Logf("fair: %d grants, per owner %v, Jain %.3f", r.total(), r.grants, r.jain())
	if r.total() < 4*owners {
		t.Fatalf("only %d grants in 2s; want at least %d to judge fairness", r.total(), 4*owners)
	}
	for i, g := range r.grants {
		if g == 0 {
			t.Errorf("owner %d was never granted the lock", i)
		}
	}
	if j := r.jain(); j < 0.9 {
		t.Errorf("Jain's index %.3f with Fair(); want ≥ 0.9", j)
	}
}
