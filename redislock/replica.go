// WithReplicaAck: waiting (WAIT) for replicas to acknowledge grants and
// renewals, undoing unacknowledged grants, and ReplicaAckError.

package redislock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
)

// WithReplicaAck makes every grant and every renewal wait until at least n
// replicas have acknowledged it (Redis WAIT n timeout), so that a failover
// to one of those replicas keeps the lock. The WAIT runs on the connection
// that ran the script, in the same pipeline, since WAIT counts the writes of
// its own connection; on a Cluster it goes to the primary of the lock's slot.
//
// When fewer than n replicas acknowledge within timeout, Acquire undoes what
// it granted (the whole grant, or only the hold it added to a re-entry) and
// returns a *ReplicaAckError; Renew and RenewBatch return one too, which the
// dlock client counts as a failed renewal: the lease is reported lost
// (LostUnreachable, with the *ReplicaAckError as its cause) when renewals
// keep failing until its safety deadline. So a replica that is down or lags
// costs availability, never the claim that a lock is held.
//
// WAIT blocks for up to timeout when the replicas are slow or gone, and that
// time counts against the lease: the dlock client measures a lease from the
// moment the acquire was sent and renews at TTL/3. Choose timeout well below
// TTL/3 (say 100ms for a 10s TTL), and below the go-redis client's
// ReadTimeout, which bounds every pipeline read.
//
// WAIT does not make Redis strongly consistent. A write survives a failover
// only if the replica promoted is one that acknowledged it (with several
// replicas, ask for all of them or trust Sentinel to pick the most
// up-to-date), and an acknowledgement means the replica has the write in
// memory, not on disk: a replica that restarts without persistence before it
// is promoted has lost it. n <= 0 turns it off, the default. A timeout below
// 1ms counts as 1ms (WAIT 0 would wait forever).
func WithReplicaAck(n int, timeout time.Duration) Option {
	return optionFunc(func(o *options) {
		o.ackReplicas, o.ackTimeout = max(n, 0), timeout
	})
}

// ReplicaAckError reports that fewer replicas than WithReplicaAck asks for
// acknowledged a grant or a renewal within the timeout. An acquire that
// fails with it has been undone; a renewal that fails with it did extend the
// lease on the primary, but the client does not count on it.
type ReplicaAckError struct {
	Op   string // "acquire" or "renew"
	Key  string // the lock's key
	Want int    // the replicas asked for
	Got  int    // the replicas that acknowledged
}

// Error says how many replicas acknowledged. The backend's errors wrap it
// with the store (`redis 127.0.0.1:6379: 0 of 1 replicas acknowledged the
// write before the timeout`), and the dlock Client with the operation and
// the key.
func (e *ReplicaAckError) Error() string {
	return fmt.Sprintf("%d of %d replicas acknowledged the write before the timeout", e.Got, e.Want)
}

// errAckOnRing is returned when WithReplicaAck is used with a redis.Ring,
// whose shards WAIT cannot be aimed at.
var errAckOnRing = errors.New("WithReplicaAck is not supported on a redis.Ring; use one node, Sentinel or Cluster")

// undoTimeout bounds the release that undoes a grant too few replicas
// acknowledged.
const undoTimeout = 2 * time.Second

// acking reports whether WithReplicaAck is on.
func (b *Backend) acking() bool { return b.ackReplicas > 0 }

// connFor returns the client whose pipelines reach the primary that holds
// lockKey on one connection: the slot's primary on a Cluster, rdb itself
// otherwise.
func (b *Backend) connFor(ctx context.Context, lockKey string) (redis.Cmdable, error) {
	switch rdb := b.rdb.(type) {
	case *redis.ClusterClient:
		return rdb.MasterForKey(ctx, lockKey)
	case *redis.Ring:
		return nil, errAckOnRing
	}
	return b.rdb, nil
}

// runAcked runs script once per call and then WAIT, in one pipeline on conn,
// and returns one command per call and the number of replicas that
// acknowledged every write of the calls. The NOSCRIPT retry of runPipelined
// is followed by a WAIT of its own, since the retry may run on another
// connection; the smaller count is returned. ackErr is WAIT's own failure.
// With ask, every script is preceded by ASKING, for a node that an ASK
// redirection named.
func (b *Backend) runAcked(ctx context.Context, conn redis.Cmdable, ask bool, script *redis.Script, calls []scriptCall) (cmds []*redis.Cmd, acked int, ackErr error) {
	cmds = make([]*redis.Cmd, len(calls))
	pipe := conn.Pipeline()
	for i, c := range calls {
		if ask {
			pipe.Do(ctx, "asking")
		}
		cmds[i] = pipe.EvalSha(ctx, script.Hash(), c.keys, c.args...)
	}
	wait := b.wait(ctx, pipe)
	_, _ = pipe.Exec(ctx) // errors are read per command below
	acked, ackErr = waitResult(wait)

	var retry []int
	for i, cmd := range cmds {
		if isNoScript(cmd.Err()) {
			retry = append(retry, i)
		}
	}
	if len(retry) == 0 {
		return cmds, acked, ackErr
	}
	pipe = conn.Pipeline()
	for _, i := range retry {
		if ask {
			pipe.Do(ctx, "asking")
		}
		cmds[i] = script.Eval(ctx, pipe, calls[i].keys, calls[i].args...)
	}
	wait = b.wait(ctx, pipe)
	_, _ = pipe.Exec(ctx)
	n, err := waitResult(wait)
	return cmds, min(acked, n), errors.Join(ackErr, err)
}

// runAckedAt is runAcked on the primary of the calls' slot on conn, which
// follows, once, a MOVED or ASK redirection of a ClusterClient's node: the
// scripts go straight to the node MasterForKey names, so go-redis does not
// follow it itself. The calls redirected run again on the node the reply
// names, after a reload of the slot map (MOVED), or each after ASKING, in
// the pipeline of their WAIT (ASK, while the slot migrates). The count
// returned covers every call that ran.
func (b *Backend) runAckedAt(ctx context.Context, conn redis.Cmdable, script *redis.Script, calls []scriptCall) ([]*redis.Cmd, int, error) {
	cmds, acked, ackErr := b.runAcked(ctx, conn, false, script, calls)
	cc, ok := b.rdb.(*redis.ClusterClient)
	if !ok {
		return cmds, acked, ackErr
	}
	var (
		order  []redirect
		groups = make(map[redirect][]int)
	)
	for i, cmd := range cmds {
		if t, ok := redirection(cmd.Err()); ok {
			if _, seen := groups[t]; !seen {
				order = append(order, t)
			}
			groups[t] = append(groups[t], i)
		}
	}
	if len(order) == 0 {
		return cmds, acked, ackErr
	}
	if len(order) == 1 && len(groups[order[0]]) == len(calls) {
		// Nothing ran on conn: its WAIT counted no write of ours.
		acked, ackErr = b.ackReplicas, nil
	}
	masters := mastersByAddr(ctx, cc) // reloads the slot map
	for _, t := range order {
		node := masters[t.addr]
		if node == nil {
			continue // not a master as of now: the MOVED or ASK stands
		}
		idx := groups[t]
		sub := make([]scriptCall, len(idx))
		for j, i := range idx {
			sub[j] = calls[i]
		}
		got, n, err := b.runAcked(ctx, node, t.ask, script, sub)
		for j, i := range idx {
			cmds[i] = got[j]
		}
		acked, ackErr = min(acked, n), errors.Join(ackErr, err)
	}
	return cmds, acked, ackErr
}

// redirect is where a MOVED or ASK reply sends a command.
type redirect struct {
	addr string // the node's address
	ask  bool   // ASK: once, after ASKING; else MOVED
}

// redirection returns where a MOVED or ASK reply sends a command.
func redirection(err error) (t redirect, ok bool) {
	if err == nil {
		return t, false
	}
	f := strings.Fields(err.Error())
	if len(f) != 3 || (f[0] != "MOVED" && f[0] != "ASK") {
		return t, false
	}
	t.addr, t.ask = f[2], f[0] == "ASK"
	return t, true
}

// mastersByAddr reloads cc's slot map, or falls back on the one it has when
// that fails, and returns its masters by address.
func mastersByAddr(ctx context.Context, cc *redis.ClusterClient) map[string]*redis.Client {
	var mu sync.Mutex
	m := make(map[string]*redis.Client)
	_ = cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		m[c.Options().Addr] = c
		return nil
	})
	return m
}

// wait queues WAIT on pipe. It is sent with Do rather than pipe.Wait,
// which would turn a timeout below 1ms into WAIT's 0, "forever".
func (b *Backend) wait(ctx context.Context, pipe redis.Pipeliner) *redis.Cmd {
	return pipe.Do(ctx, "WAIT", b.ackReplicas, millis(b.ackTimeout))
}

func waitResult(cmd *redis.Cmd) (int, error) {
	n, err := cmd.Int64()
	if err != nil {
		return 0, fmt.Errorf("WAIT: %w", err)
	}
	return int(n), nil
}

// acquireAcked is Acquire with WithReplicaAck.
func (b *Backend) acquireAcked(ctx context.Context, req driver.AcquireRequest, rid *requestArg, call scriptCall) (driver.AcquireResult, error) {
	key := req.Key
	conn, err := b.connFor(ctx, call.keys[0])
	if err != nil {
		return driver.AcquireResult{}, b.storeError(ctx, "acquire", key, err)
	}
	cmds, acked, ackErr := b.runAckedAt(ctx, conn, acquireScript, []scriptCall{call})
	reply, err := cmds[0].Slice()
	b.sent(req, rid, err)
	if err != nil {
		b.movedOn(ctx, err)
		return driver.AcquireResult{}, b.storeError(ctx, "acquire", key, err)
	}
	res, err := parseAcquire(reply)
	if err != nil {
		return driver.AcquireResult{}, b.storeError(ctx, "acquire", key, err)
	}
	if !res.Acquired {
		b.refused(ctx, key, req.Token, rid, res.Queued)
		return res, nil
	}
	if ackErr != nil {
		// WAIT got no answer: the outcome is unknown, as after any store
		// failure, and the client cleans up as it does then.
		return driver.AcquireResult{}, b.storeError(ctx, "acquire", key, ackErr)
	}
	if acked >= b.ackReplicas {
		return res, nil
	}
	// Undo: one release drops the hold just added, which is the whole grant
	// when it was new. The token is this request's, so nobody else's hold
	// can be touched. It runs even when ctx is done: a cancelled Lock must
	// not leave the grant behind.
	err = &ReplicaAckError{Op: "acquire", Key: key, Want: b.ackReplicas, Got: acked}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
	defer cancel()
	if _, uerr := b.Release(uctx, key, req.Token); uerr != nil {
		err = errors.Join(err, fmt.Errorf("undo: %w", uerr))
	}
	return driver.AcquireResult{}, b.storeError(ctx, "acquire", key, err)
}

// renewAcked is Renew with WithReplicaAck.
func (b *Backend) renewAcked(ctx context.Context, key, token string, fence uint64, ttl time.Duration) (bool, error) {
	res := b.renewBatchAcked(ctx, []driver.RenewRequest{{Key: key, Token: token, TTL: ttl, Fence: fence}})
	return res[0].Held, res[0].Err
}

// renewBatchAcked is RenewBatch with WithReplicaAck: one pipeline of renew
// scripts and a WAIT per primary (one on a single node or Sentinel, one per
// primary of the keys' slots on a Cluster, sent at the same time).
func (b *Backend) renewBatchAcked(ctx context.Context, reqs []driver.RenewRequest) []driver.RenewResult {
	results := make([]driver.RenewResult, len(reqs))
	groups := make(map[redis.Cmdable][]int)
	var order []redis.Cmdable
	for i, r := range reqs {
		conn, err := b.connFor(ctx, b.lockKey(r.Key))
		if err != nil {
			results[i].Err = b.storeError(ctx, "renew", r.Key, err)
			continue
		}
		if _, ok := groups[conn]; !ok {
			order = append(order, conn)
		}
		groups[conn] = append(groups[conn], i)
	}
	run := func(conn redis.Cmdable, idx []int) {
		calls := make([]scriptCall, len(idx))
		for j, i := range idx {
			r := reqs[i]
			calls[j] = scriptCall{keys: b.renewKeys(r.Key), args: []any{r.Token, millis(r.TTL), fenceArg(r.Fence)}}
		}
		cmds, acked, ackErr := b.runAckedAt(ctx, conn, renewScript, calls)
		for j, cmd := range cmds {
			i, key := idx[j], reqs[idx[j]].Key
			n, err := cmd.Int64()
			switch {
			case err != nil:
				b.movedOn(ctx, err)
				results[i].Err = b.storeError(ctx, "renew", key, err)
			case n != 1:
				// Not held: nothing was written, so nothing to wait for.
			case ackErr != nil:
				results[i].Err = b.storeError(ctx, "renew", key, ackErr)
			case acked < b.ackReplicas:
				results[i].Err = b.storeError(ctx, "renew", key,
					&ReplicaAckError{Op: "renew", Key: key, Want: b.ackReplicas, Got: acked})
			default:
				results[i].Held = true
			}
		}
	}
	if len(order) == 1 {
		run(order[0], groups[order[0]])
		return results
	}
	var wg sync.WaitGroup
	for _, conn := range order {
		wg.Add(1)
		go func() {
			defer wg.Done()
			run(conn, groups[conn])
		}()
	}
	wg.Wait()
	return results
}

// movedOn reloads a ClusterClient's slot map when err says a slot has moved:
// the scripts of WithReplicaAck go straight to the node MasterForKey names,
// so go-redis does not follow the redirection itself.
func (b *Backend) movedOn(ctx context.Context, err error) {
	cc, ok := b.rdb.(*redis.ClusterClient)
	if ok && (redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK")) {
		cc.ReloadState(ctx)
	}
}
