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

// lapseStore delays the head's answers and its handoff notice (network /
// pause), so that its next queue refresh reaches the store after the
// handed grant lapsed and is answered Queued; the notice is delivered
// after that answer.
type lapseStore struct {
	*redislock.Backend
	d1, d2  time.Duration
	release func()
	mu      sync.Mutex
	n       int
	fn      func(key, next string)
	held    []string
	token   string
	log     func(string, ...any)
}

func (s *lapseStore) Listen(ctx context.Context, fn func(key, next string)) (driver.Listener, error) {
	s.mu.Lock()
	s.fn = fn
	s.mu.Unlock()
	return s.Backend.Listen(ctx, func(key, next string) {
		tok, fence := driver.ParseNext(next)
		s.mu.Lock()
		if fence > 0 && tok == s.token {
			s.held = append(s.held, next)
			s.mu.Unlock()
			s.log("notice held: fence %d", fence)
			return
		}
		s.mu.Unlock()
		fn(key, next)
	})
}

func (s *lapseStore) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	if !req.Handoff {
		return s.Backend.Acquire(ctx, req)
	}
	s.mu.Lock()
	s.n++
	n := s.n
	s.token = req.Token
	s.mu.Unlock()
	switch n {
	case 2:
		res, err := s.Backend.Acquire(ctx, req)
		s.log("R1 answered %+v", res)
		s.release()
		time.Sleep(s.d1) // the answer is slow
		return res, err
	case 3:
		time.Sleep(s.d2) // the request is slow
		res, err := s.Backend.Acquire(ctx, req)
		s.log("R2 answered %+v %v", res, err)
		s.mu.Lock()
		held, fn := s.held, s.fn
		s.held = nil
		s.mu.Unlock()
		for _, next := range held {
			fn(req.Key, next)
		}
		return res, err
	}
	return s.Backend.Acquire(ctx, req)
}

// TestHandoffNoticeAfterLapse: the head's answers and its handoff notice
// are delayed (a slow network, a paused process) so that its next queue
// refresh reaches the store after the handed grant lapsed and is answered
// "queued" behind a new holder, and only then is the notice delivered. The
// notice is stale (the refresh's fence counter shows it) and must not make
// a lease. (Found by review: two live leases for ~650ms.)
func TestHandoffNoticeAfterLapse(t *testing.T) {
	srv := testserver.StartRedis(t)
	const ttl = 3 * time.Second
	opts := []dlock.Option{dlock.Fair(), dlock.WithTTL(ttl)}
	holderC := dlock.New(redislock.New(srv.Client(t)))
	defer holderC.Close()
	otherC := dlock.New(redislock.New(srv.Client(t)))
	defer otherC.Close()
	inner := redislock.New(srv.Client(t))
	start := time.Now()
	st := &lapseStore{Backend: inner, d1: 1650 * time.Millisecond, d2: 600 * time.Millisecond,
		log: func(f string, a ...any) {
			t.Logf("%v: "+f, append([]any{time.Since(start).Round(time.Millisecond)}, a...)...)
		}}
	c := dlock.New(st)
	defer c.Close()
	ctx := t.Context()
	hl, err := holderC.Mutex("k", opts...).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st.release = func() { _ = hl.Unlock(ctx) }

	// X: another owner that takes the lock once the handed grant lapsed.
	xl := make(chan *dlock.Lease, 1)
	var xmu sync.Mutex // W checks X's lease under it, so X cannot unlock in between
	go func() {
		for {
			l, err := otherC.Mutex("k", opts...).TryLock(ctx)
			if err == nil {
				st.log("X got the lock, fence %d", l.Fence())
				xl <- l
				// Hold it a while, long enough for W's stale notice to
				// arrive, then let W in.
				time.Sleep(time.Second)
				xmu.Lock()
				_ = l.Unlock(ctx)
				xmu.Unlock()
				return
			}
			if ctx.Err() != nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()

	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	l, err := c.Mutex("k", opts...).Lock(wctx)
	if err != nil {
		t.Fatal(err)
	}
	st.log("W's Lock returned fence %d, err %v", l.Fence(), l.Err())
	var x *dlock.Lease
	select {
	case x = <-xl:
	default:
	}
	xmu.Lock()
	overlap := x != nil && x.Err() == nil && l.Err() == nil
	xmu.Unlock()
	if x != nil && l.Fence() <= x.Fence() {
		t.Errorf("W's fence %d is not above X's %d: W holds a grant older than X's", l.Fence(), x.Fence())
	}
	if overlap {
		t.Errorf("two live leases: X fence %d, W fence %d", x.Fence(), l.Fence())
		for x.Err() == nil && l.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		st.log("overlap ended: W %v / X %v", l.Err(), x.Err())
	}
	_ = l.Unlock(ctx)
	if x != nil {
		_ = x.Unlock(ctx)
	}
}
