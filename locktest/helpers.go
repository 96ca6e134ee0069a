package locktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// client returns a Client on a new backend of s, closed at cleanup.
func client(t *testing.T, s *Store, opts ...dlock.Option) *dlock.Client {
	t.Helper()
	return clientOn(t, s.NewBackend(t), opts...)
}

func clientOn(t *testing.T, b driver.Backend, opts ...dlock.Option) *dlock.Client {
	t.Helper()
	c := dlock.New(b, opts...)
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Logf("closing client: %v", err)
		}
	})
	return c
}

func lock(t *testing.T, m *dlock.Mutex) *dlock.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	l, err := m.Lock(ctx)
	if err != nil {
		t.Fatalf("Lock(%q): %v", m.Name(), err)
	}
	return l
}

func unlock(t *testing.T, l *dlock.Lease) {
	t.Helper()
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatalf("Unlock(%q): %v", l.Name(), err)
	}
}

// mustBeHeldByOther checks that a TryLock on m fails because someone holds it.
func mustBeHeldByOther(t *testing.T, m *dlock.Mutex) {
	t.Helper()
	l, err := m.TryLock(t.Context())
	if err == nil {
		_ = l.Unlock(t.Context())
		t.Fatalf("TryLock(%q) succeeded while another owner held the lock", m.Name())
	}
	if !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock(%q) = %v, want ErrNotObtained", m.Name(), err)
	}
}

// endWait bounds the wait for a lease that ends by itself (its deadline
// passes unrenewed, or a renewal finds it gone): what is checked is that it
// ends, and why; a loaded machine may run the lease's timers late.
const endWait = 10 * time.Second

// waitDone waits up to limit for the lease to end and returns how long it took.
func waitDone(t *testing.T, l *dlock.Lease, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-l.Done():
		return time.Since(start)
	case <-time.After(limit):
		t.Fatalf("lease %q still held after %v (Err = %v)", l.Name(), limit, l.Err())
		return 0
	}
}

func lostReason(t *testing.T, err error) dlock.LostReason {
	t.Helper()
	var lost *dlock.LostError
	if !errors.As(err, &lost) || !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("Err() = %v, want a *LostError", err)
	}
	return lost.Reason
}
