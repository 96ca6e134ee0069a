package redislock_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/redislock"
)

func TestInspect(t *testing.T) {
	b, _, _ := setup(t)
	ctx := t.Context()

	if _, ok, err := b.Inspect(ctx, "k"); err != nil || ok {
		t.Fatalf("Inspect of a free lock: ok=%v err=%v, want not held", ok, err)
	}

	req := driver.AcquireRequest{Key: "k", Token: newToken(t), Owner: "alice", TTL: 10 * time.Second, Reentrant: true}
	res := mustAcquire(t, b, req)
	mustAcquire(t, b, req)
	info, ok, err := b.Inspect(ctx, "k")
	if err != nil || !ok {
		t.Fatalf("Inspect of a held lock: ok=%v err=%v", ok, err)
	}
	if info.Key != "k" || info.Owner != "alice" || info.Fence != res.Fence || info.Holds != 2 {
		t.Errorf("Inspect = %+v, want key k, owner alice, fence %d, holds 2", info, res.Fence)
	}
	if info.TTL <= 9*time.Second || info.TTL > 10*time.Second {
		t.Errorf("Inspect TTL = %v, want about 10s", info.TTL)
	}
	time.Sleep(20 * time.Millisecond)
	if info, _, _ := b.Inspect(ctx, "k"); info.HeldFor < 20*time.Millisecond || info.HeldFor > 5*time.Second {
		t.Errorf("Inspect HeldFor = %v, want at least 20ms", info.HeldFor)
	}
}

func TestList(t *testing.T) {
	b, rdb, srv := setup(t)
	ctx := t.Context()
	keys := []string{"jobs/a", "jobs/b", "jobsX", "other", "we*rd", "weird", "br[ck]et", "brcket"}
	for _, k := range keys {
		mustAcquire(t, b, driver.AcquireRequest{Key: k, Token: newToken(t), Owner: "owner of " + k, TTL: time.Minute})
	}
	// Released locks leave their fence counters behind; they are not locks.
	lockAndRelease(t, b, "jobs/released")
	// Another namespace on the same server is not listed.
	mustAcquire(t, redislock.New(srv.Client(t), redislock.WithNamespace("billing")),
		driver.AcquireRequest{Key: "jobs/c", Token: newToken(t), Owner: "o", TTL: time.Minute})
	// Nor are unrelated keys.
	if err := rdb.Set(ctx, "dlock:unrelated", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		prefix string
		want   []string
	}{
		{"", []string{"br[ck]et", "brcket", "jobs/a", "jobs/b", "jobsX", "other", "we*rd", "weird"}},
		{"jobs/", []string{"jobs/a", "jobs/b"}},
		{"we*", []string{"we*rd"}},
		{"br[ck]", []string{"br[ck]et"}},
		{"nothing", nil},
	} {
		infos, err := b.List(ctx, c.prefix)
		if err != nil {
			t.Fatalf("List(%q): %v", c.prefix, err)
		}
		var got []string
		for _, info := range infos {
			got = append(got, info.Key)
			if info.Owner != "owner of "+info.Key || info.Holds != 1 || info.Fence == 0 || info.TTL <= 0 {
				t.Errorf("List(%q): %+v", c.prefix, info)
			}
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("List(%q) = %q, want %q", c.prefix, got, c.want)
		}
	}
}

func TestListPagesThroughManyLocks(t *testing.T) {
	b, _, _ := setup(t)
	const n = 1200 // several SCAN pages
	for i := range n {
		mustAcquire(t, b, driver.AcquireRequest{Key: fmt.Sprintf("k%04d", i), Token: newToken(t), Owner: "o", TTL: time.Minute})
	}
	infos, err := b.List(t.Context(), "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != n {
		t.Fatalf("List returned %d locks, want %d", len(infos), n)
	}
	for i, info := range infos {
		if want := fmt.Sprintf("k%04d", i); info.Key != want {
			t.Fatalf("List()[%d] = %q, want %q", i, info.Key, want)
		}
	}
}

func TestForceRelease(t *testing.T) {
	b, rdb, _ := setup(t)
	ctx := t.Context()
	l, n := listen(t, b)
	subscribe(t, l, "k")

	req := driver.AcquireRequest{Key: "k", Token: newToken(t), Owner: "stuck job", TTL: time.Minute, Reentrant: true}
	res := mustAcquire(t, b, req)
	mustAcquire(t, b, req)

	info, ok, err := b.ForceRelease(ctx, "k")
	if err != nil || !ok {
		t.Fatalf("ForceRelease: ok=%v err=%v", ok, err)
	}
	if info.Key != "k" || info.Owner != "stuck job" || info.Fence != res.Fence || info.Holds != 2 || info.TTL <= 0 {
		t.Errorf("ForceRelease = %+v, want what was held", info)
	}
	n.expect(t, "k")
	if exists(t, rdb, "dlock:{k}") {
		t.Error("lock hash still exists")
	}
	if got := release(t, b, "k", req.Token); got.Held {
		t.Errorf("the old holder's release after ForceRelease = %+v, want not held", got)
	}
	if next := mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: newToken(t), Owner: "o", TTL: time.Second}); next.Fence <= res.Fence {
		t.Errorf("fence after ForceRelease = %d, want > %d", next.Fence, res.Fence)
	}

	if _, _, err := b.ForceRelease(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := b.ForceRelease(ctx, "k"); err != nil || ok {
		t.Errorf("ForceRelease of a free lock: ok=%v err=%v, want not held", ok, err)
	}
}
