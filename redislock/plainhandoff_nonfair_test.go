package redislock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// promisedPause wraps the Backend of the plain waiter X. Once X's fair
// requests have found the lock free but promised to another head for a
// while (just short of promisedGrace), the answer to X's next fair request
// (S1, which refreshed X's queue entry on the store) comes back late: a
// slow network, or a pause of X's process right after the answer. During
// the pause, onPause runs (a reader takes the name). X's next request is
// then the non-fair one of the promisedGrace fallback (S2): the readers
// refuse it and it records a writer intent, so it is answered "queued",
// though it did not touch X's queue entry. onIntent runs after that
// answer (the head before X goes, the reader releases, and the release
// hands the lock to X, now the head).
type promisedPause struct {
	*redislock.Backend
	pause      time.Duration
	renewDelay time.Duration
	onPause    func()
	onIntent   func()

	mu         sync.Mutex
	queued     chan struct{} // closed at X's first queued fair request
	promisedAt time.Time
	fired      bool
	intentDone bool
	s1, s2     time.Time
}

func (p *promisedPause) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	sent := time.Now()
	res, err := p.Backend.Acquire(ctx, req)
	if err != nil || res.Acquired {
		return res, err
	}
	p.mu.Lock()
	switch {
	case req.Fair && req.Wait && res.Queued:
		if p.queued != nil {
			close(p.queued)
			p.queued = nil
		}
		if res.Holder != "" || res.HolderTTL > 0 || res.Shared > 0 || p.fired {
			break
		}
		if p.promisedAt.IsZero() {
			p.promisedAt = time.Now()
			break
		}
		if time.Since(p.promisedAt) >= 30*time.Millisecond {
			p.fired, p.s1 = true, sent
			p.mu.Unlock()
			p.onPause()
			time.Sleep(p.pause)
			return res, err
		}
	case !req.Fair && req.Wait && p.fired && !p.intentDone && res.Queued && res.Shared > 0:
		p.intentDone, p.s2 = true, sent
		go p.onIntent()
	}
	p.mu.Unlock()
	return res, err
}

// X's renewals are slow too once the pause happened (the same slow
// network): they reach the store renewDelay late.
func (p *promisedPause) slowRenew() {
	p.mu.Lock()
	fired := p.fired
	p.mu.Unlock()
	if fired {
		time.Sleep(p.renewDelay)
	}
}

func (p *promisedPause) Renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	p.slowRenew()
	return p.Backend.Renew(ctx, key, token, ttl)
}

func (p *promisedPause) RenewGrant(ctx context.Context, key, token string, fence uint64, ttl time.Duration) (bool, error) {
	p.slowRenew()
	return p.Backend.RenewGrant(ctx, key, token, fence, ttl)
}

func (p *promisedPause) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) []driver.RenewResult {
	p.slowRenew()
	return p.Backend.RenewBatch(ctx, reqs)
}

// TestPlainHandoffAfterNonFairQueuedAnswer: a plain waiter in the
// queue that falls back to a non-fair request after promisedGrace, and is
// answered "queued" because readers refused it and it recorded a writer
// intent, takes that request's send time (S2) as its queue entry's
// (waiter.answered sets w.queued). But a non-fair request does not refresh
// the queue entry: the entry, and so a grant handed to it, expires at the
// last fair request's arrival + QueueTTL. A release that then hands the
// lock to the waiter makes a lease trusted until S2 + QueueTTL − drift −
// margin, past the store's expiry of the handed grant; another client
// takes the lock while the first lease is still live.
//
// Needs a plain Mutex and RWMutex readers on one name (LOCK-KINDS: "a plain
// Mutex of a name is the write side of the RWMutex of that name"), and
// ~0.6 s+ (margin + drift − the time S1→S2 normally takes) between the
// arrival of the last fair request and the send of the non-fair one (a
// slow answer or a paused process; here 1.7 s with the default TTL 10 s,
// plain entries of 3 s, margin 1 s). Before 02ca577 a plain waiter took no
// handoff; the fix is in waiter.answered.
func TestPlainHandoffAfterNonFairQueuedAnswer(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := t.Context()
	const name = "plainhandoff/nonfair"
	raw := redislock.New(srv.Client(t))
	holderC := dlock.New(redislock.New(srv.Client(t)))
	defer holderC.Close()
	readerC := dlock.New(redislock.New(srv.Client(t)))
	defer readerC.Close()
	otherC := dlock.New(redislock.New(srv.Client(t)))
	defer otherC.Close()

	var rl *dlock.Lease
	var rlMu sync.Mutex
	handedAt := make(chan time.Time, 1)
	st := &promisedPause{
		Backend:    redislock.New(srv.Client(t)),
		pause:      1700 * time.Millisecond,
		renewDelay: 500 * time.Millisecond,
		queued:     make(chan struct{}),
	}
	queued := st.queued
	st.onPause = func() {
		l, err := readerC.RWMutex(name).RLock(ctx)
		if err != nil {
			t.Errorf("reader: %v", err)
			return
		}
		rlMu.Lock()
		rl = l
		rlMu.Unlock()
	}
	st.onIntent = func() {
		time.Sleep(30 * time.Millisecond)
		// The head before X goes (as its entry lapses, or it gives up).
		if err := raw.Withdraw(ctx, name, "dead-head"); err != nil {
			t.Errorf("withdraw: %v", err)
		}
		rlMu.Lock()
		l := rl
		rlMu.Unlock()
		handedAt <- time.Now()
		if l != nil {
			_ = l.Unlock(ctx) // hands the lock to X, now the head
		}
	}
	xc := dlock.New(st)
	defer xc.Close()

	hl, err := holderC.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A head that takes no handoff (an older version, a Reentrant Fair
	// handle, a plain handle with a large margin...).
	res, err := raw.Acquire(ctx, driver.AcquireRequest{
		Key: name, Token: "dead-head", Owner: "dead-head", TTL: 10 * time.Second,
		Fair: true, Wait: true, QueueTTL: 5 * time.Second,
	})
	if err != nil || res.Acquired || !res.Queued {
		t.Fatalf("dead head: %+v %v", res, err)
	}

	type out struct {
		l   *dlock.Lease
		err error
	}
	xout := make(chan out, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		l, err := xc.Mutex(name).Lock(wctx)
		xout <- out{l, err}
	}()
	select {
	case <-queued:
	case <-time.After(5 * time.Second):
		t.Fatal("X never queued")
	}
	if err := hl.Unlock(ctx); err != nil { // free, promised to dead-head
		t.Fatal(err)
	}
	var xl *dlock.Lease
	select {
	case o := <-xout:
		if o.err != nil {
			t.Fatalf("X's Lock: %v", o.err)
		}
		xl = o.l
	case <-time.After(15 * time.Second):
		t.Fatal("X's Lock did not return")
	}
	now := time.Now()
	st.mu.Lock()
	fired, s1, s2 := st.fired, st.s1, st.s2
	st.mu.Unlock()
	if !fired || s2.IsZero() {
		// The wrapper's hooks force the interleaving; a run that misses it
		// checks nothing, and must not pass.
		t.Fatalf("setup: the interleaving was not reached (fired %v, non-fair queued answer %v): X got fence %d otherwise", fired, !s2.IsZero(), xl.Fence())
	}
	defer xl.Unlock(context.Background())
	pttl, err := srv.Client(t).PTTL(ctx, "dlock:{"+name+"}").Result()
	if err != nil {
		t.Fatal(err)
	}
	storeExp := now.Add(pttl)
	safe := xl.Deadline().Add(-time.Second) // default margin: TTL/10
	t.Logf("S1 (last fair, refreshed the entry) at 0; S2 (non-fair, answered queued) at +%v; lease deadline +%v (safe +%v); store expiry of the handed grant +%v",
		s2.Sub(s1).Round(time.Millisecond), xl.Deadline().Sub(s1).Round(time.Millisecond),
		safe.Sub(s1).Round(time.Millisecond), storeExp.Sub(s1).Round(time.Millisecond))
	if xl.Deadline().After(storeExp.Add(10 * time.Millisecond)) {
		t.Errorf("X's handed lease (fence %d) has Deadline %v after the store's expiry of its grant (lease trusted until %v past it)",
			xl.Fence(), xl.Deadline().Sub(storeExp).Round(time.Millisecond), safe.Sub(storeExp).Round(time.Millisecond))
	}
	// Another client now takes the lock while X's lease is live.
	var lastErr error
	for time.Now().Before(safe) && time.Since(now) < 3*time.Second {
		ol, err := otherC.Mutex(name).TryLock(ctx)
		lastErr = err
		if err == nil {
			if xl.Err() == nil && time.Now().Before(safe) {
				t.Errorf("two holders: X (fence %d, live, safe deadline in %v) and another client (fence %d)",
					xl.Fence(), time.Until(safe).Round(time.Millisecond), ol.Fence())
			}
			_ = ol.Unlock(ctx)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("no other holder before X's safe deadline; last TryLock: %v; X's lease: %v", lastErr, xl.Err())
	select {
	case at := <-handedAt:
		t.Logf("handed at +%v", at.Sub(s1).Round(time.Millisecond))
	default:
	}
}
