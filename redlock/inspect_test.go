package redlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/redlock"
)

func TestInspectListForceRelease(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	b := newBackend(t, servers)

	a := request(t, "app/a", 10*time.Second)
	mustAcquire(t, b, a)
	r := request(t, "app/b", 10*time.Second)
	r.Reentrant = true
	fence := mustAcquire(t, b, r).Fence
	mustAcquire(t, b, r)
	// Only one node holds app/c: not held by a quorum.
	holdForeign(t, nodes[1], "app/c", "remnant")
	mustAcquire(t, b, request(t, "other", 10*time.Second))
	// Node 2 is behind for app/b: a lower TTL there does not matter, the
	// quorum's TTL is the second highest.
	nodes[2].PExpire(t.Context(), lockKey("app/b"), time.Second)
	redlock.WaitIdle(b)

	info, ok, err := b.Inspect(t.Context(), "app/b")
	if err != nil || !ok {
		t.Fatalf("Inspect(app/b) = %+v, %v, %v; want held", info, ok, err)
	}
	if info.Key != "app/b" || info.Owner != r.Owner || info.Fence != fence || info.Holds != 2 || info.Delayed {
		t.Errorf("Inspect(app/b) = %+v, want owner %q, fence %d, 2 holds", info, r.Owner, fence)
	}
	if info.TTL <= 9*time.Second || info.TTL > 10*time.Second {
		t.Errorf("Inspect(app/b) TTL = %v, want about 10s (the second highest of 10s, 10s, 1s)", info.TTL)
	}
	if info.HeldFor < 0 || info.HeldFor > 5*time.Second {
		t.Errorf("Inspect(app/b) HeldFor = %v", info.HeldFor)
	}
	if _, ok, err := b.Inspect(t.Context(), "app/c"); err != nil || ok {
		t.Errorf("Inspect of a lock held on one node = %v, %v; want not held", ok, err)
	}
	if _, ok, err := b.Inspect(t.Context(), "nothing"); err != nil || ok {
		t.Errorf("Inspect of a free lock = %v, %v; want not held", ok, err)
	}

	infos, err := b.List(t.Context(), "app/")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, i := range infos {
		keys = append(keys, i.Key)
	}
	if len(keys) != 2 || keys[0] != "app/a" || keys[1] != "app/b" {
		t.Errorf("List(app/) = %v, want app/a and app/b", keys)
	}

	// ForceRelease removes even a lock held on one node only.
	info, ok, err = b.ForceRelease(t.Context(), "app/c")
	if err != nil || !ok || info.Owner != "remnant" {
		t.Errorf("ForceRelease(app/c) = %+v, %v, %v; want the remnant", info, ok, err)
	}
	info, ok, err = b.ForceRelease(t.Context(), "app/a")
	if err != nil || !ok || info.Owner != a.Owner {
		t.Errorf("ForceRelease(app/a) = %+v, %v, %v; want a's grant", info, ok, err)
	}
	for _, key := range []string{"app/a", "app/c"} {
		if left := leftovers(t, nodes, key); len(left) > 0 {
			t.Errorf("%s left after ForceRelease: %v", key, left)
		}
	}
	if _, ok, err := b.ForceRelease(t.Context(), "app/a"); err != nil || ok {
		t.Errorf("second ForceRelease = %v, %v; want not held", ok, err)
	}
	if held, err := b.Renew(t.Context(), "app/a", a.Token, time.Second); err != nil || held {
		t.Errorf("Renew after ForceRelease = %v, %v; want not held", held, err)
	}
}

func TestRenewBatchCountsEachRequest(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	b := newBackend(t, servers)
	held := request(t, "held", 10*time.Second)
	mustAcquire(t, b, held)
	minority := request(t, "minority", 10*time.Second)
	mustAcquire(t, b, minority)
	redlock.WaitIdle(b)
	// minority keeps its grant on node 0 only.
	nodes[1].Del(t.Context(), lockKey("minority"))
	nodes[2].Del(t.Context(), lockKey("minority"))

	reqs := []driver.RenewRequest{
		{Key: "held", Token: held.Token, TTL: 20 * time.Second},
		{Key: "minority", Token: minority.Token, TTL: 20 * time.Second},
		{Key: "free", Token: newToken(t), TTL: 20 * time.Second},
	}
	got := b.RenewBatch(t.Context(), reqs)
	if len(got) != 3 || !got[0].Held || got[0].Err != nil || got[1].Held || got[1].Err != nil || got[2].Held || got[2].Err != nil {
		t.Fatalf("RenewBatch = %+v, want held, not held, not held, no errors", got)
	}
	if b.RenewBatch(t.Context(), nil) != nil {
		t.Error("RenewBatch(nil) is not nil")
	}

	servers[1].Kill(t)
	servers[2].Kill(t)
	got = b.RenewBatch(t.Context(), reqs[:1])
	var qe *redlock.QuorumError
	if len(got) != 1 || got[0].Held || !errors.As(got[0].Err, &qe) || qe.Op != "renew" || qe.Key != "held" {
		t.Errorf("RenewBatch with 2 of 3 nodes down = %+v, want a *QuorumError", got)
	}
}
