// MultiAtOnce: a Multi whose every attempt takes all of its names in one
// atomic step of the store (driver.MultiAcquirer), and whose wait holds
// nothing.

package dlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// MultiAtOnce returns a handle on the locks of names that takes them all
// in one atomic step of the store, or none: one script on Redis, one
// transaction on SQL and etcd. Unlike Multi, which holds the names it has
// while it waits for the next, its wait holds nothing: it tries again
// when any of the names is released, so a MultiAtOnce holds all of its
// names or none at every instant. Its MultiLease is a Multi's.
//
// The options are Multi's; Fair, WithLockDelay and WithOwnerID are
// refused (ErrInvalid), and so is a backend without driver.MultiAcquirer
// (ErrInvalid and ErrUnsupported). On Redis Cluster the names must share
// a hash tag ("{order42}:stock", "{order42}:payment"): see LOCK-KINDS.md.
func (c *Client) MultiAtOnce(names []string, opts ...Option) *Multi {
	mm := c.Multi(names, opts...)
	if mm.err != nil {
		return mm
	}
	mm.atOnce = true
	o := &mm.ms[0].h.opts
	switch {
	case o.fair:
		mm.err = invalid("Fair: not supported by MultiAtOnce (its wait holds no queue place)")
	case o.lockDelay > 0:
		mm.err = invalid("WithLockDelay: not supported by MultiAtOnce")
	case o.ownerID != "":
		mm.err = invalid("WithOwnerID: not supported by MultiAtOnce (every attempt has a token of its own)")
	default:
		if _, ok := c.backend.(driver.MultiAcquirer); !ok {
			mm.err = &unsupportedError{what: "all-at-once multi-locks", backend: fmt.Sprintf("%T", c.backend)}
		}
	}
	return mm
}

// lockAtOnce is Lock (wait) and TryLock of a MultiAtOnce, observed as a
// Multi's are: each name's Lock or TryLock starts, and ends with its
// lease or the call's error.
func (mm *Multi) lockAtOnce(ctx context.Context, wait bool) (*MultiLease, error) {
	ob := mm.c.obs
	if ob == nil {
		ml, _, err := mm.waitAtOnce(ctx, wait)
		return ml, err
	}
	octxs := make([]context.Context, len(mm.ms))
	for i, m := range mm.ms {
		_, octxs[i] = ob.started(ctx, &m.h, !wait)
	}
	start := ob.now()
	ml, attempts, err := mm.waitAtOnce(ctx, wait)
	for i, m := range mm.ms {
		var l *Lease
		if ml != nil {
			l = ml.leases[i]
		}
		ob.lockEnded(octxs[i], &m.h, !wait, start, l, attempts, false, err)
	}
	return ml, err
}

// waitAtOnce is lockAtOnce, unobserved: an attempt on every name at once,
// then, for Lock, a sleep until a release of any of them, the holder's TTL
// or the retry schedule, and another attempt, until granted or the wait
// ends. A transient store error is tried again after a pause. It returns
// the number of attempts too.
func (mm *Multi) waitAtOnce(ctx context.Context, wait bool) (*MultiLease, int, error) {
	c := mm.c
	if err := c.enter(); err != nil {
		return nil, 0, err
	}
	defer c.exit()
	if wait && mm.wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, mm.wait)
		defer cancel()
	}
	ctx, stop := c.closeAware(ctx)
	defer stop()
	var wake chan struct{}
	var listened []string
	if wait {
		wake = make(chan struct{}, 1)
		c.hub.watchAll(mm.keys(), wake)
		defer func() {
			c.hub.unwatchAll(mm.keys(), wake)
			for _, key := range listened {
				c.hub.unlisten(key)
			}
		}()
	}
	h0 := &mm.ms[0].h
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var (
		refused *Mutex // the name refused at the last answer
		last    driver.AcquireResult
		lastErr error
		errs    int
	)
	for attempt := 1; ; attempt++ {
		if ctx.Err() != nil {
			return nil, attempt - 1, mm.notObtainedAtOnce(ctx, refused, last, lastErr)
		}
		notified := wait && len(listened) == len(mm.ms)
		if wait && !notified {
			// Subscribed before the attempt, so that a release after it
			// wakes the wait (the watch channel keeps it).
			listened = listened[:0]
			for _, key := range mm.keys() {
				if !c.hub.listenOrPoll(ctx, key) {
					break
				}
				listened = append(listened, key)
			}
			if len(listened) < len(mm.ms) {
				for _, key := range listened {
					c.hub.unlisten(key)
				}
				listened = nil
			}
			notified = len(listened) == len(mm.ms)
		}
		ml, m, res, err := mm.tryAtOnce(ctx, wait)
		switch {
		case ml != nil:
			return ml, attempt, nil
		case err != nil && ctx.Err() != nil:
			return nil, attempt, mm.notObtainedAtOnce(ctx, refused, last, err)
		case err != nil && (!wait || !transient(err)):
			return nil, attempt, err
		case err != nil:
			lastErr, errs = err, errs+1
		default:
			lastErr, errs = nil, 0
			refused, last = m, res
			m.h.busy(res)
			if !wait {
				return nil, attempt, m.h.notObtained(res)
			}
		}
		var d time.Duration
		if errs > 0 {
			d = transientDelay(errs)
		} else {
			retry := h0.opts.retry
			if retry == nil {
				retry = defaultPolledRetry
				if notified {
					retry = defaultNotifiedRetry
				}
			}
			d = max(retry.Delay(attempt), time.Millisecond)
			if last.HolderTTL > 0 && last.HolderTTL < d {
				d = last.HolderTTL + time.Millisecond
			}
		}
		if !sleep(ctx, timer, d, wake) {
			return nil, attempt, mm.notObtainedAtOnce(ctx, refused, last, lastErr)
		}
	}
}

// keys returns the names' keys, in lock order.
func (mm *Multi) keys() []string {
	keys := make([]string, len(mm.ms))
	for i, m := range mm.ms {
		keys[i] = m.h.key
	}
	return keys
}

// notObtainedAtOnce is the error of a MultiAtOnce wait that ended: the
// name refused last (the first name when none was), its holder, and why
// the wait ended.
func (mm *Multi) notObtainedAtOnce(ctx context.Context, refused *Mutex, last driver.AcquireResult, failed error) error {
	if refused == nil {
		refused = mm.ms[0]
	}
	errs := []error{refused.h.notObtained(last), context.Cause(ctx)}
	if failed != nil {
		errs = append(errs, fmt.Errorf("the store failed at the last attempt: %w", failed))
	}
	return errors.Join(errs...)
}

// tryAtOnce makes one AcquireAll with a token drawn for it. It returns
// the MultiLease when every name was granted, or the name refused and the
// store's answer for it, or an error; an error's outcome is unknown, and
// what the attempt may hold is released. A grant that came too late to be
// used is given back, and answered as a refusal to a waiting caller.
func (mm *Multi) tryAtOnce(ctx context.Context, wait bool) (*MultiLease, *Mutex, driver.AcquireResult, error) {
	c := mm.c
	h0 := &mm.ms[0].h
	token := newToken()
	sent := time.Now()
	owner := c.owner(sent, h0.opts.metadata)
	reqs := make([]driver.AcquireRequest, len(mm.ms))
	for i, m := range mm.ms {
		reqs[i] = driver.AcquireRequest{Key: m.h.key, Token: token, Owner: owner, TTL: m.h.opts.ttl}
	}
	start := c.obs.now()
	res, err := c.backend.(driver.MultiAcquirer).AcquireAll(ctx, reqs)
	c.obs.storeCall("acquire", h0.key, start, err)
	if err == nil && len(res) != len(reqs) {
		err = fmt.Errorf("backend answered %d results for %d requests", len(res), len(reqs))
	}
	if err != nil {
		mm.releaseAll(token, nil)
		return nil, nil, driver.AcquireResult{}, wrapStore("acquire", fmt.Sprint(mm.names), err)
	}
	if !res[0].Acquired {
		i := 0
		for j, r := range res {
			if r.Holder != "" || r.HolderTTL > 0 {
				i = j
				break
			}
		}
		return nil, mm.ms[i], res[i], nil
	}
	if took := time.Since(sent); took >= c.validFor(h0.opts.ttl)-h0.opts.safetyMargin() {
		fences := make([]uint64, len(res))
		for i, r := range res {
			fences[i] = r.Fence
		}
		mm.releaseAll(token, fences)
		if wait {
			return nil, mm.ms[0], driver.AcquireResult{}, nil
		}
		return nil, nil, driver.AcquireResult{}, &NotObtainedError{Name: mm.names[0], Slow: took}
	}
	leases := make([]*Lease, len(mm.ms))
	for i, m := range mm.ms {
		g, l := newGrant(c, &m.h, token, owner, res[i].Fence, sent, false)
		g.schedule()
		leases[i] = l
	}
	return newMultiLease(c, leases), nil, driver.AcquireResult{}, nil
}

// releaseAll releases token on every name, tied to the grants of fences
// when they are known, before it returns unless the store is slow to
// answer (see settle): after an attempt whose outcome is unknown, or whose
// grant came too late.
func (mm *Multi) releaseAll(token string, fences []uint64) {
	c := mm.c
	c.settle(mm.ms[0].h.opts.ttl, func(ctx context.Context) {
		for i := len(mm.ms) - 1; i >= 0; i-- {
			var fence uint64
			if fences != nil {
				fence = fences[i]
			}
			if _, err := c.storeRelease(ctx, mm.ms[i].h.key, token, fence, 0); err != nil {
				c.log.Warn("dlock: clean-up after an interrupted multi-lock acquire failed; the lock expires after its TTL", "lock", mm.ms[i].h.name, "err", err)
			}
		}
	})
}

// watchAll registers w as an observer channel of every key (see
// waitHub.watchers): a release of any of them, a gap in the stream or a
// grant of this Client signals it. unwatchAll takes it out again.
func (hub *waitHub) watchAll(keys []string, w chan struct{}) {
	hub.mu.Lock()
	defer hub.mu.Unlock()
	if hub.watchers == nil {
		hub.watchers = make(map[string][]chan struct{})
	}
	for _, key := range keys {
		hub.watchers[key] = append(hub.watchers[key], w)
	}
}

// unwatchAll takes the channel w of every key out.
func (hub *waitHub) unwatchAll(keys []string, w chan struct{}) {
	for _, key := range keys {
		hub.unwatch(key, w)
	}
}
