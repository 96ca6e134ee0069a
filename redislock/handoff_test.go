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

// gatedStore orders two concurrent fair first tries of one Client: the
// first to arrive (B) is queued first; the second (A) is answered first, so
// A takes the gate and B is gated. B's answer is held until A has
// subscribed and tried again; then the holder releases (the lock is handed
// to B, which is not registered yet: h.handed), and B's answer is returned.
type gatedStore struct {
	*redislock.Backend
	mu         sync.Mutex
	tokens     []string
	arrived    chan struct{}
	bForwarded chan struct{}
	aSecond    chan struct{}
	release    func()
	aDone      bool
}

func (s *gatedStore) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	if !req.Handoff {
		return s.Backend.Acquire(ctx, req)
	}
	s.mu.Lock()
	idx := -1
	for i, tk := range s.tokens {
		if tk == req.Token {
			idx = i
		}
	}
	first := idx < 0
	if first {
		s.tokens = append(s.tokens, req.Token)
		idx = len(s.tokens) - 1
		if len(s.tokens) == 2 {
			close(s.arrived)
		}
	}
	s.mu.Unlock()
	switch {
	case first && idx == 0: // B
		<-s.arrived
		res, err := s.Backend.Acquire(ctx, req)
		close(s.bForwarded)
		<-s.aSecond
		s.release()
		time.Sleep(300 * time.Millisecond) // the notice "next:B\0f" is heard
		return res, err
	case first && idx == 1: // A
		<-s.arrived
		<-s.bForwarded
		return s.Backend.Acquire(ctx, req)
	case idx == 1: // A again, after subscribing
		res, err := s.Backend.Acquire(ctx, req)
		s.mu.Lock()
		if !s.aDone {
			s.aDone = true
			close(s.aSecond)
		}
		s.mu.Unlock()
		return res, err
	}
	return s.Backend.Acquire(ctx, req)
}

// TestHandoffGatedWaiterStaleNotice: two Lock calls of one Client both
// queue; the second to answer takes the Client's gate, and the other, gated,
// gives its place back. A handoff announced to the gated waiter's token
// before its clean-up released that grant must not become a lease: the
// gated waiter goes on with a token of its own and claims nothing stale.
// (Found by review: two live leases, fences 2 and 3.)
func TestHandoffGatedWaiterStaleNotice(t *testing.T) {
	srv := testserver.StartRedis(t)
	holderC := dlock.New(redislock.New(srv.Client(t)))
	defer holderC.Close()
	inner := redislock.New(srv.Client(t))
	st := &gatedStore{Backend: inner, arrived: make(chan struct{}), bForwarded: make(chan struct{}), aSecond: make(chan struct{})}
	c := dlock.New(st)
	defer c.Close()
	ctx := t.Context()
	opts := []dlock.Option{dlock.Fair(), dlock.WithTTL(3 * time.Second)}
	hl, err := holderC.Mutex("k", opts...).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st.release = func() { _ = hl.Unlock(ctx) }
	type out struct {
		l   *dlock.Lease
		err error
		at  time.Time
	}
	outs := make(chan out, 2)
	for range 2 {
		go func() {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			l, err := c.Mutex("k", opts...).Lock(wctx)
			outs <- out{l, err, time.Now()}
		}()
	}
	o1 := <-outs
	if o1.err != nil {
		t.Fatalf("first Lock: %v", o1.err)
	}
	// While the first holds the lock, the second must still wait.
	select {
	case o2 := <-outs:
		if o2.err == nil {
			info, _, _ := inner.Inspect(ctx, "k")
			if o1.l.Err() == nil && o2.l.Err() == nil {
				t.Errorf("two live leases on one lock at once: fences %d and %d (store: %+v)", o1.l.Fence(), o2.l.Fence(), info)
			}
			_ = o2.l.Unlock(ctx)
		}
		_ = o1.l.Unlock(ctx)
		return
	case <-time.After(time.Second):
	}
	_ = o1.l.Unlock(ctx)
	o2 := <-outs
	if o2.err != nil {
		t.Fatalf("second Lock after the first unlocked: %v", o2.err)
	}
	if o2.l.Fence() <= o1.l.Fence() {
		t.Errorf("second fence %d, not above the first's %d", o2.l.Fence(), o1.l.Fence())
	}
	_ = o2.l.Unlock(ctx)
}
