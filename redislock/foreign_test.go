package redislock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/redlock"
)

// A namespace with a brace would move the Cluster hash tag, so that every
// script fails with CROSSSLOT: New takes it, and every call says why.
func TestNamespaceWithBraceRefused(t *testing.T) {
	srv := testserver.StartRedis(t)
	for _, ns := range []string{"app{}", "a{b", "}"} {
		b := redislock.New(srv.Client(t), redislock.WithNamespace(ns))
		c := dlock.New(b)
		if _, err := c.Mutex("x").TryLock(t.Context()); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("namespace %q: TryLock = %v, want ErrInvalid", ns, err)
		}
		if _, _, err := b.Inspect(t.Context(), "x"); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("namespace %q: Inspect = %v, want ErrInvalid", ns, err)
		}
		if _, err := b.Listen(t.Context(), func(string, string) {}); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("namespace %q: Listen = %v, want ErrInvalid", ns, err)
		}
		_ = c.Close()
	}
}

// Another program's value under a lock's key (SET dlock:{x} ...) is
// reported as such, typed, by every operation, not as Redis's bare
// WRONGTYPE (or, on Redlock, a quorum error that hides it).
func TestForeignValueExplained(t *testing.T) {
	srv := testserver.StartRedis(t)
	admin := srv.Client(t)
	b := redislock.New(srv.Client(t))
	c := dlock.New(b)
	defer c.Close()

	if err := admin.Set(t.Context(), "dlock:{taken}", "someone else's", 0).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := c.Mutex("taken").TryLock(t.Context())
	var fe *redislock.ForeignValueError
	if !errors.Is(err, redislock.ErrForeignValue) || !errors.As(err, &fe) || fe.Key != "taken" {
		t.Errorf("TryLock over a foreign value = %v, want a ForeignValueError", err)
	}
	if _, _, err := b.Inspect(t.Context(), "taken"); !errors.Is(err, redislock.ErrForeignValue) {
		t.Errorf("Inspect = %v, want ErrForeignValue", err)
	}

	// Overwritten while held: Unlock says what happened.
	l, err := c.Mutex("held").Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Set(t.Context(), "dlock:{held}", "overwritten", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// Whatever the value is, the lock is not held: ErrNotHeld matches too,
	// and ErrForeignValue says why.
	if err := l.Unlock(t.Context()); !errors.Is(err, redislock.ErrForeignValue) || !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Unlock of a lock overwritten by another program = %v, want ErrForeignValue and ErrNotHeld", err)
	}
	if _, err := b.Acquire(t.Context(), driver.AcquireRequest{Key: "taken", Token: "t", Owner: "o", TTL: time.Second}); errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("an acquire over a foreign value matches ErrNotHeld: %v", err)
	}

	// Redlock: the quorum error lets the cause through.
	var nodes []redis.UniversalClient
	for range 3 {
		n := testserver.StartRedis(t).Client(t)
		if err := n.Set(t.Context(), "dlock:{taken}", "someone else's", 0).Err(); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	rl, err := redlock.New(nodes)
	if err != nil {
		t.Fatal(err)
	}
	rc := dlock.New(rl)
	defer rc.Close()
	if _, err := rc.Mutex("taken").TryLock(t.Context()); !errors.Is(err, redislock.ErrForeignValue) {
		t.Errorf("Redlock TryLock over foreign values = %v, want ErrForeignValue", err)
	}
}
