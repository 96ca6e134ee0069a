package etcdlock_test

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/test/testserver"
)

// TestAcquireAllAfterCleanupGrantsNothing checks that an AcquireAll that
// lands after the client released its token on every key (the clean-up
// of an attempt whose answer was lost) grants none of them, and that the
// same keys are granted together to a fresh token.
func TestAcquireAllAfterCleanupGrantsNothing(t *testing.T) {
	srv := testserver.StartEtcd(t)
	b := etcdlock.New(srv.Client(t))
	reqs := func(token string) []driver.AcquireRequest {
		return []driver.AcquireRequest{
			{Key: "a", Token: token, Owner: "o", TTL: 5 * time.Second},
			{Key: "b", Token: token, Owner: "o", TTL: 5 * time.Second},
		}
	}
	for _, key := range []string{"a", "b"} {
		if _, err := b.Release(t.Context(), key, "late"); err != nil {
			t.Fatal(err)
		}
	}
	res, err := b.AcquireAll(t.Context(), reqs("late"))
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Acquired {
			t.Errorf("late AcquireAll granted key %d: %+v", i, r)
		}
	}
	res, err = b.AcquireAll(t.Context(), reqs("fresh"))
	if err != nil || len(res) != 2 || !res[0].Acquired || !res[1].Acquired || res[0].Fence != res[1].Fence {
		t.Fatalf("AcquireAll of a fresh token = %+v, %v; want both granted, one revision", res, err)
	}
}
