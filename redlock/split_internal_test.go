package redlock

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
)

// TestSplitDelayBacksOff checks that the delay after a split of the nodes
// between contenders doubles with each split of the key in a row, up to
// eight times, and starts over after a grant or a refusal by a holder.
func TestSplitDelayBacksOff(t *testing.T) {
	const timeout = 50 * time.Millisecond
	b := &Backend{opts: options{nodeTimeout: timeout}}
	lo, hi := timeout/5, timeout
	for i, mult := range []time.Duration{1, 2, 4, 8, 8, 8} {
		d := b.splitDelay("k")
		if d < lo*mult || d >= hi*mult {
			t.Errorf("split %d in a row: delay %v, want in [%v, %v)", i+1, d, lo*mult, hi*mult)
		}
	}
	if d := b.splitDelay("other"); d < lo || d >= hi {
		t.Errorf("first split of another key: delay %v, want in [%v, %v)", d, lo, hi)
	}
	b.noSplit("k")
	if d := b.splitDelay("k"); d < lo || d >= hi {
		t.Errorf("first split after noSplit: delay %v, want in [%v, %v)", d, lo, hi)
	}
}

// TestSplitDelayForgets checks that the keys splitDelay remembers stay
// bounded.
func TestSplitDelayForgets(t *testing.T) {
	b := &Backend{opts: options{nodeTimeout: 50 * time.Millisecond}}
	for i := range 3 * maxSplitKeys {
		b.splitDelay(string(rune('a'+i%26)) + time.Duration(i).String())
	}
	if n := len(b.splits); n > maxSplitKeys {
		t.Errorf("%d keys remembered, want at most %d", n, maxSplitKeys)
	}
}

// TestLeaderRefusalEndsTheSplitsInARow checks that a contended attempt
// that the key's leader node refuses for a holder starts the key's splits
// in a row over, as a refusal by a holder of a quorum does: a split after
// it backs off from the first delay again.
func TestLeaderRefusalEndsTheSplitsInARow(t *testing.T) {
	var clients []redis.UniversalClient
	for range 3 {
		c := testserver.StartRedis(t).Client(t)
		if err := c.HSet(t.Context(), "dlock:{k}", "f0reign", 1, "owner", "alpha", "fence", 1).Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.PExpire(t.Context(), "dlock:{k}", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	// A long node timeout: a call slowed by a loaded machine must not turn
	// the leader's order off.
	b, err := New(clients, WithNodeTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.waitIdle)
	req := func() driver.AcquireRequest {
		return driver.AcquireRequest{Key: "k", Token: t.Name() + time.Now().String(), Owner: "me", TTL: 10 * time.Second}
	}
	if res, err := b.Acquire(t.Context(), req()); err != nil || res.Acquired || res.Holder != "alpha" {
		t.Fatalf("Acquire of a held key = %+v, %v; want refused by alpha", res, err)
	}
	for range 3 {
		b.splitDelay("k") // three splits in a row
	}
	r := req()
	if b.leaderFor(r) == nil {
		t.Fatal("the refused key does not ask its leader first")
	}
	if res, err := b.Acquire(t.Context(), r); err != nil || res.Acquired || res.Holder != "alpha" {
		t.Fatalf("contended Acquire = %+v, %v; want refused by alpha", res, err)
	}
	const timeout = time.Second
	if d := b.splitDelay("k"); d >= timeout {
		t.Errorf("first split after a refusal by a holder at the leader: delay %v, want below the node timeout %v", d, timeout)
	}
}
