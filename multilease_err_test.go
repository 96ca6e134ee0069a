package dlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

// TestMultiErrAfterOneUnlock: once one lease of a MultiLease has been
// unlocked on its own (Unlock returned), the MultiLease has ended: its Err
// is ErrReleased and its Done is closed (MultiLease.Err's documentation).
func TestMultiErrAfterOneUnlock(t *testing.T) {
	c := dlock.New(memlock.New())
	defer c.Close()
	bad := 0
	for i := range 200 {
		ml, err := c.Multi([]string{"a", "b"}).TryLock(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if err := ml.Lease("a").Unlock(t.Context()); err != nil {
			t.Fatal(err)
		}
		if ml.Err() == nil {
			bad++
			if bad == 1 {
				t.Errorf("round %d: MultiLease.Err() = nil after its lease of a was unlocked", i)
			}
		}
		<-ml.Done()
		_ = ml.Unlock(t.Context())
	}
	if bad > 0 {
		t.Errorf("%d of 200 rounds reported the MultiLease held after one of its names was released", bad)
	}
}

// TestMultiErrAfterLoss: once a lease of a MultiLease has been lost
// (its Done is closed, its Err is a *LostError), the MultiLease must not go
// on reporting every name held: its Err is documented as "nil while every
// name is held".
func TestMultiErrAfterLoss(t *testing.T) {
	t.Parallel()
	store := memlock.New()
	c := dlock.New(store, dlock.WithTTL(60*time.Millisecond))
	defer c.Close()
	bad := 0
	const rounds = 20
	for i := range rounds {
		ml, err := c.Multi([]string{"a", "b"}).TryLock(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := store.ForceRelease(t.Context(), "a"); err != nil {
			t.Fatal(err)
		}
		a := ml.Lease("a")
		select {
		case <-a.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("the lease of a was not lost")
		}
		if !errors.Is(a.Err(), dlock.ErrLost) {
			t.Fatalf("a.Err() = %v, want ErrLost", a.Err())
		}
		if ml.Err() == nil || ml.Context().Err() == nil {
			bad++
			if bad == 1 {
				t.Errorf("round %d: a is lost (%v) but MultiLease.Err() = %v, Context().Err() = %v", i, a.Err(), ml.Err(), ml.Context().Err())
			}
		}
		<-ml.Done()
		_ = ml.Unlock(t.Context())
	}
	if bad > 0 {
		t.Errorf("%d of %d rounds reported the MultiLease held after one of its names was lost", bad, rounds)
	}
}
