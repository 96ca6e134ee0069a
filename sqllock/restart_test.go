package sqllock_test

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// testFencesSurviveRestart grants, releases, restarts the server (cleanly,
// then by a crash) and grants again: the fence must still grow, because the
// row keeps it in the database.
func testFencesSurviveRestart(t *testing.T, newDB newDatabase, stop, start, kill func(testing.TB)) {
	db := newDB(t)
	b := db.backend(t)
	var last uint64
	grant := func(what string) {
		t.Helper()
		tok := newToken()
		var res driver.AcquireResult
		var err error
		// The pool's old connections died with the server; database/sql
		// retries a bad connection, but give the server a moment too.
		for range 50 {
			if res, err = b.Acquire(t.Context(), driver.AcquireRequest{Key: "k", Token: tok, Owner: "o", TTL: time.Minute}); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil || !res.Acquired {
			t.Fatalf("%s: Acquire = %+v, %v", what, res, err)
		}
		if res.Fence <= last {
			t.Fatalf("%s: fence %d after %d, want larger", what, res.Fence, last)
		}
		last = res.Fence
		if r, err := b.Release(t.Context(), "k", tok); err != nil || !r.Held {
			t.Fatalf("%s: Release = %+v, %v", what, r, err)
		}
	}
	grant("first grant")
	grant("second grant")
	stop(t)
	start(t)
	grant("after a clean restart")
	kill(t)
	start(t)
	grant("after a crash")
}
