// The per-user purchase limit: a fixed-window counter (one script, the
// seed's design) or GCRA (go-redis/redis_rate), behind one interface.

package main

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// Rate limiters a service can use (-limiter).
const (
	limiterWindow = "window" // a counter per user and window: INCR, PEXPIRE on the first hit
	limiterGCRA   = "gcra"   // go-redis/redis_rate: the theoretical arrival time per user
)

var (
	//go:embed window.lua
	windowSrc    string
	windowScript = redis.NewScript(windowSrc)
)

// limiter decides whether a user may attempt one more purchase now.
type limiter interface {
	// allow counts one attempt of user and reports whether it is within
	// the limit.
	allow(ctx context.Context, user string) (bool, error)
}

// newLimiter returns the limiter named kind, admitting limit attempts per
// user per period.
func newLimiter(kind string, rdb *redis.Client, k keys, limit int, period time.Duration) (limiter, error) {
	if limit <= 0 || period <= 0 {
		return nil, fmt.Errorf("rate limit %d per %v: both must be positive", limit, period)
	}
	if err := knownLimiter(kind); err != nil {
		return nil, err
	}
	if kind == limiterWindow {
		return &windowLimiter{rdb: rdb, k: k, limit: int64(limit), window: period}, nil
	}
	return &gcraLimiter{rl: redis_rate.NewLimiter(rdb), k: k,
		limit: redis_rate.Limit{Rate: limit, Burst: limit, Period: period}}, nil
}

// knownLimiter returns an error unless kind names a limiter.
func knownLimiter(kind string) error {
	if kind != limiterWindow && kind != limiterGCRA {
		return fmt.Errorf("unknown limiter %q: want %s or %s", kind, limiterWindow, limiterGCRA)
	}
	return nil
}

// windowLimiter admits limit attempts per user in each window. A window
// opens at the user's first attempt after the last one ended, so a user
// can get limit attempts at the end of one window and limit more at the
// start of the next: up to twice the limit in a short time.
type windowLimiter struct {
	rdb    redis.Scripter
	k      keys
	limit  int64
	window time.Duration
}

func (l *windowLimiter) allow(ctx context.Context, user string) (bool, error) {
	hits, err := windowScript.Run(ctx, l.rdb, []string{l.k.rateWindow(user)}, l.window.Milliseconds()).Int64()
	if err != nil {
		return false, fmt.Errorf("rate window %s: %w", user, err)
	}
	return hits <= l.limit, nil
}

// gcraLimiter admits a burst of limit attempts per user, then one every
// period/limit: never more than the burst at once.
type gcraLimiter struct {
	rl    *redis_rate.Limiter
	k     keys
	limit redis_rate.Limit
}

func (l *gcraLimiter) allow(ctx context.Context, user string) (bool, error) {
	res, err := l.rl.Allow(ctx, l.k.rateLimit(user), l.limit)
	if err != nil {
		return false, fmt.Errorf("rate gcra %s: %w", user, err)
	}
	return res.Allowed > 0, nil
}
