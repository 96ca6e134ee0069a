package redislock_test

import (
	"errors"
	"math"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redislock"
)

func TestFencedSet(t *testing.T) {
	_, rdb, _ := setup(t)
	ctx := t.Context()

	steps := []struct {
		fence     uint64
		value     string
		wantStale bool
		wantValue string
		wantFence uint64
	}{
		{fence: 5, value: "a", wantValue: "a", wantFence: 5},
		{fence: 5, value: "b", wantValue: "b", wantFence: 5}, // the same grant writes again
		{fence: 4, value: "stale", wantStale: true, wantValue: "b", wantFence: 5},
		{fence: 7, value: "c", wantValue: "c", wantFence: 7},
		{fence: 6, value: "stale", wantStale: true, wantValue: "c", wantFence: 7},
		{fence: 10, value: "d", wantValue: "d", wantFence: 10}, // 10 > 7 although "10" < "7" as text
		// Past 2^53 doubles cannot tell these apart; the script must.
		{fence: 1<<53 + 1, value: "e", wantValue: "e", wantFence: 1<<53 + 1},
		{fence: 1 << 53, value: "stale", wantStale: true, wantValue: "e", wantFence: 1<<53 + 1},
		{fence: math.MaxUint64, value: "f", wantValue: "f", wantFence: math.MaxUint64},
		{fence: math.MaxUint64 - 1, value: "stale", wantStale: true, wantValue: "f", wantFence: math.MaxUint64},
	}
	for _, s := range steps {
		err := redislock.FencedSet(ctx, rdb, "report", s.fence, s.value)
		if s.wantStale != errors.Is(err, redislock.ErrStaleFence) || (!s.wantStale && err != nil) {
			t.Errorf("FencedSet(fence %d) = %v, want stale=%v", s.fence, err, s.wantStale)
		}
		value, fence, err := redislock.FencedGet(ctx, rdb, "report")
		if err != nil || value != s.wantValue || fence != s.wantFence {
			t.Errorf("after FencedSet(fence %d): FencedGet = %q, %d, %v; want %q, %d", s.fence, value, fence, err, s.wantValue, s.wantFence)
		}
	}
}

// Fence 0 is no lease's fence: refused even on a key never written, and
// by a claim, so a lookup that found no lease cannot write.
func TestFencedSetRefusesFenceZero(t *testing.T) {
	_, rdb, _ := setup(t)
	ctx := t.Context()
	if err := redislock.FencedSet(ctx, rdb, "fresh", 0, "x"); !errors.Is(err, redislock.ErrStaleFence) || !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("FencedSet(fence 0) on a fresh key = %v, want ErrStaleFence and ErrInvalid", err)
	}
	if _, _, err := redislock.FencedGet(ctx, rdb, "fresh"); !errors.Is(err, redis.Nil) {
		t.Errorf("after a refused FencedSet: FencedGet = %v, want redis.Nil", err)
	}
	if _, _, err := redislock.FencedClaim(ctx, rdb, "fresh", 0); !errors.Is(err, redislock.ErrStaleFence) {
		t.Errorf("FencedClaim(fence 0) on a fresh key = %v, want ErrStaleFence", err)
	}
	if n, err := rdb.Exists(ctx, "fresh").Result(); err != nil || n != 0 {
		t.Errorf("after refused writes the key exists: %d, %v", n, err)
	}
}

func TestFencedGetMissing(t *testing.T) {
	_, rdb, _ := setup(t)
	_, _, err := redislock.FencedGet(t.Context(), rdb, "missing")
	if !errors.Is(err, redis.Nil) {
		t.Errorf("FencedGet of a missing key: %v, want redis.Nil", err)
	}
}

func TestFencedSetKeepsItsFieldsInOneHash(t *testing.T) {
	_, rdb, _ := setup(t)
	ctx := t.Context()
	if err := redislock.FencedSet(ctx, rdb, "{orders:42}:total", 3, "99.50"); err != nil {
		t.Fatal(err)
	}
	got, err := rdb.HGetAll(ctx, "{orders:42}:total").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["value"] != "99.50" || got["fence"] != "3" {
		t.Errorf("stored hash = %v, want value and fence", got)
	}
}

// A read-modify-write under two successive grants: A (fence 5) reads the
// stock, pauses; B (fence 6) reads the same stock. With FencedGet, A's
// late write of stock−1 was accepted (no fence 6 had written yet) and B's
// decrement then overwrote it: two sales, one decrement. FencedClaim makes
// B's read count as a write of fence 6, so A's write is refused.
func TestFencedClaimRefusesLateWriter(t *testing.T) {
	_, rdb, _ := setup(t)
	ctx := t.Context()
	const key = "stock"
	if _, ok, err := redislock.FencedClaim(ctx, rdb, key, 4); err != nil || ok {
		t.Fatalf("claim of a missing value = %v, %v; want no value, no error", ok, err)
	}
	if err := redislock.FencedSet(ctx, rdb, key, 4, "10"); err != nil {
		t.Fatal(err)
	}
	a, ok, err := redislock.FencedClaim(ctx, rdb, key, 5)
	if err != nil || !ok || a != "10" {
		t.Fatalf("A's claim = %q, %v, %v; want 10", a, ok, err)
	}
	b, ok, err := redislock.FencedClaim(ctx, rdb, key, 6)
	if err != nil || !ok || b != "10" {
		t.Fatalf("B's claim = %q, %v, %v; want 10", b, ok, err)
	}
	if err := redislock.FencedSet(ctx, rdb, key, 5, "9"); !errors.Is(err, redislock.ErrStaleFence) {
		t.Fatalf("A's late write after B's claim = %v, want ErrStaleFence", err)
	}
	if _, _, err := redislock.FencedClaim(ctx, rdb, key, 5); !errors.Is(err, redislock.ErrStaleFence) {
		t.Fatalf("A's late claim = %v, want ErrStaleFence", err)
	}
	if _, _, err := redislock.FencedClaim(ctx, rdb, key, 6); err != nil {
		t.Fatalf("B's claim again (a resend) = %v", err)
	}
	if err := redislock.FencedSet(ctx, rdb, key, 6, "9"); err != nil {
		t.Fatalf("B's write = %v", err)
	}
	if v, f, err := redislock.FencedGet(ctx, rdb, key); err != nil || v != "9" || f != 6 {
		t.Errorf("FencedGet = %q, %d, %v; want 9 at fence 6", v, f, err)
	}
}
