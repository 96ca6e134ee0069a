package etcdlock_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
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

// TestMultiAtOnceNamesBoundByMaxTxnOps checks that a MultiAtOnce takes as
// many names as etcd's default --max-txn-ops (128) allows at three
// operations per name, and that one more is refused with ErrInvalid,
// naming the limit.
func TestMultiAtOnceNamesBoundByMaxTxnOps(t *testing.T) {
	srv := testserver.StartEtcd(t)
	c := dlock.New(etcdlock.New(srv.Client(t)))
	t.Cleanup(func() { _ = c.Close() })
	names := make([]string, 43)
	for i := range names {
		names[i] = fmt.Sprintf("many/%02d", i)
	}
	ml, err := c.MultiAtOnce(names[:42]).TryLock(t.Context())
	if err != nil {
		t.Fatalf("MultiAtOnce over 42 names: %v", err)
	}
	if err := ml.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	_, err = c.MultiAtOnce(names).TryLock(t.Context())
	if !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), "--max-txn-ops") {
		t.Fatalf("MultiAtOnce over 43 names = %v, want ErrInvalid naming --max-txn-ops", err)
	}
}
