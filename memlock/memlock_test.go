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
		return &locktest.Store{
			NewBackend: func(*testing.T) driver.Backend { return b },
			Delete: func(t *testing.T, key string) {
				if _, ok, err := b.ForceRelease(t.Context(), key); err != nil || !ok {
					t.Fatalf("ForceRelease(%q) = %v, %v", key, ok, err)
				}
			},
			Leftovers: func(t *testing.T, key string) []string {
				if _, ok, _ := b.Inspect(t.Context(), key); ok {
					return []string{key}
				}
				return nil
			},
			Kill: func(*testing.T) { b.SetUnavailable(errors.New("memlock: store down (test)")) },
		}
	})
}
