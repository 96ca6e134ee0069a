package dlock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memlock"
)

// faulty is a memlock store with faults a real store shows only by chance:
// answers lost after the store acted, and calls that hang.
type faulty struct {
	*memlock.Backend
	loseAcquireAnswer atomic.Bool   // Acquire acts, then reports an error
	hangAcquire       atomic.Bool   // Acquire waits for its context to end
	renewGate         chan struct{} // when non-nil, Renew waits for it
	acquires          atomic.Int64
}

var errLostAnswer = errors.New("faulty: connection reset after the command ran")

func newFaulty() *faulty { return &faulty{Backend: memlock.New()} }

func (f *faulty) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	f.acquires.Add(1)
	if f.hangAcquire.Load() {
		<-ctx.Done()
		return driver.AcquireResult{}, ctx.Err()
	}
	res, err := f.Backend.Acquire(ctx, req)
	if err == nil && f.loseAcquireAnswer.Load() {
		return driver.AcquireResult{}, errLostAnswer
	}
	return res, err
}

func (f *faulty) Renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	if f.renewGate != nil {
		select {
		case <-f.renewGate:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	return f.Backend.Renew(ctx, key, token, ttl)
}

// RenewGrant is the renewal the client sends (memlock ties renewals to
// their grant); it waits for renewGate as Renew does.
func (f *faulty) RenewGrant(ctx context.Context, key, token string, fence uint64, ttl time.Duration) (bool, error) {
	if f.renewGate != nil {
		select {
		case <-f.renewGate:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	return f.Backend.RenewGrant(ctx, key, token, fence, ttl)
}

func held(t *testing.T, b *memlock.Backend, key string) driver.LockInfo {
	t.Helper()
	info, ok, err := b.Inspect(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return driver.LockInfo{}
	}
	return info
}

type zeroDelay struct{}

func (zeroDelay) Delay(int) time.Duration { return 0 }

// slowAcquire is a memlock store whose acquires answer after a delay, as a
// store far away or overloaded would, and that counts releases per token.
type slowAcquire struct {
	*memlock.Backend
	delay    atomic.Int64 // time.Duration
	mu       sync.Mutex
	released map[string]int
	granted  []string // tokens granted, in order
}

func newSlowAcquire(d time.Duration) *slowAcquire {
	s := &slowAcquire{Backend: memlock.New(), released: make(map[string]int)}
	s.delay.Store(int64(d))
	return s
}

func (s *slowAcquire) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	res, err := s.Backend.Acquire(ctx, req)
	if err == nil && res.Acquired {
		s.mu.Lock()
		s.granted = append(s.granted, req.Token)
		s.mu.Unlock()
	}
	time.Sleep(time.Duration(s.delay.Load()))
	return res, err
}

func (s *slowAcquire) Release(ctx context.Context, key, token string) (driver.ReleaseResult, error) {
	return s.count(token)(s.Backend.Release(ctx, key, token))
}

// ReleaseGrant is the release the client sends for a grant (memlock ties
// releases to their grant), counted as Release is.
func (s *slowAcquire) ReleaseGrant(ctx context.Context, key, token string, fence uint64) (driver.ReleaseResult, error) {
	return s.count(token)(s.Backend.ReleaseGrant(ctx, key, token, fence))
}

// count returns what counts a release of token that held.
func (s *slowAcquire) count(token string) func(driver.ReleaseResult, error) (driver.ReleaseResult, error) {
	return func(res driver.ReleaseResult, err error) (driver.ReleaseResult, error) {
		if res.Held {
			s.mu.Lock()
			s.released[token]++
			s.mu.Unlock()
		}
		return res, err
	}
}

// troubled is a memlock store, seen by one Client, that meets one fault on
// demand on an exclusive acquire: an answer lost after the store acted (a
// transient error), or a grant answered late. Every acquire after the
// fault is slow (the store is still in trouble), which leaves others the
// time to get in wherever the client lets them. answered sees every answer.
type troubled struct {
	*memlock.Backend
	loseNext  atomic.Bool  // the next exclusive acquire fails after acting
	lateGrant atomic.Int64 // the next exclusive grant is answered this late
	slow      time.Duration
	fired     chan struct{} // closed when the fault was met
	once      sync.Once
	after     atomic.Bool // the fault was met
	answered  func(driver.AcquireRequest, driver.AcquireResult)
}

func newTroubled(store *memlock.Backend, slow time.Duration) *troubled {
	return &troubled{Backend: store, slow: slow, fired: make(chan struct{})}
}

func (s *troubled) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	if s.after.Load() {
		time.Sleep(s.slow)
	}
	res, err := s.Backend.Acquire(ctx, req)
	if err == nil && s.answered != nil {
		s.answered(req, res)
	}
	if err != nil || req.Mode != driver.Exclusive {
		return res, err
	}
	if s.loseNext.CompareAndSwap(true, false) {
		s.fire()
		return driver.AcquireResult{}, driver.Transient(errLostAnswer)
	}
	if d := s.lateGrant.Load(); d > 0 && res.Acquired && s.lateGrant.CompareAndSwap(d, 0) {
		time.Sleep(time.Duration(d))
		s.fire()
	}
	return res, err
}

func (s *troubled) fire() {
	s.once.Do(func() {
		s.after.Store(true)
		close(s.fired)
	})
}

// moving is a troubled store whose MoveIntent is replaced by move, when
// set, and counts its calls.
type moving struct {
	*troubled
	move  func(ctx context.Context, key, from, to, owner string, ttl time.Duration) (bool, error)
	moves atomic.Int64
}

func (s *moving) MoveIntent(ctx context.Context, key, from, to, owner string, ttl time.Duration) (bool, error) {
	s.moves.Add(1)
	if s.move != nil {
		return s.move(ctx, key, from, to, owner, ttl)
	}
	return s.troubled.MoveIntent(ctx, key, from, to, owner, ttl)
}
