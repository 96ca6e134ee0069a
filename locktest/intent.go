package locktest

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// testIntentMoves checks driver.IntentMover, on backends that have it: a
// waiting writer's intent passes to another token, which keeps new readers
// out after the first token is released, and then is granted; a token that
// holds the lock exclusively gives another an intent the same way; a token
// with neither gives nothing.
func testIntentMoves(t *testing.T, s *Store) {
	b := s.NewBackend(t)
	mv, ok := b.(driver.IntentMover)
	if !ok {
		t.Log("the backend has no MoveIntent (driver.IntentMover is optional)")
		return
	}
	const key = "locktest/intent-moves"
	ctx := t.Context()
	req := func(token string, mode driver.Mode) driver.AcquireRequest {
		return driver.AcquireRequest{Key: key, Token: token, Owner: token, TTL: time.Minute, Mode: mode,
			Wait: mode == driver.Exclusive, QueueTTL: 30 * time.Second}
	}
	acquire := func(r driver.AcquireRequest) driver.AcquireResult {
		t.Helper()
		res, err := b.Acquire(ctx, r)
		if err != nil {
			t.Fatalf("Acquire %s: %v", r.Token, err)
		}
		return res
	}
	release := func(token string) {
		t.Helper()
		if _, err := b.Release(ctx, key, token); err != nil {
			t.Fatalf("Release %s: %v", token, err)
		}
	}
	move := func(from, to string, want bool) {
		t.Helper()
		if got, err := mv.MoveIntent(ctx, key, from, to, to, 30*time.Second); err != nil || got != want {
			t.Fatalf("MoveIntent(%s → %s) = %v, %v; want %v", from, to, got, err, want)
		}
	}
	readerRefused := func(token, what string) {
		t.Helper()
		if res := acquire(req(token, driver.Shared)); res.Acquired || !res.WriterWaiting || res.Holder != "w2" {
			t.Fatalf("reader %s = %+v, want refused by w2's intent", what, res)
		}
	}

	if !acquire(req("r", driver.Shared)).Acquired {
		t.Fatal("the first reader was refused")
	}
	if res := acquire(req("w1", driver.Exclusive)); res.Acquired || !res.Queued {
		t.Fatalf("writer w1 beside a reader = %+v, want refused with its intent", res)
	}
	move("w1", "w2", true)
	release("w1")
	readerRefused("x", "after w1 moved its intent and was released")
	if res := acquire(req("w1", driver.Exclusive)); res.Acquired || res.Queued {
		t.Errorf("w1 again = %+v, want refused without an intent (w2's is live)", res)
	}
	release("r")
	if res := acquire(req("w2", driver.Exclusive)); !res.Acquired {
		t.Fatalf("w2 once the reader left = %+v, want granted", res)
	}
	release("w2")

	// An exclusive holder gives an intent to the token that follows it.
	if !acquire(req("w2", driver.Exclusive)).Acquired {
		t.Fatal("w2 on a free lock was refused")
	}
	move("w3", "w4", false)
	move("w2", "w4", true)
	release("w2")
	if res := acquire(req("y", driver.Shared)); res.Acquired || !res.WriterWaiting || res.Holder != "w4" {
		t.Fatalf("reader after w2 gave its place to w4 = %+v, want refused by w4's intent", res)
	}
	if !acquire(req("w4", driver.Exclusive)).Acquired {
		t.Fatal("w4 was refused")
	}
	release("w4")
	release("w1")
	noLeftovers(t, s, key)
}
