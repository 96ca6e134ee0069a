package sqllock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	dldriver "github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/sqllock"
)

// TestLateAcquireAllAfterCleanupGrantsNothing: an AcquireAll of a token
// whose clean-up (a Release of every key with the token, as the Client
// sends after an attempt of unknown outcome) has run grants nothing, and
// neither does one whose COMMIT reaches the server after the clean-up
// went out: the clean-up drops what it granted.
func TestLateAcquireAllAfterCleanupGrantsNothing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		start  func(t *testing.T) lateEngine
		commit string // the driver's COMMIT on the wire, if it is held
	}{
		// go-sql-driver's Commit does not watch the context: a held
		// COMMIT would hang it, so MariaDB has the copy case only.
		{"mariadb", mariadbLate, ""},
		{"postgres", postgresLate, "Q\x00\x00\x00\x0bcommit\x00"}, // the simple protocol's
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := tc.start(t)
			ctx := t.Context()
			names := []string{"a", "b"}

			// A copy of the request that lands after the clean-up.
			b := sqllock.New(e.open(t, nil), e.dialect)
			const token = "late-token"
			reqs := make([]dldriver.AcquireRequest, len(names))
			for i, name := range names {
				if _, err := b.Release(ctx, name, token); err != nil {
					t.Fatal(err)
				}
				reqs[i] = dldriver.AcquireRequest{Key: name, Token: token, Owner: "late", TTL: time.Minute}
			}
			res, err := b.AcquireAll(ctx, reqs)
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range res {
				if r.Acquired {
					t.Errorf("AcquireAll after its clean-up: %q granted with fence %d, want nothing granted", names[i], r.Fence)
				}
			}
			other := newLateClient(t, e, e.open(t, nil))
			all, err := other.MultiAtOnce(names).TryLock(ctx)
			if err != nil {
				t.Fatalf("MultiAtOnce.TryLock after the late AcquireAll: %v, want the names free", err)
			}
			if err := all.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if tc.commit == "" {
				return
			}

			// A transaction whose COMMIT is held until the attempt gave up
			// and its clean-up went out, then let through.
			h := newHolder(tc.commit)
			late := newLateClient(t, e, e.open(t, h))
			tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				ml, err := late.MultiAtOnce(names, dlock.WithTTL(time.Minute)).TryLock(tctx)
				if ml != nil {
					_ = ml.Unlock(context.Background())
				}
				done <- err
			}()
			select {
			case <-h.held:
			case <-time.After(10 * time.Second):
				t.Fatal("the AcquireAll's COMMIT was never written")
			}
			if err := <-done; err == nil {
				t.Fatalf("MultiAtOnce.TryLock with its COMMIT held = %v, want an error", err)
			}
			close(h.let)
			select {
			case <-h.ran:
			case <-time.After(20 * time.Second):
				t.Fatal("the held COMMIT was never answered")
			}
			// The late grants had a minute to live: the names free up
			// within the wait only when the clean-up dropped them.
			all, err = other.MultiAtOnce(names, dlock.WithWait(20*time.Second)).Lock(ctx)
			if err != nil {
				t.Fatalf("MultiAtOnce.Lock after the late COMMIT landed: %v, want the names freed by the clean-up", err)
			}
			_ = all.Unlock(ctx)
		})
	}
}
