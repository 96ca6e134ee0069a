// Package bench measures how fast distributed locks are acquired, released
// and handed from one holder to the next. It drives any lock implementation
// through the same workloads (one uncontended worker; N workers on one hot
// name; N workers over M names; read-write locks and semaphores, see
// kinds.go), on one host, with one monotonic clock, and
// reports per run: acquire wait percentiles, handoff latency (the time from
// a release returning to a different waiter's acquire returning), grants per
// second, Jain's fairness index over the workers, and store operations per
// cycle when the store can count them.
//
// dlock's `dlock bench` command and the peer comparison in bench/peers both
// run on it, so dlock and the libraries it is compared with are measured by
// the same code in the same run.
package bench

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Held is a lock a worker holds.
type Held interface {
	Unlock(ctx context.Context) error
}

// Worker is one contender: what a separate process with a client and
// connections of its own would be.
type Worker interface {
	// Lock blocks until the lock on name is held or ctx ends.
	Lock(ctx context.Context, name string) (Held, error)
	// Close releases the worker's client and connections.
	Close() error
}

// Subject is a lock implementation under test.
type Subject struct {
	// Name labels the subject's rows ("dlock", "dlock-fair", "raw-spin", ...).
	Name string
	// NewWorker returns contender id (0-based), with a client of its own.
	NewWorker func(ctx context.Context, id int) (Worker, error)
	// Counter, when not nil, counts the store's operations, so that a run
	// can report operations per lock cycle.
	Counter Counter
	// Trips, when not nil, counts the round trips the subject's clients
	// make (see Trips.RedisHook).
	Trips *Trips
}

// Trips counts round trips to a store, on the client side.
type Trips struct{ n atomic.Int64 }

// Load returns the round trips counted so far.
func (t *Trips) Load() int64 { return t.n.Load() }

// Add counts n round trips.
func (t *Trips) Add(n int64) { t.n.Add(n) }

// Counter counts operations a store has served.
type Counter interface {
	// Count returns the operations served so far, by kind (a Redis command
	// name, a SQL statement's first word). Kinds that only the counting
	// itself causes are left out.
	Count(ctx context.Context) (map[string]uint64, error)
}

// CPUMeter is implemented by a Counter that also reads the CPU time the
// store's servers have used (Redis: INFO cpu, user and system time summed
// over the servers; their other clients' work counts too).
type CPUMeter interface {
	CPU(ctx context.Context) (time.Duration, error)
}

// Workload is what the workers do.
type Workload struct {
	// Name labels the workload's rows; Run derives one when empty.
	Name string
	// Workers is the number of contenders, each with a client of its own.
	Workers int
	// Names is the number of lock names the workers share; each cycle picks
	// one at random. 1 is a hot key.
	Names int
	// CS is how long a worker holds the lock: a busy loop, as work would be,
	// not a sleep that hands the CPU to the waiters.
	CS time.Duration
	// Duration is how long workers start new cycles; cycles under way then
	// finish, and count.
	Duration time.Duration
	// Kind is the kind of lock: KindMutex (""), KindRW or KindSemaphore.
	Kind string `json:"Kind,omitempty"`
	// Writers is, in a KindRW workload, how many of the workers write
	// (spread evenly over the worker ids); the others read.
	Writers int `json:"Writers,omitempty"`
	// Permits is a KindSemaphore workload's permit count.
	Permits int `json:"Permits,omitempty"`
}

// Label returns w.Name, or a name made of its parameters.
func (w Workload) Label() string {
	if w.Name != "" {
		return w.Name
	}
	names := ""
	if w.Names != 1 {
		names = fmt.Sprintf("-%dn", w.Names)
	}
	switch w.Kind {
	case KindRW:
		return fmt.Sprintf("rw-%dw-%dwr%s-cs%v", w.Workers, w.Writers, names, w.CS)
	case KindSemaphore:
		return fmt.Sprintf("sem%d-%dw%s-cs%v", w.Permits, w.Workers, names, w.CS)
	}
	if w.Workers == 1 && w.Names == 1 {
		return "uncontended"
	}
	if w.Names == 1 {
		return fmt.Sprintf("hot-%dw-cs%v", w.Workers, w.CS)
	}
	return fmt.Sprintf("keys-%dw-%dn-cs%v", w.Workers, w.Names, w.CS)
}

func (w Workload) check() error {
	switch {
	case w.Workers < 1:
		return fmt.Errorf("bench: workload %s: workers must be at least 1, not %d", w.Label(), w.Workers)
	case w.Names < 1:
		return fmt.Errorf("bench: workload %s: names must be at least 1, not %d", w.Label(), w.Names)
	case w.CS < 0:
		return fmt.Errorf("bench: workload %s: negative critical section %v", w.Label(), w.CS)
	case w.Duration <= 0:
		return fmt.Errorf("bench: workload %s: duration must be positive, not %v", w.Label(), w.Duration)
	}
	return w.checkKind()
}

// Percentiles summarises a distribution of durations.
type Percentiles struct {
	N    int           `json:"n"`
	P50  time.Duration `json:"p50_ns"`
	P99  time.Duration `json:"p99_ns"`
	P999 time.Duration `json:"p999_ns"`
	Max  time.Duration `json:"max_ns"`
	Mean time.Duration `json:"mean_ns"`
}

// Summarize returns the percentiles of d (nearest rank). It sorts d.
func Summarize(d []time.Duration) Percentiles {
	if len(d) == 0 {
		return Percentiles{}
	}
	slices.Sort(d)
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	at := func(p float64) time.Duration {
		i := int(math.Ceil(p*float64(len(d)))) - 1
		return d[max(i, 0)]
	}
	return Percentiles{N: len(d), P50: at(0.50), P99: at(0.99), P999: at(0.999), Max: d[len(d)-1], Mean: sum / time.Duration(len(d))}
}

// Result is one subject's run of one workload.
type Result struct {
	Subject  string   `json:"subject"`
	Workload string   `json:"workload"`
	Params   Workload `json:"params"`
	// Grants is the number of completed lock cycles, GrantsPerWorker their
	// split over the workers.
	Grants          int   `json:"grants"`
	GrantsPerWorker []int `json:"grants_per_worker"`
	// Elapsed is from the start to the last worker's end.
	Elapsed    time.Duration `json:"elapsed_ns"`
	Throughput float64       `json:"grants_per_sec"`
	// Wait is the time from calling Lock to its return, for every grant.
	Wait Percentiles `json:"acquire_wait"`
	// Blocked is Wait of the grants that had to wait for someone else:
	// those during whose Lock call another worker was granted the name in
	// a hold that conflicts (a reader's: a writer's grant; a writer's, a
	// Mutex's or a permit's: any). Where a releasing worker takes the lock
	// straight back, most grants wait for nobody, and Wait's percentiles
	// hide the workers that starve meanwhile; Blocked shows them.
	Blocked Percentiles `json:"blocked_wait"`
	// Handoff is the time from a release returning to the return of the
	// next grant of that name to a different worker that was already
	// waiting when the release returned; in a KindRW workload, of writers'
	// releases only. A KindSemaphore workload has none: a release frees one
	// of several permits, and the next grant may have taken another.
	Handoff Percentiles `json:"handoff"`
	// Unlock is the time Unlock took.
	Unlock Percentiles `json:"unlock"`
	// Jain is Jain's fairness index of GrantsPerWorker: 1 when every worker
	// got as many grants, 1/Workers when one got them all. In a KindRW
	// workload it is the lower of the writers' index and the readers':
	// they do different work, so their grants are not compared.
	Jain float64 `json:"jain"`
	// TripsPerCycle is the subject's round trips to the store per grant
	// (0 without Trips).
	TripsPerCycle float64 `json:"round_trips_per_cycle,omitempty"`
	// OpsPerCycle is the store operations served per grant, all kinds
	// together, and Ops by kind (nil without a Counter). On Redis these are
	// INFO commandstats calls, which include the commands scripts run.
	OpsPerCycle float64            `json:"store_ops_per_cycle,omitempty"`
	Ops         map[string]float64 `json:"store_ops_per_cycle_by_kind,omitempty"`
	// ScriptsPerCycle is the script calls (EVAL, EVALSHA, FCALL and their
	// read-only forms) among Ops, per grant: the calls whose cost Redis's
	// one thread pays whole.
	ScriptsPerCycle float64 `json:"script_calls_per_cycle,omitempty"`
	// StoreCPUPerCycle is the CPU time the store's servers used per grant
	// (0 when the Counter is no CPUMeter: Redis is the one that says).
	// ClientCPUPerCycle is this process's CPU time per grant: the workers'
	// clients, their critical sections (busy loops, CS each) and the
	// bench's own bookkeeping (0 where the platform does not say). Where
	// clients and servers share the machine's cores, a subject that needs
	// more of them per grant than another is slower for that alone.
	StoreCPUPerCycle  time.Duration `json:"store_cpu_per_cycle_ns,omitempty"`
	ClientCPUPerCycle time.Duration `json:"client_cpu_per_cycle_ns,omitempty"`
	// WaitCurve is Wait's distribution: the wait at quantiles 1 − 10^(−k/8),
	// k = 0, 1, …, as far as the grants reach, then the longest (Q 1).
	WaitCurve []Quantile `json:"wait_curve,omitempty"`
	// Errors counts failed Lock or Unlock calls (the run goes on), and
	// FirstError is the first one's message.
	Errors     int    `json:"errors"`
	FirstError string `json:"first_error,omitempty"`
}

// ScriptCalls returns the script calls (EVAL, EVALSHA, FCALL and their
// read-only forms) among ops, a Result's Ops.
func ScriptCalls(ops map[string]float64) float64 {
	n := 0.0
	for _, k := range []string{"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"} {
		n += ops[k]
	}
	return n
}

// Quantile is one point of a distribution: the wait at or below which a
// fraction Q of the grants came.
type Quantile struct {
	Q    float64       `json:"q"`
	Wait time.Duration `json:"wait_ns"`
}

// curve returns the quantiles of WaitCurve over d, sorted.
func curve(d []time.Duration) []Quantile {
	if len(d) == 0 {
		return nil
	}
	var out []Quantile
	for k := 0; math.Pow(10, float64(k)/8) <= float64(len(d)); k++ {
		q := 1 - math.Pow(10, -float64(k)/8)
		i := max(int(math.Ceil(q*float64(len(d))))-1, 0)
		out = append(out, Quantile{Q: q, Wait: d[i]})
	}
	return append(out, Quantile{Q: 1, Wait: d[len(d)-1]})
}

// Jain returns Jain's fairness index of xs: (Σx)² / (n·Σx²).
func Jain(xs []int) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += float64(x)
		sq += float64(x) * float64(x)
	}
	if sq == 0 {
		return 0
	}
	return sum * sum / (float64(len(xs)) * sq)
}

// cycle is one grant as a worker saw it, on the monotonic clock.
type cycle struct {
	worker, name int
	shared       bool      // a reader's hold, or a permit
	called       time.Time // Lock called
	granted      time.Time // Lock returned
	released     time.Time // Unlock returned
	unlockTook   time.Duration
}

// Progress receives a run's progress: the subject and workload under way,
// and the grants so far. It is called about four times a second.
type Progress func(subject, workload string, elapsed time.Duration, grants int64)

// Run runs workload w on subject s and returns the result. progress may be
// nil. Errors of Lock or Unlock are counted in the result; Run fails only
// when the workers or the counter cannot be set up, or ctx ends. It fails
// with an error wrapping ErrKindUnsupported, before the run, when s's
// workers do not take w's kind of lock (RWWorker, SemaphoreWorker).
func Run(ctx context.Context, s Subject, w Workload, progress Progress) (Result, error) {
	if err := w.check(); err != nil {
		return Result{}, err
	}
	res := Result{Subject: s.Name, Workload: w.Label(), Params: w}
	workers := make([]Worker, w.Workers)
	locks := make([]func(context.Context, string) (Held, error), w.Workers)
	shared := make([]bool, w.Workers)
	defer func() {
		for _, wk := range workers {
			if wk != nil {
				_ = wk.Close()
			}
		}
	}()
	for i := range workers {
		wk, err := s.NewWorker(ctx, i)
		if err != nil {
			return res, fmt.Errorf("bench: %s: worker %d: %w", s.Name, i, err)
		}
		workers[i] = wk
		if locks[i], shared[i], err = w.lockFunc(wk, i); err != nil {
			return res, fmt.Errorf("bench: %s: workload %s: %w", s.Name, w.Label(), err)
		}
	}
	// Names unique to this run, so that runs never meet each other's
	// leftovers.
	prefix := fmt.Sprintf("dlock-bench/%s/%d", w.Label(), time.Now().UnixNano())
	names := make([]string, w.Names)
	for i := range names {
		names[i] = fmt.Sprintf("%s/%d", prefix, i)
	}

	var before map[string]uint64
	if s.Counter != nil {
		var err error
		if before, err = s.Counter.Count(ctx); err != nil {
			return res, fmt.Errorf("bench: %s: count store operations: %w", s.Name, err)
		}
	}
	meter, _ := s.Counter.(CPUMeter)
	var storeCPUBefore time.Duration
	if meter != nil {
		var err error
		if storeCPUBefore, err = meter.CPU(ctx); err != nil {
			return res, fmt.Errorf("bench: %s: read the store's CPU time: %w", s.Name, err)
		}
	}
	clientCPUBefore, clientCPUKnown := processCPU()

	var tripsBefore int64
	if s.Trips != nil {
		tripsBefore = s.Trips.Load()
	}
	var (
		stop     atomic.Bool
		grants   atomic.Int64
		wg       sync.WaitGroup
		mu       sync.Mutex
		cycles   = make([][]cycle, w.Workers)
		errCount atomic.Int64
		firstErr error
	)
	fail := func(err error) {
		errCount.Add(1)
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	// A Lock or Unlock that has not returned this long after the end is
	// stuck: give up on it rather than hang the run.
	callCtx, cancelCalls := context.WithCancel(ctx)
	defer cancelCalls()
	start := time.Now()
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), uint64(start.UnixNano())))
			var mine []cycle
			for !stop.Load() && callCtx.Err() == nil {
				n := 0
				if w.Names > 1 {
					n = rng.IntN(w.Names)
				}
				c := cycle{worker: i, name: n, shared: shared[i], called: time.Now()}
				h, err := locks[i](callCtx, names[n])
				if err != nil {
					if callCtx.Err() == nil {
						fail(fmt.Errorf("lock: %w", err))
					}
					continue
				}
				c.granted = time.Now()
				if w.CS > 0 {
					spin(w.CS)
				}
				u := time.Now()
				err = h.Unlock(callCtx)
				c.released = time.Now()
				c.unlockTook = c.released.Sub(u)
				if err != nil {
					fail(fmt.Errorf("unlock: %w", err))
				}
				mine = append(mine, c)
				grants.Add(1)
			}
			mu.Lock()
			cycles[i] = mine
			mu.Unlock()
		}()
	}

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	endAt := time.NewTimer(w.Duration)
	defer endAt.Stop()
	var giveUp <-chan time.Time
wait:
	for {
		select {
		case <-done:
			break wait
		case <-endAt.C:
			stop.Store(true)
			giveUp = time.After(30*time.Second + 3*w.CS)
		case <-giveUp:
			cancelCalls()
			<-done
			break wait
		case <-ctx.Done():
			stop.Store(true)
			cancelCalls()
			<-done
			return res, ctx.Err()
		case <-tick.C:
			if progress != nil {
				progress(s.Name, res.Workload, time.Since(start), grants.Load())
			}
		}
	}
	res.Elapsed = time.Since(start)
	clientCPUAfter, _ := processCPU()

	if s.Counter != nil {
		after, err := s.Counter.Count(ctx)
		if err != nil {
			return res, fmt.Errorf("bench: %s: count store operations: %w", s.Name, err)
		}
		res.Ops = map[string]float64{}
		total := 0.0
		n := float64(max(grants.Load(), 1))
		for k, v := range after {
			if d := v - before[k]; d > 0 {
				res.Ops[k] = float64(d) / n
				total += float64(d)
			}
		}
		res.OpsPerCycle = total / n
		res.ScriptsPerCycle = ScriptCalls(res.Ops)
	}
	perGrant := func(d time.Duration) time.Duration { return d / time.Duration(max(grants.Load(), 1)) }
	if meter != nil {
		after, err := meter.CPU(ctx)
		if err != nil {
			return res, fmt.Errorf("bench: %s: read the store's CPU time: %w", s.Name, err)
		}
		res.StoreCPUPerCycle = perGrant(after - storeCPUBefore)
	}
	if clientCPUKnown {
		res.ClientCPUPerCycle = perGrant(clientCPUAfter - clientCPUBefore)
	}
	if s.Trips != nil {
		res.TripsPerCycle = float64(s.Trips.Load()-tripsBefore) / float64(max(grants.Load(), 1))
	}
	res.Errors = int(errCount.Load())
	if firstErr != nil {
		res.FirstError = firstErr.Error()
	}
	summarize(&res, cycles, w)
	return res, nil
}

// spin busy-waits for d.
func spin(d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); {
	}
}
