package redislock

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
)

var (
	_ driver.Backend      = (*Backend)(nil)
	_ driver.Notifier     = (*Backend)(nil)
	_ driver.BatchRenewer = (*Backend)(nil)
	_ driver.Inspector    = (*Backend)(nil)
	_ driver.LockDelayer  = (*Backend)(nil)
)

// Backend is a dlock store on Redis: one node, Sentinel or Cluster, through a
// go-redis UniversalClient. It is safe for concurrent use. It does not own
// the client: closing the client is the caller's job, after the dlock client
// that uses the Backend is closed.
type Backend struct {
	rdb redis.UniversalClient
	ns  string
	// sharded: rdb is a Cluster, where releases go out with SPUBLISH and
	// are heard with SSUBSCRIBE, on the node that owns the lock's slot.
	sharded bool
	publish string // "PUBLISH" or "SPUBLISH"
	// ackReplicas and ackTimeout are WithReplicaAck's (see replica.go).
	ackReplicas int
	ackTimeout  time.Duration
}

// New returns a Backend that keeps its locks in rdb. It does no I/O; the
// scripts are loaded on first use.
func New(rdb redis.UniversalClient, opts ...Option) *Backend {
	o := options{namespace: DefaultNamespace}
	for _, opt := range opts {
		opt.apply(&o)
	}
	b := &Backend{rdb: rdb, ns: o.namespace, publish: "PUBLISH", ackReplicas: o.ackReplicas, ackTimeout: o.ackTimeout}
	if _, ok := rdb.(*redis.ClusterClient); ok {
		b.sharded, b.publish = true, "SPUBLISH"
	}
	return b
}

// SupportsLockDelay reports true: the lock-delay is kept in the lock's hash
// (see dlock.WithLockDelay).
func (b *Backend) SupportsLockDelay() bool { return true }

// Acquire grants the lock to req.Token in one script: a reentrant holder
// gets one more hold, a free key gets a new fence from the key's counter.
// When the lock is held by someone else (or by req.Token without
// req.Reentrant) the result reports the holder's owner and remaining TTL,
// with a nil error. Errors come only from Redis and wrap its error.
func (b *Backend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	reentrant := "0"
	if req.Reentrant {
		reentrant = "1"
	}
	keys := []string{b.lockKey(req.Key), b.fenceKey(req.Key)}
	delay := int64(0)
	if req.LockDelay > 0 {
		delay = millis(req.LockDelay)
	}
	args := []any{req.Token, req.Owner, millis(req.TTL), reentrant, delay}
	if b.acking() {
		return b.acquireAcked(ctx, req, keys, args)
	}
	reply, err := acquireScript.Run(ctx, b.rdb, keys, args...).Slice()
	if err != nil {
		return driver.AcquireResult{}, fmt.Errorf("redislock: acquire %q: %w", req.Key, err)
	}
	res, err := parseAcquire(reply)
	if err != nil {
		return driver.AcquireResult{}, fmt.Errorf("redislock: acquire %q: %w", req.Key, err)
	}
	return res, nil
}

func parseAcquire(reply []any) (driver.AcquireResult, error) {
	if len(reply) != 3 {
		return driver.AcquireResult{}, fmt.Errorf("unexpected reply %v", reply)
	}
	granted, err1 := asInt64(reply[0])
	if granted == 1 {
		fence, err2 := asUint64(reply[1])
		holds, err3 := asInt64(reply[2])
		if err := firstErr(err1, err2, err3); err != nil {
			return driver.AcquireResult{}, err
		}
		return driver.AcquireResult{Acquired: true, Fence: fence, Holds: int(holds)}, nil
	}
	owner, _ := reply[1].(string)
	pttl, err2 := asInt64(reply[2])
	if err := firstErr(err1, err2); err != nil {
		return driver.AcquireResult{}, err
	}
	return driver.AcquireResult{Holder: owner, HolderTTL: ttlOf(pttl)}, nil
}

// Renew sets the lock's TTL to ttl if token still holds it, in one script.
// It reports false, with a nil error, when token is not the holder (released,
// expired or taken over).
func (b *Backend) Renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	if b.acking() {
		return b.renewAcked(ctx, key, token, ttl)
	}
	n, err := renewScript.Run(ctx, b.rdb, []string{b.lockKey(key)}, token, millis(ttl)).Int64()
	if err != nil {
		return false, fmt.Errorf("redislock: renew %q: %w", key, err)
	}
	return n == 1, nil
}

// Release drops one hold of token in one script. The last hold deletes the
// lock hash (the fence counter stays) and publishes on the release channel.
// Held is false, with a nil error, when token was not the holder.
func (b *Backend) Release(ctx context.Context, key, token string) (driver.ReleaseResult, error) {
	return b.release(ctx, key, token, b.publish)
}

// release runs the release script; publish is the command that announces
// the release, or "" for none.
func (b *Backend) release(ctx context.Context, key, token, publish string) (driver.ReleaseResult, error) {
	n, err := releaseScript.Run(ctx, b.rdb, []string{b.lockKey(key)}, token, b.channel(key), publish).Int64()
	if err != nil {
		return driver.ReleaseResult{}, fmt.Errorf("redislock: release %q: %w", key, err)
	}
	if n < 0 {
		return driver.ReleaseResult{}, nil
	}
	return driver.ReleaseResult{Held: true, Remaining: int(n)}, nil
}

// ReleaseQuietly is Release without waking waiters: the release is not
// announced on the release channel. Package redlock undoes with it the
// grants of an attempt that lost: those nodes were free and blocked nobody,
// and announcing them would wake the other waiters, whose failed attempts
// would announce theirs, for as long as the holder keeps a quorum.
func (b *Backend) ReleaseQuietly(ctx context.Context, key, token string) (driver.ReleaseResult, error) {
	return b.release(ctx, key, token, "")
}

// RaiseFence gives the grant that token holds on key the fence fence, and
// raises the key's fence counter to at least fence so that the next grant on
// this node draws a larger one, in one script. It reports false, changing
// nothing, when token does not hold the lock. Package redlock uses it to give
// a grant one fence on all its nodes; a single-node lock never needs it.
func (b *Backend) RaiseFence(ctx context.Context, key, token string, fence uint64) (bool, error) {
	keys := []string{b.lockKey(key), b.fenceKey(key)}
	n, err := raiseFenceScript.Run(ctx, b.rdb, keys, token, strconv.FormatUint(fence, 10)).Int64()
	if err != nil {
		return false, fmt.Errorf("redislock: raise fence %q: %w", key, err)
	}
	return n == 1, nil
}

// RenewBatch renews every lease of reqs in one pipeline of renew scripts
// (go-redis splits it by node on Cluster) and returns one result per request,
// in order. A failure of the whole round trip is reported in every result.
func (b *Backend) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) []driver.RenewResult {
	if len(reqs) == 0 {
		return nil
	}
	if b.acking() {
		return b.renewBatchAcked(ctx, reqs)
	}
	calls := make([]scriptCall, len(reqs))
	for i, r := range reqs {
		calls[i] = scriptCall{keys: []string{b.lockKey(r.Key)}, args: []any{r.Token, millis(r.TTL)}}
	}
	cmds := runPipelined(ctx, b.rdb, renewScript, calls)
	results := make([]driver.RenewResult, len(reqs))
	for i, cmd := range cmds {
		n, err := cmd.Int64()
		if err != nil {
			results[i].Err = fmt.Errorf("redislock: renew %q: %w", reqs[i].Key, err)
			continue
		}
		results[i].Held = n == 1
	}
	return results
}

// millis converts a TTL to whole milliseconds for PEXPIRE, rounding up so a
// lease never lives shorter than asked, and never below 1.
func millis(d time.Duration) int64 {
	ms := int64((d + time.Millisecond - 1) / time.Millisecond)
	return max(ms, 1)
}

// ttlOf converts a PTTL reply to a duration; the negative "no key" and
// "no expiry" answers become 0, meaning unknown.
func ttlOf(pttl int64) time.Duration {
	if pttl < 0 {
		return 0
	}
	return time.Duration(pttl) * time.Millisecond
}

// asInt64 reads an integer reply, or a decimal string (hash fields come back
// as strings).
func asInt64(v any) (int64, error) {
	switch v := v.(type) {
	case int64:
		return v, nil
	case string:
		return strconv.ParseInt(v, 10, 64)
	}
	return 0, fmt.Errorf("unexpected reply element %T(%v), want an integer", v, v)
}

// asUint64 reads a fence, as an integer reply or a decimal string.
func asUint64(v any) (uint64, error) {
	switch v := v.(type) {
	case int64:
		if v < 0 {
			return 0, fmt.Errorf("negative fence %d", v)
		}
		return uint64(v), nil
	case string:
		return strconv.ParseUint(v, 10, 64)
	}
	return 0, fmt.Errorf("unexpected reply element %T(%v), want a fence", v, v)
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
