// Store errors: how an operation's failure is wrapped, and which failures
// are transient (driver.ErrTransient).

package redislock

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/ctxend"
)

// storeError wraps err, the failure of op on the lock key in a call made
// with ctx, with what the Backend alone knows: the store it talks to
// ("redis 127.0.0.1:6379: err", the address left out when err names it);
// the caller names the operation and the lock. It is a *ForeignValueError
// when Redis answered WRONGTYPE, bare when it names its node already (an
// EvictionError), and marked transient,
// outermost, when it may heal (see transient).
func (b *Backend) storeError(ctx context.Context, op, key string, err error) error {
	ferr := foreign(key, err)
	if fv, ok := ferr.(*ForeignValueError); ok && (strings.HasPrefix(op, "release") || strings.HasPrefix(op, "renew")) {
		fv.NotHeld = true
	}
	werr := ferr
	var ee *EvictionError
	switch {
	case errors.As(ferr, &ee):
	case b.addr != "" && strings.Contains(ferr.Error(), b.addr): // a dial error names it
		werr = fmt.Errorf("redis: %w", ferr)
	default:
		werr = fmt.Errorf("%s: %w", b.where, ferr)
	}
	if transient(ctx, err) {
		return driver.Transient(werr)
	}
	return werr
}

// storeWhere names the store of rdb in errors: "redis" and the address of
// one node (also returned as addr), "redis (Sentinel)", "redis cluster" or
// "redis ring".
func storeWhere(rdb redis.UniversalClient) (where, addr string) {
	switch c := rdb.(type) {
	case *redis.Client:
		if addr := c.Options().Addr; addr != "FailoverClient" {
			return "redis " + addr, addr
		}
		return "redis (Sentinel)", ""
	case *redis.ClusterClient:
		return "redis cluster", ""
	case *redis.Ring:
		return "redis ring", ""
	}
	return "redis", ""
}

// transient reports whether err, the failure of a call made with ctx, may
// heal by itself: the network failed (a timeout of the call, a connection
// reset, refused or closed, EOF, no free connection in the pool), or Redis
// answered that it cannot serve now (LOADING, BUSY, TRYAGAIN, CLUSTERDOWN,
// MASTERDOWN, READONLY during a failover, MOVED or ASK after go-redis's
// redirections ran out, the most clients reached, too few replicas), or
// too few replicas acknowledged a write (ReplicaAckError).
//
// When ctx has ended, nothing is transient: the caller's wait is over, and
// a deadline or cancellation is the caller's, not the store's. Credentials
// and rights refused (NOAUTH, WRONGPASS, NOPERM), a certificate refused,
// OOM, a foreign value, an invalid request, a closed client and every other
// error are not transient either: waiting would not mend them.
func transient(ctx context.Context, err error) bool {
	if err == nil || ctxend.Err(ctx) != nil {
		return false
	}
	var cve *tls.CertificateVerificationError
	if errors.Is(err, ErrForeignValue) || errors.Is(err, driver.ErrInvalid) || errors.Is(err, redis.ErrClosed) ||
		errors.As(err, &cve) {
		return false
	}
	var dns *net.DNSError
	if errors.As(err, &dns) && dns.IsNotFound {
		return false // no such host: a wrong address, not an outage
	}
	var rae *ReplicaAckError
	if errors.As(err, &rae) {
		return true // the replicas lag: they may catch up
	}
	var re redis.Error
	if errors.As(err, &re) {
		return transientReply(re.Error())
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrPoolExhausted) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.ETIMEDOUT) || errors.Is(err, syscall.EHOSTUNREACH) ||
		errors.Is(err, syscall.ENETUNREACH) {
		return true
	}
	// A deadline of go-redis's own (a dial, a read or write timeout) while
	// the caller's context is live: one call's timeout.
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	var oe *net.OpError
	return errors.As(err, &oe) // a dial or a read or write that failed
}

// transientReplies are the first words of the Redis error replies that may
// heal by themselves.
var transientReplies = map[string]bool{
	"LOADING":     true, // the server is loading its data set
	"BUSY":        true, // a script or function is running past busy-reply-threshold
	"TRYAGAIN":    true, // a multi-key command during a slot migration
	"CLUSTERDOWN": true, // the cluster is down or a slot has no master
	"MASTERDOWN":  true, // a replica lost its master and serves no stale data
	"READONLY":    true, // a failover made the node a replica
	"MOVED":       true, // the slot moved; go-redis's redirections ran out
	"ASK":         true,
	"NOREPLICAS":  true, // min-replicas-to-write not met
}

// transientReply reports whether the Redis error reply msg may heal by
// itself: see transientReplies; and "ERR max number of clients reached".
func transientReply(msg string) bool {
	word, _, _ := strings.Cut(msg, " ")
	if transientReplies[word] {
		return true
	}
	return strings.HasPrefix(msg, "ERR max number of clients reached")
}
