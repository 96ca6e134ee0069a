package redislock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// drainRaceBackend is a real Backend whose next Acquire, when asked, runs
// on the store and then reports an error (a lost answer), and whose next
// tied renewal, when armed, waits for resume after telling entered.
type drainRaceBackend struct {
	*redislock.Backend
	loseNext   atomic.Bool
	renewArmed atomic.Bool
	entered    chan struct{}
	resume     chan struct{}
}

func (b *drainRaceBackend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	res, err := b.Backend.Acquire(ctx, req)
	if b.loseNext.CompareAndSwap(true, false) {
		return driver.AcquireResult{}, errors.New("injected: the answer was lost")
	}
	return res, err
}

func (b *drainRaceBackend) RenewGrant(ctx context.Context, key, token string, fence uint64, ttl time.Duration) (bool, error) {
	if b.renewArmed.CompareAndSwap(true, false) {
		close(b.entered)
		<-b.resume
	}
	return b.Backend.RenewGrant(ctx, key, token, fence, ttl)
}

// TestDrainTakesLockMadeBeforeGate: the gate of bf991b4 only keeps a
// Lock of the same reentrant handle out while the last Unlock releases; a
// Lock that reaches the store after the Unlock dropped its last lease (the
// grant has ended, so the Lock does not join it) but before the Unlock
// takes the gate (here: while the Unlock waits for a renewal in flight)
// adds a hold to the same store grant, under the same fence, and the
// Unlock's drain of the uncertain grant releases it. The Lock's caller holds
// a lease for a lock that the store has freed: another owner gets it.
func TestDrainTakesLockMadeBeforeGate(t *testing.T) {
	t.Run("same-grant", func(t *testing.T) { drainRace(t, false) })
	// The store lost the grant: the Lock makes a fresh grant (a new fence)
	// of the handle's token, and the Unlock's untied orphan release drops it.
	t.Run("orphan-release", func(t *testing.T) { drainRace(t, true) })
}

func drainRace(t *testing.T, broken bool) {
	srv := testserver.StartRedis(t)
	b := &drainRaceBackend{Backend: redislock.New(srv.Client(t)), entered: make(chan struct{}), resume: make(chan struct{})}
	c := dlock.New(b, dlock.WithTTL(5*time.Second))
	defer c.Close()
	other := dlock.New(redislock.New(srv.Client(t)), dlock.WithTTL(5*time.Second))
	defer other.Close()
	ctx := t.Context()
	const name = "review/drain-race"
	m := c.Mutex(name, dlock.Reentrant())
	first, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b.loseNext.Store(true)
	if _, err := m.Lock(ctx); err == nil {
		t.Fatal("the re-entry whose answer was lost succeeded")
	}
	// The grant is uncertain now: its last Unlock drains the extra hold.

	b.renewArmed.Store(true)
	refreshed := make(chan error, 1)
	go func() { refreshed <- first.Refresh(ctx) }()
	<-b.entered // a renewal of the grant is in flight
	if broken {
		if _, _, err := b.ForceRelease(ctx, name); err != nil {
			t.Fatal(err)
		}
	}

	unlocked := make(chan error, 1)
	go func() { unlocked <- first.Unlock(context.Background()) }()
	time.Sleep(100 * time.Millisecond) // the Unlock dropped the last lease and waits for the renewal

	// Before the fix this Lock found the grant ended and added a hold under
	// its fence at once; now it waits for the Unlock to finish.
	locked := make(chan *dlock.Lease, 1)
	go func() {
		l, err := m.Lock(ctx)
		if err != nil {
			t.Errorf("the second Lock: %v", err)
		}
		locked <- l
	}()
	time.Sleep(100 * time.Millisecond)
	close(b.resume)
	second := <-locked
	if second == nil {
		return
	}
	<-refreshed
	if err := <-unlocked; err != nil && !(broken && errors.Is(err, dlock.ErrNotHeld)) {
		t.Fatalf("the last Unlock: %v", err)
	}
	defer second.Unlock(context.Background())
	if err := second.Err(); err != nil {
		t.Fatalf("the second lease has ended: %v", err)
	}
	if l, err := other.Mutex(name).TryLock(ctx); err == nil {
		defer l.Unlock(context.Background())
		t.Fatalf("another owner obtained the lock (fence %d) while the handle's second Lock holds it with fence %d and no error", l.Fence(), second.Fence())
	}
}
