package redislock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
	"github.com/redis/go-redis/v9"
)

// TestLockIgnoresCtxBehindHungUnlock: since bf991b4 every acquire
// of a fixed-token handle (WithOwnerID, Reentrant) takes handle.gate for
// reading, and the last release holds it for writing for as long as the
// store takes to answer. A Redis that hangs (paused here) holds an Unlock
// up; a TryLock or Lock of the same handle with a short context now waits
// for that Unlock instead of returning at its deadline ("promptly", says
// Mutex.Lock): gate.RLock does not watch ctx (nor Close).
func TestLockIgnoresCtxBehindHungUnlock(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  dlock.Option
	}{
		{"owner-id", dlock.WithOwnerID("review-owner")},
		{"reentrant", dlock.Reentrant()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := testserver.StartRedis(t)
			// As redislock.New asks: context deadlines on the socket.
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = rdb.Close() })
			c := dlock.New(redislock.New(rdb), dlock.WithTTL(5*time.Second))
			m := c.Mutex("review/gate", tc.opt)
			l, err := m.Lock(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			srv.Pause(t)
			unlockCtx, cancelUnlock := context.WithTimeout(context.Background(), 4*time.Second)
			defer cancelUnlock()
			unlocked := make(chan error, 1)
			go func() { unlocked <- l.Unlock(unlockCtx) }()
			time.Sleep(100 * time.Millisecond) // the Unlock holds the gate, its release unanswered

			const wait = 300 * time.Millisecond
			ctx, cancel := context.WithTimeout(t.Context(), wait)
			defer cancel()
			start := time.Now()
			_, err = m.Lock(ctx)
			took := time.Since(start)
			srv.Resume(t)
			<-unlocked
			_ = c.Close()
			if err == nil {
				t.Fatal("Lock succeeded against a paused store")
			}
			if took > wait+time.Second {
				t.Errorf("Lock with a %v context returned after %v (%v): it waited for the hung Unlock's release", wait, took.Round(time.Millisecond), errors.Unwrap(err))
			}
		})
	}
}

// TestUnlockIgnoresCtxBehindHungReentry is the other side of the
// gate: a re-entry is sent without ctx's cancellation, bounded only by the
// TTL, and holds gate.RLock for its round trip. An Unlock of the handle's
// last lease meanwhile (the re-entry has not joined yet) waits for the
// gate, for as long as the re-entry hangs on a store that does not answer,
// whatever its own context says.
func TestUnlockIgnoresCtxBehindHungReentry(t *testing.T) {
	srv := testserver.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	c := dlock.New(redislock.New(rdb), dlock.WithTTL(5*time.Second))
	m := c.Mutex("review/gate-unlock", dlock.Reentrant())
	l, err := m.Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	srv.Pause(t)
	reentered := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		_, err := m.Lock(ctx) // a re-entry: sent without ctx, bounded by the TTL
		reentered <- err
	}()
	time.Sleep(100 * time.Millisecond)

	const wait = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	start := time.Now()
	err = l.Unlock(ctx)
	took := time.Since(start)
	srv.Resume(t)
	<-reentered
	_ = c.Close()
	if took > wait+time.Second {
		t.Errorf("Unlock with a %v context returned after %v (%v): it waited for the hung re-entry", wait, took.Round(time.Millisecond), err)
	}
}
