package memlock_test

import (
	"errors"
	"testing"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/locktest"
	"github.com/dlock-go/dlock/memlock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	locktest.Run(t, func(t *testing.T) *locktest.Store {
		b := memlock.New()
		return store(b, func() driver.Backend { return b })
	})
}

// TestConformancePolled runs the suite on a memlock without notifications,
// as on SQLite: waiters of every kind poll.
func TestConformancePolled(t *testing.T) {
	locktest.Run(t, func(t *testing.T) *locktest.Store {
		b := memlock.New()
		return store(b, func() driver.Backend { return polled{b, b, b, b, b, b, b} })
	})
}

// polled is a memlock without driver.Notifier.
type polled struct {
	driver.Backend
	driver.Capabler
	driver.Inspector
	driver.BatchRenewer
	driver.Withdrawer
	driver.MultiAcquirer
	driver.Proclaimer
}

// TestConformanceBasic runs the suite on a memlock that shows only
// driver.Backend: no notifications (waiters poll), no inspection, no
// lock-delay and none of the optional lock kinds, which the client must
// then refuse. It checks that the suite holds for such stores too.
func TestConformanceBasic(t *testing.T) {
	locktest.Run(t, func(t *testing.T) *locktest.Store {
		b := memlock.New()
		return store(b, func() driver.Backend { return basic{b} })
	})
}

// basic hides every optional interface of a backend.
type basic struct{ driver.Backend }

// store is the locktest hooks for b, whose clients see it through view.
func store(b *memlock.Backend, view func() driver.Backend) *locktest.Store {
	return &locktest.Store{
		NewBackend: func(*testing.T) driver.Backend { return view() },
		Delete: func(t *testing.T, key string) {
			if _, ok, err := b.ForceRelease(t.Context(), key); err != nil || !ok {
				t.Fatalf("ForceRelease(%q) = %v, %v", key, ok, err)
			}
		},
		Leftovers: func(_ *testing.T, key string) []string { return memlock.Leftovers(b, key) },
		Kill:      func(*testing.T) { b.SetUnavailable(errors.New("store down (test)")) },
	}
}
