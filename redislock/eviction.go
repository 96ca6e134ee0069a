// The check that Redis will not evict lock keys: reading maxmemory-policy on
// the masters, and the EvictionError of an acquire refused for it.

package redislock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrEviction is matched (errors.Is) by the error of an acquire refused
// because Redis may evict keys: see EvictionError.
var ErrEviction = errors.New("redislock: Redis may evict lock keys")

// EvictionError is the error of an acquire on a Redis whose
// maxmemory-policy is not noeviction. Such a Redis deletes keys when it
// runs short of memory: an evicted lock hash lets a second holder in while
// the first lease reports nothing wrong, and an evicted fence counter starts
// again from 1, so fences go back. The Backend refuses to grant locks there
// unless WithEvictionAllowed says the risk is accepted.
type EvictionError struct {
	Addr   string // the node, as go-redis names it
	Policy string // its maxmemory-policy
}

func (e *EvictionError) Error() string {
	return fmt.Sprintf("Redis at %s has maxmemory-policy %s, which may evict lock keys and fence counters "+
		"(two holders, fences going back); set maxmemory-policy noeviction (CONFIG SET and redis.conf), "+
		"or accept the risk with redislock.WithEvictionAllowed (CLI: allow_eviction=1)", e.Addr, e.Policy)
}

// Is reports whether target is ErrEviction.
func (e *EvictionError) Is(target error) bool { return target == ErrEviction }

// evictionRecheck is how long a refusal stands before the policy is read
// again (an operator may have fixed it).
const evictionRecheck = 10 * time.Second

// evictionCheck is a Backend's check of the maxmemory-policy of its
// masters, each read once, before the first acquire it serves.
type evictionCheck struct {
	ok    atomic.Bool // every master is fine: a single node, Sentinel or Ring found so
	mu    sync.Mutex
	nodes map[string]*nodeEviction // by address, guarded by mu
	// fine holds the addresses of Cluster masters found fine, read
	// without mu on every acquire.
	fine   sync.Map
	warned bool // the unreadable policy was logged, guarded by mu
}

// nodeEviction is one reading of a master's policy: made once, in the
// background, by whichever call needed it first, and waited for by every
// call meanwhile, each as long as its own context allows, so that callers
// with short deadlines (Redlock's node timeouts) neither read it over and
// over nor give up each other's reading.
type nodeEviction struct {
	done    chan struct{} // closed when the reading is over
	refused error         // an *EvictionError, or nil; set before done is closed
	failed  error         // the reading failed (the call, not the policy): read again
	at      time.Time     // when it was over
}

// evictionReadTimeout bounds one reading of a master's policy.
const evictionReadTimeout = 2 * time.Second

// CheckEviction reads maxmemory-policy on every master the Backend uses
// (on a Cluster, every master now in the slot map) and returns an
// *EvictionError when one may evict keys, unless WithEvictionAllowed was
// given. Acquire does the same, for the master of its key, before its
// first grant there; call CheckEviction to learn of a bad policy at start
// up. Where CONFIG GET is not allowed it logs one warning and returns nil.
func (b *Backend) CheckEviction(ctx context.Context) error {
	err := b.checkMasters(ctx)
	var ee *EvictionError
	if err == nil || errors.As(err, &ee) {
		return err
	}
	return fmt.Errorf("redislock: %w", err)
}

// checkMasters is CheckEviction, its errors named by the caller.
func (b *Backend) checkMasters(ctx context.Context) error {
	if b.allowEviction || b.eviction.ok.Load() {
		return nil
	}
	nodes := []redis.Cmdable{b.rdb}
	var forEach func(context.Context, func(context.Context, *redis.Client) error) error
	switch c := b.rdb.(type) {
	case *redis.ClusterClient:
		forEach = c.ForEachMaster
	case *redis.Ring:
		forEach = c.ForEachShard
	}
	if forEach != nil {
		var mu sync.Mutex
		nodes = nil
		err := forEach(ctx, func(_ context.Context, n *redis.Client) error {
			mu.Lock()
			nodes = append(nodes, n)
			mu.Unlock()
			return nil
		})
		if err != nil {
			return fmt.Errorf("reading maxmemory-policy: %w", err)
		}
	}
	for _, n := range nodes {
		if err := b.checkNode(ctx, n); err != nil {
			return err
		}
	}
	if _, cluster := b.rdb.(*redis.ClusterClient); !cluster {
		b.eviction.ok.Store(true)
	}
	return nil
}

// checkEviction is CheckEviction for the master of key: on a Cluster the
// master of its slot, elsewhere every master.
func (b *Backend) checkEviction(ctx context.Context, key string) error {
	cc, ok := b.rdb.(*redis.ClusterClient)
	if !ok {
		return b.checkMasters(ctx)
	}
	node, err := cc.MasterForKey(ctx, b.lockKey(key))
	if err != nil {
		return fmt.Errorf("reading maxmemory-policy: %w", err)
	}
	if _, fine := b.eviction.fine.Load(node.Options().Addr); fine {
		return nil
	}
	return b.checkNode(ctx, node)
}

// EvictionRefusal returns at once what is known of the policy of the
// Backend's Redis (a single node or Sentinel primary): an *EvictionError
// when it may evict keys, nil when it is fine, could not be read, or is not
// known yet, in which case a reading starts in the background. It does not
// look at WithEvictionAllowed. Package redlock uses it, so that reading a
// node's policy never delays the node's answer to an acquire.
func (b *Backend) EvictionRefusal() error {
	if _, cluster := b.rdb.(*redis.ClusterClient); cluster || b.eviction.ok.Load() {
		return nil
	}
	if _, ring := b.rdb.(*redis.Ring); ring {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // do not wait: take what is known
	err := b.checkNode(ctx, b.rdb)
	if errors.Is(err, ErrEviction) {
		return err
	}
	return nil
}

// checkNode returns the refusal of node's policy, if any, reading it
// unless it is known (see nodeEviction).
func (b *Backend) checkNode(ctx context.Context, node redis.Cmdable) error {
	ec := &b.eviction
	addr := "redis"
	if c, ok := node.(*redis.Client); ok {
		addr = c.Options().Addr
	}
	if _, fine := ec.fine.Load(addr); fine {
		return nil
	}
	ec.mu.Lock()
	if ec.nodes == nil {
		ec.nodes = make(map[string]*nodeEviction)
	}
	ne := ec.nodes[addr]
	stale := ne != nil && isDone(ne.done) &&
		(ne.failed != nil || (ne.refused != nil && time.Since(ne.at) >= evictionRecheck))
	if ne == nil || stale {
		ne = &nodeEviction{done: make(chan struct{})}
		ec.nodes[addr] = ne
		go b.readPolicy(addr, node, ne)
	}
	ec.mu.Unlock()
	select {
	case <-ne.done:
	case <-ctx.Done():
		if !isDone(ne.done) {
			return fmt.Errorf("reading maxmemory-policy: %w", ctx.Err())
		}
	}
	if ne.failed != nil {
		return fmt.Errorf("reading maxmemory-policy: %w", ne.failed)
	}
	return ne.refused
}

// readPolicy makes the reading ne of node's policy.
func (b *Backend) readPolicy(addr string, node redis.Cmdable, ne *nodeEviction) {
	ec := &b.eviction
	ctx, cancel := context.WithTimeout(context.Background(), evictionReadTimeout)
	policy, err := policyOf(ctx, node)
	cancel()
	ec.mu.Lock()
	defer ec.mu.Unlock()
	defer close(ne.done)
	ne.at = time.Now()
	switch {
	case err != nil && unreadableConfig(err):
		if !ec.warned {
			ec.warned = true
			b.logger().Warn("redislock: cannot read Redis's maxmemory-policy (CONFIG GET is not allowed); "+
				"make sure it is noeviction, or lock keys and fence counters may be evicted", "addr", addr, "err", err)
		}
		ec.fine.Store(addr, true)
	case err != nil:
		ne.failed = err
	case policy != "noeviction":
		ne.refused = &EvictionError{Addr: addr, Policy: policy}
	default:
		ec.fine.Store(addr, true)
	}
}

// isDone reports whether c is closed.
func isDone(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// unreadableConfig reports whether err is the server's answer to CONFIG
// GET, rather than a failed call: the command is not allowed (ACL), renamed
// or disabled (managed services), or the setting is missing.
func unreadableConfig(err error) bool {
	if errors.Is(err, errNoPolicy) {
		return true
	}
	var re redis.Error
	return errors.As(err, &re)
}

// errNoPolicy is CONFIG GET's empty answer (a proxy, a Redis-compatible
// server without the setting): the policy cannot be read.
var errNoPolicy = errors.New("CONFIG GET maxmemory-policy: no such setting")

// policyOf reads maxmemory-policy with CONFIG GET.
func policyOf(ctx context.Context, c redis.Cmdable) (string, error) {
	m, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil {
		return "", err
	}
	p, ok := m["maxmemory-policy"]
	if !ok {
		return "", errNoPolicy
	}
	return p, nil
}

// logger returns the Backend's logger (WithLogger), or slog.Default.
func (b *Backend) logger() *slog.Logger {
	if b.log != nil {
		return b.log
	}
	return slog.Default()
}
