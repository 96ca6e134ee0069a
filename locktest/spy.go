package locktest

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// spy wraps a backend, counts its calls and checks that no renewal of a token
// starts after that token's release has started.
type spy struct {
	inner driver.Backend

	mu         sync.Mutex
	acquires   int
	renews     int
	releasing  map[string]bool // tokens whose release started
	lateRenews int             // renewals that started after the token's release
}

var (
	_ driver.Backend      = (*spy)(nil)
	_ driver.Notifier     = (*spy)(nil)
	_ driver.BatchRenewer = (*spy)(nil)
)

func newSpy(inner driver.Backend) *spy {
	return &spy{inner: inner, releasing: make(map[string]bool)}
}

func (s *spy) counts() (acquires, renews, late int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.acquires, s.renews, s.lateRenews
}

func (s *spy) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	s.mu.Lock()
	s.acquires++
	delete(s.releasing, req.Token) // a token may be used again (reentrant handles)
	s.mu.Unlock()
	return s.inner.Acquire(ctx, req)
}

func (s *spy) noteRenew(token string) {
	s.mu.Lock()
	s.renews++
	if s.releasing[token] {
		s.lateRenews++
	}
	s.mu.Unlock()
}

func (s *spy) Renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	s.noteRenew(token)
	return s.inner.Renew(ctx, key, token, ttl)
}

func (s *spy) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) []driver.RenewResult {
	for _, r := range reqs {
		s.noteRenew(r.Token)
	}
	if b, ok := s.inner.(driver.BatchRenewer); ok {
		return b.RenewBatch(ctx, reqs)
	}
	out := make([]driver.RenewResult, len(reqs))
	for i, r := range reqs {
		out[i].Held, out[i].Err = s.inner.Renew(ctx, r.Key, r.Token, r.TTL)
	}
	return out
}

func (s *spy) Release(ctx context.Context, key, token string) (driver.ReleaseResult, error) {
	s.mu.Lock()
	s.releasing[token] = true
	s.mu.Unlock()
	return s.inner.Release(ctx, key, token)
}

func (s *spy) Listen(ctx context.Context, fn func(string, string)) (driver.Listener, error) {
	if n, ok := s.inner.(driver.Notifier); ok {
		return n.Listen(ctx, fn)
	}
	return nil, errors.New("locktest: backend has no notifications")
}

func (s *spy) Withdraw(ctx context.Context, key, token string) error {
	if w, ok := s.inner.(driver.Withdrawer); ok {
		return w.Withdraw(ctx, key, token)
	}
	return driver.ErrUnsupported
}
