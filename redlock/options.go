package redlock

import (
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/redislock"
)

// DefaultNodeTimeout is the node timeout when WithNodeTimeout is not given.
// Acquire and renew wait for each node's answer min(node timeout, TTL/10),
// so that a node that does not answer costs a small part of the lease's
// validity; every call to a node, and release and inspection's wait for
// it, is bounded by min(4 × node timeout, 1s), but never less than the node
// timeout.
const DefaultNodeTimeout = 50 * time.Millisecond

// The default clock drift allowance: 1% of the TTL plus 2ms (see
// WithClockDrift).
const (
	DefaultDriftFactor = 0.01
	DefaultDriftExtra  = 2 * time.Millisecond
)

// Option configures a Backend.
type Option interface {
	apply(*options)
}

type options struct {
	namespace     string
	nodeTimeout   time.Duration
	driftFactor   float64
	driftExtra    time.Duration
	node          []redislock.Option // WithLogger: for every node
	allowEviction bool               // WithEvictionAllowed
	err           error              // the first invalid option
}

type optionFunc func(*options)

func (f optionFunc) apply(o *options) { f(o) }

func defaultOptions() options {
	return options{
		nodeTimeout: DefaultNodeTimeout,
		driftFactor: DefaultDriftFactor,
		driftExtra:  DefaultDriftExtra,
	}
}

// invalid records the first bad option; New reports it.
func (o *options) invalid(format string, args ...any) {
	if o.err == nil {
		o.err = fmt.Errorf("redlock: "+format+": %w", append(args, driver.ErrInvalid)...)
	}
}

// WithNamespace sets the first part of every key and channel on every node,
// as redislock.WithNamespace does. It must not contain '{' or '}'. An empty
// ns keeps the default, redislock.DefaultNamespace ("dlock").
func WithNamespace(ns string) Option {
	return optionFunc(func(o *options) {
		if strings.ContainsAny(ns, "{}") {
			o.invalid("namespace %q: contains a brace", ns)
			return
		}
		o.namespace = ns
	})
}

// WithNodeTimeout sets the node timeout d. Acquire and renew wait for each
// node's answer min(d, TTL/10), since the time they take is taken from the
// lease's validity; an answer that comes later does not count, but its call
// goes on, so that its connection is kept and its outcome known. Every call
// to a node, and release and inspection's wait for it, is bounded by
// min(4d, 1s) but at least d. It must be positive. The default is
// DefaultNodeTimeout (50ms).
func WithNodeTimeout(d time.Duration) Option {
	return optionFunc(func(o *options) {
		if d <= 0 {
			o.invalid("node timeout: %v is not positive", d)
			return
		}
		o.nodeTimeout = d
	})
}

// WithClockDrift sets the allowance for the drift between the clocks of the
// nodes and the client's: a grant of TTL t is trusted for t − (t×factor +
// extra) after its request was sent (see Backend.Drift). factor must be in
// [0, 1) and extra must not be negative. The default is 0.01 and 2ms, as in
// the Redlock description.
func WithClockDrift(factor float64, extra time.Duration) Option {
	return optionFunc(func(o *options) {
		if math.IsNaN(factor) || factor < 0 || factor >= 1 {
			o.invalid("clock drift: factor %v is not in [0, 1)", factor)
			return
		}
		if extra < 0 {
			o.invalid("clock drift: extra %v is negative", extra)
			return
		}
		o.driftFactor, o.driftExtra = factor, extra
	})
}

// WithEvictionAllowed lets every node grant locks although its
// maxmemory-policy is not noeviction, as redislock.WithEvictionAllowed
// does. By default a node whose Redis may evict keys refuses to grant
// (redislock.EvictionError), which counts against the quorum.
func WithEvictionAllowed() Option {
	return optionFunc(func(o *options) { o.allowEviction = true })
}

// WithLogger sets the logger of every node's few warnings, as
// redislock.WithLogger does. The default is slog.Default().
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(o *options) { o.node = append(o.node, redislock.WithLogger(l)) })
}
