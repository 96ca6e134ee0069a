package prometheus

import (
	"errors"
	"sync"

	"github.com/dlock-go/dlock"
	"github.com/prometheus/client_golang/prometheus"
)

// Collector turns a Client's events into metrics. It is a dlock.Observer
// (give it to dlock.WithObserver, for one Client or several) and a
// prometheus.Collector (register it once). Make it with New.
type Collector struct {
	lockName func(string) string // nil: no lock label

	// Every metric's first label is store (Event.Store).
	wait          *prometheus.HistogramVec // store, type, call, outcome [, lock]
	hold          *prometheus.HistogramVec // store, type [, lock]
	grants        *prometheus.CounterVec   // store, type, call [, lock]
	notObtained   *prometheus.CounterVec   // store, type, call [, lock]
	failures      *prometheus.CounterVec   // store, type, call [, lock]
	losses        *prometheus.CounterVec   // store, type, reason [, lock]
	renewals      *prometheus.CounterVec   // store
	renewFailures *prometheus.CounterVec   // store
	renewLatency  *prometheus.HistogramVec // store
	storeCalls    *prometheus.HistogramVec // store, op, outcome
	leases        *prometheus.GaugeVec     // store, type [, lock]
	waiters       *prometheus.GaugeVec     // store, type [, lock]
	collectors    []prometheus.Collector
	mu            sync.Mutex
	live          map[grantKey]int // live leases per grant, for the leases gauge
}

var (
	_ dlock.Observer       = (*Collector)(nil)
	_ prometheus.Collector = (*Collector)(nil)
)

// grantKey names one grant: the leases of a reentrant handle that hold
// at once share it, and one EventLost ends them all.
type grantKey struct {
	client, name, typ string
	fence             uint64
}

// An Option configures New.
type Option interface{ apply(*config) }

type config struct {
	lockName  func(string) string
	buckets   []float64
	namespace string
	constant  prometheus.Labels
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithLockLabel adds the label "lock" to every metric of a lock (waits,
// holds, grants, losses, the gauges), with the value f returns for the
// lock's name. Names are unbounded: f must map them to a few values (say,
// "orders:42" to "orders"), since each value is a series of its own. f is
// called on the goroutine that made the event and must be quick. The
// default is no lock label.
func WithLockLabel(f func(name string) string) Option {
	return optionFunc(func(c *config) { c.lockName = f })
}

// WithBuckets sets the upper bounds, in seconds, of every duration
// histogram's buckets. The default is prometheus.ExponentialBuckets(0.0005,
// 2, 16): 0.5ms to about 16s.
func WithBuckets(b []float64) Option {
	return optionFunc(func(c *config) { c.buckets = b })
}

// WithNamespace sets the metric names' first part. The default is "dlock".
func WithNamespace(ns string) Option {
	return optionFunc(func(c *config) { c.namespace = ns })
}

// WithConstLabels adds labels with fixed values to every metric, for
// example to tell two Clients (two stores) apart when each has its own
// Collector. The default is none.
func WithConstLabels(l prometheus.Labels) Option {
	return optionFunc(func(c *config) { c.constant = l })
}

// New returns a Collector with no events counted yet.
func New(opts ...Option) *Collector {
	cfg := config{buckets: prometheus.ExponentialBuckets(0.0005, 2, 16), namespace: "dlock"}
	for _, o := range opts {
		o.apply(&cfg)
	}
	c := &Collector{lockName: cfg.lockName, live: map[grantKey]int{}}
	withLock := func(labels ...string) []string {
		labels = append([]string{"store"}, labels...)
		if c.lockName != nil {
			return append(labels, "lock")
		}
		return labels
	}
	hist := func(name, help string, labels ...string) *prometheus.HistogramVec {
		v := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: cfg.namespace, Name: name, Help: help, Buckets: cfg.buckets, ConstLabels: cfg.constant}, labels)
		c.collectors = append(c.collectors, v)
		return v
	}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: cfg.namespace, Name: name, Help: help, ConstLabels: cfg.constant}, labels)
		c.collectors = append(c.collectors, v)
		return v
	}
	gauge := func(name, help string, labels ...string) *prometheus.GaugeVec {
		v := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: cfg.namespace, Name: name, Help: help, ConstLabels: cfg.constant}, labels)
		c.collectors = append(c.collectors, v)
		return v
	}
	c.wait = hist("lock_wait_seconds", "How long Lock and TryLock calls took, by outcome (granted, not_obtained, failed).", withLock("type", "call", "outcome")...)
	c.hold = hist("lock_hold_seconds", "How long leases were held, from the store's answer that granted them to Unlock, for leases ended by Unlock.", withLock("type")...)
	c.grants = counter("lock_grants_total", "Lock and TryLock calls that obtained the lock.", withLock("type", "call")...)
	c.notObtained = counter("lock_not_obtained_total", "Lock and TryLock calls that ended without the lock: held by another, or the wait ended.", withLock("type", "call")...)
	c.failures = counter("lock_failures_total", "Lock and TryLock calls that failed: a store error, or a call refused.", withLock("type", "call")...)
	c.losses = counter("lease_losses_total", "Leases lost before Unlock, by reason (expired, missing, unreachable, closed).", withLock("type", "reason")...)
	c.renewals = counter("lease_renewals_total", "Lease renewals sent (automatic or Refresh), one per lease.", "store")
	c.renewFailures = counter("lease_renewal_failures_total", "Lease renewals that failed or found the lease gone.", "store")
	c.renewLatency = hist("renewal_round_trip_seconds", "Round trips of renewals to the store (a batch of automatic renewals, or one Refresh).", "store")
	c.storeCalls = hist("store_call_seconds", "Acquire, release and withdraw calls to the store, by op and outcome (ok, error); renewals are in renewal_round_trip_seconds.", "store", "op", "outcome")
	c.leases = gauge("leases", "Leases held now: granted, and neither unlocked nor lost.", withLock("type")...)
	c.waiters = gauge("waiters", "Lock and TryLock calls in progress.", withLock("type")...)
	return c
}

// Describe sends the descriptions of every metric of c.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, v := range c.collectors {
		v.Describe(ch)
	}
}

// Collect sends the current value of every metric of c.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, v := range c.collectors {
		v.Collect(ch)
	}
}

// Observe counts e. It is the dlock.Observer method; dlock calls it.
func (c *Collector) Observe(e dlock.Event) {
	switch e.Kind {
	case dlock.EventLockStarted:
		c.waiters.WithLabelValues(c.labels(e, e.Type)...).Inc()
	case dlock.EventLockGranted, dlock.EventLockNotObtained, dlock.EventLockFailed:
		c.waiters.WithLabelValues(c.labels(e, e.Type)...).Dec()
		call := "lock"
		if e.TryLock {
			call = "trylock"
		}
		outcome, count := "granted", c.grants
		switch e.Kind {
		case dlock.EventLockNotObtained:
			outcome, count = "not_obtained", c.notObtained
		case dlock.EventLockFailed:
			outcome, count = "failed", c.failures
		}
		c.wait.WithLabelValues(c.labels(e, e.Type, call, outcome)...).Observe(e.Wait.Seconds())
		count.WithLabelValues(c.labels(e, e.Type, call)...).Inc()
		if e.Kind == dlock.EventLockGranted {
			c.mu.Lock()
			c.live[grantKey{e.Client, e.Name, e.Type, e.Fence}]++
			c.mu.Unlock()
			c.leases.WithLabelValues(c.labels(e, e.Type)...).Inc()
		}
	case dlock.EventUnlocked:
		// An Unlock of a lease already ended (a second Unlock, or one after
		// the loss that EventLost counted) ends nothing.
		if errors.Is(e.Err, dlock.ErrReleased) || !c.end(grantKey{e.Client, e.Name, e.Type, e.Fence}) {
			return
		}
		c.leases.WithLabelValues(c.labels(e, e.Type)...).Dec()
		c.hold.WithLabelValues(c.labels(e, e.Type)...).Observe(e.Held.Seconds())
	case dlock.EventLost:
		c.losses.WithLabelValues(c.labels(e, e.Type, reason(e.Reason))...).Inc()
		c.mu.Lock()
		k := grantKey{e.Client, e.Name, e.Type, e.Fence}
		n := c.live[k]
		delete(c.live, k)
		c.mu.Unlock()
		if n > 0 {
			c.leases.WithLabelValues(c.labels(e, e.Type)...).Sub(float64(n))
		}
	case dlock.EventRenewed:
		st := store(e)
		c.renewals.WithLabelValues(st).Add(float64(e.Count))
		c.renewFailures.WithLabelValues(st).Add(float64(e.Failed))
		c.renewLatency.WithLabelValues(st).Observe(e.Latency.Seconds())
	case dlock.EventStoreCall:
		outcome := "ok"
		if e.Err != nil {
			outcome = "error"
		}
		c.storeCalls.WithLabelValues(store(e), e.Op, outcome).Observe(e.Latency.Seconds())
	}
}

// end takes one lease off the grant k, and reports whether the grant had
// one (it has none once lost).
func (c *Collector) end(k grantKey) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.live[k]
	if !ok {
		return false
	}
	if n <= 1 {
		delete(c.live, k)
	} else {
		c.live[k] = n - 1
	}
	return true
}

// labels returns the store label's value, values, and the lock label's
// value when there is one.
func (c *Collector) labels(e dlock.Event, values ...string) []string {
	values = append([]string{store(e)}, values...)
	if c.lockName != nil {
		return append(values, c.lockName(e.Name))
	}
	return values
}

// store is the store label's value: the backend's kind of store
// (dlock.Event.Store), or "unknown" for a backend that does not say.
func store(e dlock.Event) string {
	if e.Store == "" {
		return "unknown"
	}
	return e.Store
}

// reason is the label value of a loss's reason.
func reason(r dlock.LostReason) string {
	switch r {
	case dlock.LostExpired:
		return "expired"
	case dlock.LostMissing:
		return "missing"
	case dlock.LostUnreachable:
		return "unreachable"
	case dlock.LostClosed:
		return "closed"
	}
	return "unknown"
}
