package redislock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// TestUnlockCutWhileRenewingLeavesHold: bf991b4 marks the handle
// uncertain when the last release of a reentrant grant fails, so that its
// next grant, which may join the hold left on the store, drains it. An
// Unlock whose context ends while it waits for a renewal in flight returns
// without sending any release and without marking the handle: the hold
// stays, the next Lock joins it (same fence, one more hold), and that
// Lock's Unlock releases one hold and returns nil while the lock stays
// held on the store, renewed by nobody, for a TTL.
func TestUnlockCutWhileRenewingLeavesHold(t *testing.T) {
	srv := testserver.StartRedis(t)
	b := &drainRaceBackend{Backend: redislock.New(srv.Client(t)), entered: make(chan struct{}), resume: make(chan struct{})}
	c := dlock.New(b, dlock.WithTTL(5*time.Second))
	defer c.Close()
	other := dlock.New(redislock.New(srv.Client(t)), dlock.WithTTL(5*time.Second))
	defer other.Close()
	ctx := t.Context()
	const name = "review/unlock-cut"
	m := c.Mutex(name, dlock.Reentrant())
	first, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b.renewArmed.Store(true)
	refreshed := make(chan error, 1)
	go func() { refreshed <- first.Refresh(ctx) }()
	<-b.entered // a renewal is in flight

	cut, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := first.Unlock(cut); err == nil {
		t.Fatal("the Unlock cut short by its context reported success")
	}
	close(b.resume)
	<-refreshed

	second, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Unlock(ctx); err != nil {
		t.Fatalf("the second Unlock: %v", err)
	}
	if l, err := other.Mutex(name).TryLock(ctx); err != nil {
		t.Fatalf("after the handle's last Unlock returned nil, another owner cannot lock: %v", err)
	} else {
		_ = l.Unlock(ctx)
	}
}
