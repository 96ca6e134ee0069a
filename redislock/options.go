package redislock

import "time"

// DefaultNamespace is the namespace of keys and channels when WithNamespace
// is not given.
const DefaultNamespace = "dlock"

// Option configures a Backend.
type Option interface {
	apply(*options)
}

type options struct {
	namespace   string
	ackReplicas int           // WithReplicaAck; 0: off
	ackTimeout  time.Duration // WithReplicaAck
}

type optionFunc func(*options)

func (f optionFunc) apply(o *options) { f(o) }

// WithNamespace sets the first part of every key and channel the backend
// uses, so that several applications can share one Redis without seeing each
// other's locks. It must not contain '{' or '}', which would move the Cluster
// hash tag. An empty ns keeps the default, DefaultNamespace ("dlock").
func WithNamespace(ns string) Option {
	return optionFunc(func(o *options) {
		if ns != "" {
			o.namespace = ns
		}
	})
}
