package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisRTT returns the percentiles of n PINGs, one after the other: the
// round trip floor of every lock on that server.
func RedisRTT(ctx context.Context, rdb redis.UniversalClient, n int) (Percentiles, error) {
	return timeCalls(n, "ping", func() error { return rdb.Ping(ctx).Err() })
}

// timeCalls returns the percentiles of n calls of fn, one after the other.
func timeCalls(n int, what string, fn func() error) (Percentiles, error) {
	d := make([]time.Duration, 0, n)
	for range n {
		s := time.Now()
		if err := fn(); err != nil {
			return Percentiles{}, fmt.Errorf("bench: %s: %w", what, err)
		}
		d = append(d, time.Since(s))
	}
	return Summarize(d), nil
}

// RedisHook returns a go-redis hook that counts every command or pipeline
// a client sends as one round trip. Add it to each client of a subject with
// AddHook.
func (t *Trips) RedisHook() redis.Hook { return tripHook{t} }

type tripHook struct{ t *Trips }

func (tripHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h tripHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.t.Add(1)
		return next(ctx, cmd)
	}
}

func (h tripHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.t.Add(1)
		return next(ctx, cmds)
	}
}

// RedisCounter counts the commands Redis servers served, from INFO
// commandstats (summed over the servers; the INFO calls themselves are left
// out). Other clients of the same servers are counted too.
type RedisCounter []redis.UniversalClient

// info returns the INFO section of every server: each client's, and each
// shard's of a Cluster.
func (rc RedisCounter) info(ctx context.Context, section string) ([]string, error) {
	var infos []string
	for _, rdb := range rc {
		if cc, ok := rdb.(*redis.ClusterClient); ok {
			var mu sync.Mutex // ForEachShard calls fn on the shards at once
			err := cc.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error {
				s, err := c.Info(ctx, section).Result()
				mu.Lock()
				infos = append(infos, s)
				mu.Unlock()
				return err
			})
			if err != nil {
				return nil, err
			}
			continue
		}
		s, err := rdb.Info(ctx, section).Result()
		if err != nil {
			return nil, err
		}
		infos = append(infos, s)
	}
	return infos, nil
}

// Count implements Counter.
func (rc RedisCounter) Count(ctx context.Context) (map[string]uint64, error) {
	infos, err := rc.info(ctx, "commandstats")
	if err != nil {
		return nil, err
	}
	total := map[string]uint64{}
	for _, s := range infos {
		for k, v := range parseCommandStats(s) {
			total[k] += v
		}
	}
	return total, nil
}

// CPU implements CPUMeter: the CPU time, user and system, that the servers
// report in INFO cpu, summed (a Cluster's every shard).
func (rc RedisCounter) CPU(ctx context.Context) (time.Duration, error) {
	infos, err := rc.info(ctx, "cpu")
	if err != nil {
		return 0, err
	}
	var total time.Duration
	for _, s := range infos {
		d, err := parseCPU(s)
		if err != nil {
			return 0, err
		}
		total += d
	}
	return total, nil
}

// parseCPU reads used_cpu_sys and used_cpu_user (seconds) of INFO cpu.
func parseCPU(s string) (time.Duration, error) {
	var total time.Duration
	found := 0
	for _, line := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "used_cpu_sys" && k != "used_cpu_user") {
			continue
		}
		sec, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu: %s: %w", k, err)
		}
		total += time.Duration(sec * float64(time.Second))
		found++
	}
	if found != 2 {
		return 0, errors.New("INFO cpu: no used_cpu_sys and used_cpu_user")
	}
	return total, nil
}

// parseCommandStats reads "cmdstat_NAME:calls=N,..." lines, without INFO.
func parseCommandStats(s string) map[string]uint64 {
	m := map[string]uint64{}
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		stat, ok := strings.CutPrefix(line, "cmdstat_")
		if !ok {
			continue
		}
		name, rest, ok := strings.Cut(stat, ":")
		if !ok || name == "info" {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				if n, err := strconv.ParseUint(v, 10, 64); err == nil {
					m[name] += n
				}
			}
		}
	}
	return m
}

// rawRelease deletes the key only while it still holds the caller's token.
var rawRelease = redis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`)

// RawRedis is the floor a Redis lock is measured against: SET NX PX to
// acquire, retried at once while taken (a busy spin, one command in flight
// per worker), and a compare-and-delete script to release. It has no
// renewal, no fencing and no waking; it is a baseline, not a lock to use.
// Its workers take read-write locks and semaphores too, as spins of the
// same shape (see rawRLock, rawWLock and rawAcquirePermit).
func RawRedis(name string, newClient func() redis.UniversalClient, ttl time.Duration) Subject {
	return Subject{
		Name: name,
		NewWorker: func(ctx context.Context, id int) (Worker, error) {
			rdb := newClient()
			for _, s := range []*redis.Script{rawRelease, rawRLock, rawWLock, rawAcquirePermit} {
				if err := s.Load(ctx, rdb).Err(); err != nil {
					_ = rdb.Close()
					return nil, err
				}
			}
			return &rawRedisWorker{rdb: rdb, ttl: ttl, token: fmt.Sprintf("raw-%d-%d", id, time.Now().UnixNano())}, nil
		},
	}
}

type rawRedisWorker struct {
	rdb   redis.UniversalClient
	ttl   time.Duration
	token string
}

type rawRedisHeld struct {
	w   *rawRedisWorker
	key string
}

func (w *rawRedisWorker) Lock(ctx context.Context, name string) (Held, error) {
	for {
		ok, err := w.rdb.SetNX(ctx, name, w.token, w.ttl).Result()
		if err != nil {
			return nil, err
		}
		if ok {
			return rawRedisHeld{w, name}, nil
		}
	}
}

func (h rawRedisHeld) Unlock(ctx context.Context) error {
	n, err := rawRelease.EvalSha(ctx, h.w.rdb, []string{h.key}, h.w.token).Int()
	if err != nil {
		return err
	}
	if n != 1 {
		return fmt.Errorf("raw release of %q: not held", h.key)
	}
	return nil
}

func (w *rawRedisWorker) Close() error { return w.rdb.Close() }

// The raw read-write lock of name is two keys in one hash slot: the
// writer's token (SET PX) and a hash of the readers' tokens (PEXPIRE on
// the whole hash). A writer claims its key before the readers have left,
// so that new readers keep out while it waits, as dlock's waiting writers
// make them: without it, six readers spinning on a hot name almost never
// leave the hash empty, and the writers starve.
var (
	// rawRLock adds reader ARGV[1] to KEYS[2] (for ARGV[2] ms) unless
	// writer key KEYS[1] is held or claimed: 1 when added.
	rawRLock = redis.NewScript(`if redis.call("exists", KEYS[1]) == 1 then return 0 end
redis.call("hset", KEYS[2], ARGV[1], 1)
redis.call("pexpire", KEYS[2], ARGV[2])
return 1`)
	// rawWLock claims writer key KEYS[1] for ARGV[1] (for ARGV[2] ms)
	// unless another writer has it: 1 when the readers' hash KEYS[2] is
	// gone too (granted), 0 otherwise (refused, or claimed while readers
	// stay).
	rawWLock = redis.NewScript(`local w = redis.call("get", KEYS[1])
if w and w ~= ARGV[1] then return 0 end
if not w then redis.call("set", KEYS[1], ARGV[1], "px", ARGV[2]) end
if redis.call("exists", KEYS[2]) == 1 then return 0 end
return 1`)
	// rawAcquirePermit adds holder ARGV[1] to hash KEYS[1] (for ARGV[2] ms)
	// while it has fewer than ARGV[3] holders: 1 when added.
	rawAcquirePermit = redis.NewScript(`if redis.call("hlen", KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call("hset", KEYS[1], ARGV[1], 1)
redis.call("pexpire", KEYS[1], ARGV[2])
return 1`)
)

// rawRWKeys returns the writer's key and the readers' hash of the raw
// read-write lock name.
func rawRWKeys(name string) []string { return []string{"{" + name + "}:w", "{" + name + "}:r"} }

// RLock implements RWLocker: rawRLock retried at once while refused; the
// release is HDEL of the worker's token.
func (w *rawRedisWorker) RLock(ctx context.Context, name string) (Held, error) {
	keys := rawRWKeys(name)
	if err := w.spin(ctx, rawRLock, keys, w.token, w.ttl.Milliseconds()); err != nil {
		return nil, err
	}
	return rawHashHeld{w, keys[1]}, nil
}

// WLock implements RWLocker: rawWLock retried at once until granted; the
// release is the compare-and-delete of RawRedis. A wait that ends drops
// the worker's claim.
func (w *rawRedisWorker) WLock(ctx context.Context, name string) (Held, error) {
	keys := rawRWKeys(name)
	if err := w.spin(ctx, rawWLock, keys, w.token, w.ttl.Milliseconds()); err != nil {
		_ = rawRedisHeld{w, keys[0]}.Unlock(context.WithoutCancel(ctx))
		return nil, err
	}
	return rawRedisHeld{w, keys[0]}, nil
}

// AcquirePermit implements PermitAcquirer: rawAcquirePermit retried at
// once while all permits are held; the release is HDEL of the worker's
// token.
func (w *rawRedisWorker) AcquirePermit(ctx context.Context, name string, permits int) (Held, error) {
	if err := w.spin(ctx, rawAcquirePermit, []string{name}, w.token, w.ttl.Milliseconds(), permits); err != nil {
		return nil, err
	}
	return rawHashHeld{w, name}, nil
}

// spin runs script until it returns 1.
func (w *rawRedisWorker) spin(ctx context.Context, script *redis.Script, keys []string, args ...any) error {
	for {
		n, err := script.EvalSha(ctx, w.rdb, keys, args...).Int()
		if err != nil {
			return err
		}
		if n == 1 {
			return nil
		}
	}
}

// rawHashHeld is a raw reader's or permit holder's entry in a hash.
type rawHashHeld struct {
	w   *rawRedisWorker
	key string
}

func (h rawHashHeld) Unlock(ctx context.Context) error {
	n, err := h.w.rdb.HDel(ctx, h.key, h.w.token).Result()
	if err != nil {
		return err
	}
	if n != 1 {
		return fmt.Errorf("raw release of %q: not held", h.key)
	}
	return nil
}
