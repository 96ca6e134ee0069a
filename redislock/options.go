// The options of a Backend: WithNamespace, WithEvictionAllowed and
// WithLogger.

package redislock

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// DefaultNamespace is the namespace of keys and channels when WithNamespace
// is not given.
const DefaultNamespace = "dlock"

// Option configures a Backend.
type Option interface {
	apply(*options)
}

type options struct {
	err           error        // the first invalid option
	allowEviction bool         // WithEvictionAllowed
	log           *slog.Logger // WithLogger
	namespace     string
	ackReplicas   int           // WithReplicaAck; 0: off
	ackTimeout    time.Duration // WithReplicaAck
}

type optionFunc func(*options)

func (f optionFunc) apply(o *options) { f(o) }

// WithNamespace sets the first part of every key and channel the backend
// uses, so that several applications can share one Redis without seeing each
// other's locks. It must not contain '{' or '}', which would move the Cluster
// hash tag: such a namespace makes every call of the Backend return an error
// wrapping driver.ErrInvalid. An empty ns keeps the default, DefaultNamespace
// ("dlock").
func WithNamespace(ns string) Option {
	return optionFunc(func(o *options) {
		if strings.ContainsAny(ns, "{}") && o.err == nil {
			o.err = fmt.Errorf("redislock: namespace %q: contains a brace, which would move the Cluster hash tag: %w", ns, driver.ErrInvalid)
			return
		}
		if ns != "" {
			o.namespace = ns
		}
	})
}

// WithEvictionAllowed lets the Backend grant locks on a Redis whose
// maxmemory-policy is not noeviction. By default it refuses (EvictionError):
// a Redis that evicts keys may delete a held lock, letting a second holder
// in while the first lease reports nothing wrong, or a fence counter, so
// that fences start again from 1. Give it only when you accept that risk,
// for instance for a cache-only Redis where memory never runs short.
func WithEvictionAllowed() Option {
	return optionFunc(func(o *options) { o.allowEviction = true })
}

// WithLogger sets the logger for the Backend's few warnings (a
// maxmemory-policy it cannot read). The default is slog.Default().
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(o *options) { o.log = l })
}
