package redislock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
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
	return fmt.Sprintf("redislock: Redis at %s has maxmemory-policy %s, which may evict lock keys and fence counters "+
		"(two holders, fences going back); set maxmemory-policy noeviction (CONFIG SET and redis.conf), "+
		"or accept the risk with redislock.WithEvictionAllowed (CLI: allow_eviction=1)", e.Addr, e.Policy)
}

// Is reports whether target is ErrEviction.
func (e *EvictionError) Is(target error) bool { return target == ErrEviction }

// evictionRecheck is how long a refusal stands before the policy is read
// again (an operator may have fixed it).
const evictionRecheck = 10 * time.Second

// evictionCheck is a Backend's check of the maxmemory-policy of its nodes.
type evictionCheck struct {
	ok      atomic.Bool // done, read without mu on every acquire
	mu      sync.Mutex
	done    bool      // the policy was found safe, or could not be read
	refused error     // the last refusal, an *EvictionError
	at      time.Time // when refused was found
}

// checkEviction returns nil when every master of the Backend's Redis has
// maxmemory-policy noeviction, when WithEvictionAllowed was given, or when
// the policy cannot be read (CONFIG refused or renamed, as on many managed
// services: logged once); otherwise an *EvictionError. The policy is read
// once per Backend (a refusal again after evictionRecheck), before the first
// acquire, so the hot path pays nothing.
func (b *Backend) checkEviction(ctx context.Context) error {
	ec := &b.eviction
	if b.allowEviction {
		ec.ok.Store(true)
		return nil
	}
	ec.mu.Lock()
	defer ec.mu.Unlock()
	if ec.done {
		return nil
	}
	if ec.refused != nil && time.Since(ec.at) < evictionRecheck {
		return ec.refused
	}
	policies, err := b.maxmemoryPolicies(ctx)
	switch {
	case err != nil && unreadableConfig(err):
		ec.done = true
		ec.ok.Store(true)
		b.logger().Warn("redislock: cannot read Redis's maxmemory-policy (CONFIG GET is not allowed); "+
			"make sure it is noeviction, or lock keys and fence counters may be evicted", "err", err)
		return nil
	case err != nil:
		return fmt.Errorf("redislock: reading maxmemory-policy: %w", err)
	}
	for addr, p := range policies {
		if p != "noeviction" {
			ec.refused, ec.at = &EvictionError{Addr: addr, Policy: p}, time.Now()
			return ec.refused
		}
	}
	ec.done, ec.refused = true, nil
	ec.ok.Store(true)
	return nil
}

// unreadableConfig reports whether err says that CONFIG GET may not be
// used (ACL, a renamed or disabled command), rather than a failed call.
func unreadableConfig(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	return strings.HasPrefix(msg, "NOPERM") || strings.Contains(msg, "unknown command") ||
		strings.Contains(msg, "unknown subcommand")
}

// maxmemoryPolicies reads maxmemory-policy on every master: the one node,
// the Sentinel's current primary, or each master of a Cluster or shard of
// a Ring.
func (b *Backend) maxmemoryPolicies(ctx context.Context) (map[string]string, error) {
	var (
		mu  sync.Mutex
		out = make(map[string]string)
	)
	read := func(ctx context.Context, node *redis.Client) error {
		p, err := policyOf(ctx, node)
		if err != nil {
			return err
		}
		mu.Lock()
		out[node.Options().Addr] = p
		mu.Unlock()
		return nil
	}
	var err error
	switch c := b.rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, read)
	case *redis.Ring:
		err = c.ForEachShard(ctx, read)
	case *redis.Client:
		err = read(ctx, c)
	default:
		var p string
		if p, err = policyOf(ctx, b.rdb); err == nil {
			out["redis"] = p
		}
	}
	return out, err
}

// policyOf reads maxmemory-policy with CONFIG GET.
func policyOf(ctx context.Context, c redis.Cmdable) (string, error) {
	m, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil {
		return "", err
	}
	p, ok := m["maxmemory-policy"]
	if !ok {
		return "", errors.New("CONFIG GET maxmemory-policy: no answer")
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
