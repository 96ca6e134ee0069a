package locktest

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// testOwnerIDRegranted checks renewals and releases tied to their grant
// (driver.GrantRenewer, driver.GrantReleaser), on backends that have them.
// Two processes share an owner ID; the store loses the first one's grant
// and grants the lock to the second, with the same token. The first
// process's Unlock must not drop the second one's hold, and its renewal
// must not extend it: its lease is lost, and it is told (before, its
// renewals went on, with a fence the protected resource now refuses).
func testOwnerIDRegranted(t *testing.T, s *Store) {
	b := s.NewBackend(t)
	_, renews := b.(driver.GrantRenewer)
	_, releases := b.(driver.GrantReleaser)
	if !renews || !releases {
		t.Log("the backend does not tie renewals and releases to a grant (driver.GrantRenewer, driver.GrantReleaser are optional)")
		return
	}
	const id = "locktest-shared-owner"
	x, y, z := client(t, s), client(t, s), client(t, s)
	opts := []dlock.Option{dlock.WithOwnerID(id), dlock.WithTTL(ttl)}
	manual := append(opts, dlock.WithAutoRenew(false))

	// Unlock of a grant the store lost.
	const name = "locktest/owner-regranted"
	lx := lock(t, x.Mutex(name, manual...))
	s.Delete(t, name)
	ly := lock(t, y.Mutex(name, opts...))
	if ly.Fence() <= lx.Fence() {
		t.Fatalf("fence %d after %d, want greater", ly.Fence(), lx.Fence())
	}
	if err := lx.Unlock(t.Context()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Unlock of the lost grant = %v, want ErrNotHeld", err)
	}
	mustBeHeldByOther(t, z.Mutex(name))
	time.Sleep(ttl / 2) // a renewal of the second grant
	if err := ly.Err(); err != nil {
		t.Fatalf("the second process's lease ended: %v", err)
	}
	mustBeHeldByOther(t, z.Mutex(name))
	unlock(t, ly)

	// Refresh of a grant the store lost.
	const name2 = "locktest/owner-regranted-refresh"
	lx = lock(t, x.Mutex(name2, manual...))
	s.Delete(t, name2)
	ly = lock(t, y.Mutex(name2, opts...))
	if err := lx.Refresh(t.Context()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Refresh of the lost grant = %v, want ErrNotHeld", err)
	}
	if r := lostReason(t, lx.Err()); r != dlock.LostMissing {
		t.Errorf("reason = %v, want %v", r, dlock.LostMissing)
	}
	if err := ly.Err(); err != nil {
		t.Fatalf("the second process's lease ended: %v", err)
	}
	mustBeHeldByOther(t, z.Mutex(name2))
	unlock(t, ly)

	// Automatic renewals, which go out in batches: the lease whose grant
	// the store lost is lost; its neighbour in the batch is not.
	const name3 = "locktest/owner-regranted-batch"
	lost := lock(t, x.Mutex(name3, opts...))
	kept := lock(t, x.Mutex(name3+"-kept", opts...))
	s.Delete(t, name3)
	ly = lock(t, y.Mutex(name3, opts...))
	waitDone(t, lost, ttl/3+ttl/4)
	if r := lostReason(t, lost.Err()); r != dlock.LostMissing {
		t.Errorf("reason = %v, want %v", r, dlock.LostMissing)
	}
	if err := kept.Err(); err != nil {
		t.Errorf("the other lease of the batch ended: %v", err)
	}
	if err := ly.Err(); err != nil {
		t.Fatalf("the second process's lease ended: %v", err)
	}
	mustBeHeldByOther(t, z.Mutex(name3))
	unlock(t, ly)
	unlock(t, kept)
}
