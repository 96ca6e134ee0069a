// The Redis Backend and its lock operations (New, Acquire, Renew,
// RenewBatch; the releases are in release.go), and the parsing of the
// scripts' replies.

package redislock

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
)

var (
	_ driver.Backend      = (*Backend)(nil)
	_ driver.Notifier     = (*Backend)(nil)
	_ driver.BatchRenewer = (*Backend)(nil)
	_ driver.Inspector    = (*Backend)(nil)
	_ driver.Capabler     = (*Backend)(nil)
	_ driver.Withdrawer   = (*Backend)(nil)
)

// Backend is a dlock store on Redis: one node, Sentinel or Cluster, through a
// go-redis UniversalClient. It is safe for concurrent use. It does not own
// the client: closing the client is the caller's job, after the dlock client
// that uses the Backend is closed.
type Backend struct {
	rdb redis.UniversalClient
	// where and addr name the store in errors (storeWhere).
	where, addr string
	ns          string
	// sharded: rdb is a Cluster, where releases go out with SPUBLISH and
	// are heard with SSUBSCRIBE, on the node that owns the lock's slot.
	sharded bool
	publish string // "PUBLISH" or "SPUBLISH"
	// publishArg is publish as a script argument, boxed once.
	publishArg any
	// ackReplicas and ackTimeout are WithReplicaAck's (see replica.go).
	ackReplicas int
	ackTimeout  time.Duration
	// allowEviction is WithEvictionAllowed; eviction checks the
	// maxmemory-policy before the first acquire (see eviction.go).
	allowEviction bool
	eviction      evictionCheck
	log           *slog.Logger
	// err is an invalid option or a nil client, returned by every call.
	err error
	// ridPrefix and ridSeq make the ids of acquire and release requests,
	// by which a script tells a resent request from a new one.
	ridPrefix string
	ridSeq    atomic.Uint64
	// hid names the Backend's handoff channels (see handoffChannel).
	hid string
	// onces knows the requests no late copy of can exist (once.go).
	onces onceGrants
}

// requestID returns a new id for an acquire or release request: unique to
// this Backend (a random prefix) and to the request (a counter).
func (b *Backend) requestID() string {
	return b.ridPrefix + strconv.FormatUint(b.ridSeq.Add(1), 36)
}

// request returns a new request id as an argument that counts its writes.
func (b *Backend) request() *requestArg { return &requestArg{id: b.requestID()} }

// New returns a Backend that keeps its locks in rdb. It does no I/O; the
// scripts are loaded on first use. An invalid option (WithNamespace with a
// brace) or a nil rdb does not panic: every call of the Backend then returns
// an error wrapping driver.ErrInvalid (dlock.ErrInvalid).
//
// Give rdb ContextTimeoutEnabled (redis.Options, ClusterOptions,
// FailoverOptions): without it go-redis bounds each command by its own
// ReadTimeout and WriteTimeout (3s by default), not by the context, so
// against a Redis that hangs a TryLock with a 1s deadline returns after
// several seconds, and so do Unlock and Client.Close. The dlock CLI sets it.
// Automatic retries (MaxRetries) are safe: every script recognises a
// request that go-redis sends again after a lost answer and answers it as it
// answered the first time, and an acquire whose grant was released since, or
// whose token a clean-up released, grants nothing when a copy of it lands
// within 5s of that (docs/REDIS.md, "A request that lands late").
func New(rdb redis.UniversalClient, opts ...Option) *Backend {
	o := options{namespace: DefaultNamespace}
	for _, opt := range opts {
		opt.apply(&o)
	}
	b := &Backend{rdb: rdb, ns: o.namespace, publish: "PUBLISH", ackReplicas: o.ackReplicas, ackTimeout: o.ackTimeout,
		allowEviction: o.allowEviction, log: o.log, err: o.err}
	if rdb == nil && b.err == nil {
		b.err = fmt.Errorf("redislock: nil client: %w", driver.ErrInvalid)
	}
	if _, ok := rdb.(*redis.ClusterClient); ok {
		b.sharded, b.publish = true, "SPUBLISH"
	}
	b.publishArg = b.publish
	b.where, b.addr = storeWhere(rdb)
	var r [9]byte
	_, _ = rand.Read(r[:])
	b.ridPrefix = base64.RawURLEncoding.EncodeToString(r[:]) + "."
	b.hid = b.ridPrefix[:8]
	return b
}

// Acquire grants the lock to req.Token in one script. An exclusive request
// gets a new grant when the lock has no exclusive holder, no live shared
// hold and, with req.Fair, no live queue entry of another token ahead of
// req.Token; a reentrant holder gets one more hold. A shared request
// (req.Mode Shared) gets a hold of its own when there is no exclusive
// holder, no live writer intent of another token (with req.Fair, of another
// token that is not queued), with req.Limit fewer than req.Limit live
// shared holds and, with req.Fair, no live queue entry of another token
// ahead of req.Token; a shared request whose Limit is not the
// one of the live shared holds is refused as a conflict (Conflict,
// HeldLimit). Every new grant draws a fence from the
// key's counter. A refused request reports why (the holder's owner and
// remaining TTL, the live shared holds, a waiting writer) with a nil error,
// and with req.Wait records a writer intent or a queue entry as the driver
// contract describes. Errors come only from Redis and wrap its error, or
// name a Mode the backend does not know.
func (b *Backend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	if b.err != nil {
		return driver.AcquireResult{}, b.err
	}
	if !b.allowEviction && !b.eviction.ok.Load() {
		if err := b.checkEviction(ctx, req.Key); err != nil {
			return driver.AcquireResult{}, b.storeError(ctx, "acquire", req.Key, err)
		}
	}
	args, rid, err := b.acquireCall(req)
	if err != nil {
		return driver.AcquireResult{}, b.storeError(ctx, "acquire", req.Key, err)
	}
	if b.acking() {
		return b.acquireAcked(ctx, req, rid, splitEvalSha(args))
	}
	return b.acquireAnswer(ctx, req, rid, runEvalSha(ctx, b.rdb, acquireScript, args))
}

// acquireAnswer reads the answer of an acquire's script call, whose request
// id is rid.
func (b *Backend) acquireAnswer(ctx context.Context, req driver.AcquireRequest, rid *requestArg, cmd *redis.Cmd) (driver.AcquireResult, error) {
	reply, err := cmd.Slice()
	b.sent(req, rid, err)
	if err != nil {
		return driver.AcquireResult{}, b.storeError(ctx, "acquire", req.Key, err)
	}
	res, err := parseAcquire(reply)
	if err != nil {
		return driver.AcquireResult{}, b.storeError(ctx, "acquire", req.Key, err)
	}
	if res.Acquired && req.Mode == driver.Exclusive {
		b.onces.granted(req.Key, req.Token, rid)
	}
	if !res.Acquired {
		b.refused(ctx, req.Key, req.Token, rid, res.Queued)
	}
	return res, nil
}

// sent notes that the acquire req, whose request id is rid, was answered
// err (nil, a server's error, or none read): a copy of it may still land
// (onceGrants.mayLand).
func (b *Backend) sent(req driver.AcquireRequest, rid *requestArg, err error) {
	re := redis.Error(nil)
	b.onces.mayLand(req.Key, req.Token, rid, err == nil || errors.As(err, &re))
}

// refused records the refused acquire request rid of token on key in the
// late-request record when go-redis wrote it twice (recordLate). Recorded,
// it is no more one for a release of token to record, unless it queued
// token (queued): that waiter's grant and release may come later.
func (b *Backend) refused(ctx context.Context, key, token string, rid *requestArg, queued bool) {
	if rid.writes.Load() > 1 && b.recordLate(ctx, key, rid.id) && !queued {
		b.onces.forget(key, token, "", rid.id)
	}
}

// recordLate records in key's late-request record the request id, refused
// though go-redis wrote it twice: its first copy may land after the lock
// is free, and no release names a request that made no grant (a TryLock's
// token is released by nobody). It reports whether it did: when the write
// fails, the refusal stands, and the copy may grant.
func (b *Backend) recordLate(ctx context.Context, key, id string) bool {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
	defer cancel()
	return recordLateScript.Run(rctx, b.rdb, []string{b.lockKey(key) + lateSuffix}, id).Err() == nil
}

// acquireCall returns the EVALSHA of acquire.lua for req, as evalShaArgs
// lays it out, and its request id.
func (b *Backend) acquireCall(req driver.AcquireRequest) ([]any, *requestArg, error) {
	var shared bool
	switch req.Mode {
	case driver.Exclusive:
	case driver.Shared:
		shared = true
	default:
		return nil, nil, fmt.Errorf("unknown mode %v", req.Mode)
	}
	delay := int64(0)
	if req.LockDelay > 0 {
		delay = millis(req.LockDelay)
	}
	queueTTL := int64(0)
	if req.Wait && req.QueueTTL > 0 {
		queueTTL = millis(req.QueueTTL)
	}
	const nk = len(acquireSuffixes)
	var keys [nk]string
	b.keysInto(keys[:], req.Key, acquireSuffixes[:])
	args := evalShaArgs(acquireSHA, nk, 16)
	for i, k := range keys {
		args[3+i] = k
	}
	rid := b.request()
	handoff := req.Handoff && req.Fair && req.Wait && !req.Reentrant && req.LockDelay <= 0 && b.ackReplicas == 0
	copy(args[3+nk:], []any{req.Token, req.Owner, millis(req.TTL), flag(req.Reentrant), delay,
		flag(shared), max(req.Limit, 0), flag(req.Fair), flag(req.Wait), queueTTL, rid,
		flag(handoff), b.hid, "", "", flag(handoff && req.KeepPlace && !shared)})
	if shared && req.Fair {
		// A fair shared grant hands holds to the shared entries behind it
		// and announces them (acquire.lua's ARGV[14], ARGV[15]).
		args[3+nk+13], args[3+nk+14] = b.channel(req.Key), b.publishArg
	}
	return args, rid, nil
}

// flags are the boolean arguments of a script, boxed once.
var flags = [2]any{"0", "1"}

// flag is a boolean argument of a script.
func flag(v bool) any {
	if v {
		return flags[1]
	}
	return flags[0]
}

// parseAcquire reads acquire.lua's reply: {1, fence, holds} or {1, fence,
// holds, overtook} for a grant, {0, owner, pttl} or {0, owner, pttl,
// shared, writer waiting, position, queued} for a refusal, the latter
// followed by the fence counter for a request that accepts a handoff, or,
// for a waiting exclusive request or a waiting shared one without fair,
// by the counter (or 0) and whether a fair queue is live, and {2, owner,
// pttl, shared, limit} for a conflict (see parseConflict).
func parseAcquire(reply []any) (driver.AcquireResult, error) {
	if len(reply) == 5 {
		return parseConflict(reply)
	}
	if len(reply) != 3 && len(reply) != 4 && len(reply) != 7 && len(reply) != 8 && len(reply) != 9 {
		return driver.AcquireResult{}, fmt.Errorf("unexpected reply %v", reply)
	}
	var ints [9]int64
	for i, v := range reply {
		if i == 1 {
			continue // a fence or an owner
		}
		n, err := asInt64(v)
		if err != nil {
			return driver.AcquireResult{}, err
		}
		ints[i] = n
	}
	if ints[0] == 1 {
		fence, err := asUint64(reply[1])
		if err != nil {
			return driver.AcquireResult{}, err
		}
		return driver.AcquireResult{Acquired: true, Fence: fence, Holds: int(ints[2]), Overtook: len(reply) == 4 && ints[3] == 1}, nil
	}
	owner, _ := reply[1].(string)
	res := driver.AcquireResult{Holder: owner, HolderTTL: ttlOf(ints[2])}
	if len(reply) >= 7 {
		res.Shared, res.WriterWaiting = int(ints[3]), ints[4] == 1
		res.Position, res.Queued = int(ints[5]), ints[6] == 1
	}
	if len(reply) >= 8 {
		res.Counter = uint64(max(ints[7], 0))
	}
	if len(reply) == 9 {
		res.QueueLive = ints[8] == 1
	}
	return res, nil
}

// parseConflict reads acquire.lua's reply to a shared request refused by
// live shared holds of another limit: {2, owner, pttl, shared, limit}.
func parseConflict(reply []any) (driver.AcquireResult, error) {
	var ints [5]int64
	for i, v := range reply {
		if i == 1 {
			continue
		}
		n, err := asInt64(v)
		if err != nil {
			return driver.AcquireResult{}, err
		}
		ints[i] = n
	}
	if ints[0] != 2 {
		return driver.AcquireResult{}, fmt.Errorf("unexpected reply %v", reply)
	}
	owner, _ := reply[1].(string)
	return driver.AcquireResult{Holder: owner, HolderTTL: ttlOf(ints[2]), Shared: int(ints[3]),
		Conflict: true, HeldLimit: int(max(ints[4], 0))}, nil
}

// Supports reports true for driver.CapShared, driver.CapSemaphore,
// driver.CapFair and driver.CapFairShared: read-write locks, semaphores
// and fair locks of every kind are kept in
// keys next to the lock's hash (see the package documentation); and for
// driver.CapOvertook and driver.CapOvertookShared: a grant, exclusive or
// shared, says when it went before a fair queue; for
// driver.CapLockDelay: the lock-delay is kept in the lock's hash; and for
// driver.CapHandoff and driver.CapKeepPlace, unless WithReplicaAck is
// given: a release grants the lock to the fair queue's head, names the
// grant in its announcement, and queues the head's successor when the
// head's client keeps its place.
func (b *Backend) Supports(c driver.Capability) bool {
	switch c {
	case driver.CapShared, driver.CapSemaphore, driver.CapFair, driver.CapFairShared, driver.CapOvertook, driver.CapOvertookShared, driver.CapLockDelay:
		return true
	case driver.CapHandoff, driver.CapKeepPlace:
		// A release's grant is not acknowledged by replicas: with
		// WithReplicaAck, heads ask for the lock themselves.
		return b.ackReplicas == 0
	}
	return false
}

// Renew sets the TTL of token's hold to ttl if token still holds the lock,
// exclusively or with a shared hold, in one script; it never shortens it.
// It reports false, with a nil error, when token is not a holder (released,
// expired or taken over).
func (b *Backend) Renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	return b.renew(ctx, key, token, 0, ttl)
}

// RenewGrant is Renew tied to the grant it extends (driver.GrantRenewer):
// when token holds an exclusive grant with another fence (its owner ID was
// granted the lock again after this grant ended), it extends nothing and
// reports false.
func (b *Backend) RenewGrant(ctx context.Context, key, token string, fence uint64, ttl time.Duration) (bool, error) {
	return b.renew(ctx, key, token, fence, ttl)
}

// renew runs the renew script; fence is the grant's, or 0.
func (b *Backend) renew(ctx context.Context, key, token string, fence uint64, ttl time.Duration) (bool, error) {
	if b.err != nil {
		return false, b.err
	}
	if b.acking() {
		return b.renewAcked(ctx, key, token, fence, ttl)
	}
	const nk = len(renewSuffixes)
	var keys [nk]string
	b.keysInto(keys[:], key, renewSuffixes[:])
	args := evalShaArgs(renewSHA, nk, 3)
	for i, k := range keys {
		args[3+i] = k
	}
	args[3+nk], args[4+nk], args[5+nk] = token, millis(ttl), fenceArg(fence)
	n, err := runEvalSha(ctx, b.rdb, renewScript, args).Int64()
	if err != nil {
		return false, b.storeError(ctx, "renew", key, err)
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
	if b.err != nil {
		out := make([]driver.RenewResult, len(reqs))
		for i := range out {
			out[i].Err = b.err
		}
		return out
	}
	if b.acking() {
		return b.renewBatchAcked(ctx, reqs)
	}
	cmds := runPipelined(ctx, b.rdb, renewScript, b.renewCalls(reqs))
	results := make([]driver.RenewResult, len(reqs))
	for i, cmd := range cmds {
		n, err := cmd.Int64()
		if err != nil {
			results[i].Err = b.storeError(ctx, "renew", reqs[i].Key, err)
			continue
		}
		results[i].Held = n == 1
	}
	return results
}

// renewCalls returns the runs of renew.lua for reqs. Their keys are cut
// from one string and their keys and arguments from one slice each, so that
// a batch of any size allocates a handful of times plus once a token.
func (b *Backend) renewCalls(reqs []driver.RenewRequest) []scriptCall {
	const nk, na = len(renewSuffixes), 3
	n := 0
	for _, r := range reqs {
		n += b.keysLen(r.Key, renewSuffixes[:])
	}
	var sb strings.Builder
	sb.Grow(n)
	for _, r := range reqs {
		b.writeKeys(&sb, r.Key, renewSuffixes[:])
	}
	all := sb.String()
	calls := make([]scriptCall, len(reqs))
	keys := make([]string, nk*len(reqs))
	args := make([]any, na*len(reqs))
	var ttl time.Duration
	var ms any
	for i, r := range reqs {
		k := keys[i*nk : (i+1)*nk : (i+1)*nk]
		all = b.cutKeys(k, all, r.Key, renewSuffixes[:])
		if ms == nil || r.TTL != ttl { // leases of one batch mostly share a TTL: box it once
			ttl, ms = r.TTL, millis(r.TTL)
		}
		a := args[i*na : (i+1)*na : (i+1)*na]
		a[0], a[1], a[2] = r.Token, ms, fenceArg(r.Fence)
		calls[i] = scriptCall{keys: k, args: a}
	}
	return calls
}

// fenceArg is the fence argument of the renew and release scripts: the
// grant's fence in decimal, or "" for a call tied to no grant (0).
func fenceArg(fence uint64) string {
	if fence == 0 {
		return ""
	}
	return strconv.FormatUint(fence, 10)
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
