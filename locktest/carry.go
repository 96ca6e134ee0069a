package locktest

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// testReleaseAcquire checks driver.ReleaseAcquirer, on backends that have
// it: the release runs before the acquire it carries, which is granted the
// lock the release freed, with a higher fence; each is answered as its own
// call would be (a release tied to another fence holds nothing and frees
// nothing, and the acquire is refused, queued when it waits fairly); and a
// fair request that the release's handoff leaves behind joins the queue.
func testReleaseAcquire(t *testing.T, s *Store) {
	b := s.NewBackend(t)
	ra, ok := b.(driver.ReleaseAcquirer)
	if !ok {
		t.Log("the backend has no ReleaseAcquire (driver.ReleaseAcquirer is optional)")
		return
	}
	const key = "locktest/release-acquire"
	ctx := t.Context()
	req := func(token string) driver.AcquireRequest {
		return driver.AcquireRequest{Key: key, Token: token, Owner: token, TTL: time.Minute, Wait: true, QueueTTL: 30 * time.Second}
	}
	first, err := b.Acquire(ctx, req("a"))
	if err != nil || !first.Acquired {
		t.Fatalf("Acquire a = %+v, %v", first, err)
	}

	// Tied to a fence that is not a's grant's: nothing is released, and
	// the acquire finds the lock held by a.
	res, err := ra.ReleaseAcquire(ctx, key, "a", first.Fence+1000, req("b"))
	if err != nil || res.AcquireErr != nil {
		t.Fatalf("ReleaseAcquire with another fence: %v, %v", err, res.AcquireErr)
	}
	if res.Release.Held || res.Acquire.Acquired || res.Acquire.Holder != "a" {
		t.Fatalf("ReleaseAcquire with another fence = %+v, want nothing released and b refused by a", res)
	}

	// Tied to a's fence: a's hold goes, and b gets the lock.
	res, err = ra.ReleaseAcquire(ctx, key, "a", first.Fence, req("b"))
	if err != nil || res.AcquireErr != nil {
		t.Fatalf("ReleaseAcquire: %v, %v", err, res.AcquireErr)
	}
	if !res.Release.Held || res.Release.Remaining != 0 {
		t.Errorf("release of a = %+v, want its one hold released", res.Release)
	}
	if !res.Acquire.Acquired || res.Acquire.Fence <= first.Fence {
		t.Fatalf("acquire of b = %+v, want granted with a fence above %d", res.Acquire, first.Fence)
	}
	second := res.Acquire

	// Untied (fence 0), with a fair waiter c queued: when the store hands
	// the lock over, c gets it and the carried fair request of d queues
	// behind; else d finds the lock promised to c, or free for c to take.
	if !supports(t, s, driver.CapFair) {
		res, err = ra.ReleaseAcquire(ctx, key, "b", 0, req("d"))
		if err != nil || res.AcquireErr != nil || !res.Release.Held || !res.Acquire.Acquired {
			t.Fatalf("untied ReleaseAcquire = %+v, %v, %v; want b released and d granted", res, err, res.AcquireErr)
		}
		if _, err := b.Release(ctx, key, "d"); err != nil {
			t.Fatal(err)
		}
		return
	}
	fair := func(token string) driver.AcquireRequest {
		r := req(token)
		r.Fair, r.Handoff = true, true
		return r
	}
	if r, err := b.Acquire(ctx, fair("c")); err != nil || r.Acquired || !r.Queued {
		t.Fatalf("fair waiter c = %+v, %v; want queued", r, err)
	}
	res, err = ra.ReleaseAcquire(ctx, key, "b", 0, fair("d"))
	if err != nil || res.AcquireErr != nil {
		t.Fatalf("ReleaseAcquire behind a queue: %v, %v", err, res.AcquireErr)
	}
	if !res.Release.Held {
		t.Errorf("release of b = %+v, want held", res.Release)
	}
	if res.Acquire.Acquired {
		t.Fatalf("d = %+v: granted past c, the queue's head", res.Acquire)
	}
	if !res.Acquire.Queued || res.Acquire.Position < 1 {
		t.Errorf("d = %+v, want queued behind c", res.Acquire)
	}
	// c, granted by the handoff or by its next request, comes before d.
	c, err := b.Acquire(ctx, fair("c"))
	if err != nil || !c.Acquired || c.Fence <= second.Fence {
		t.Fatalf("c after the release = %+v, %v; want granted with a fence above %d", c, err, second.Fence)
	}
	if _, err := b.Release(ctx, key, "c"); err != nil {
		t.Fatal(err)
	}
	d, err := b.Acquire(ctx, fair("d"))
	if err != nil || !d.Acquired || d.Fence <= c.Fence {
		t.Fatalf("d after c = %+v, %v; want granted with a fence above %d", d, err, c.Fence)
	}
	if _, err := b.Release(ctx, key, "d"); err != nil {
		t.Fatal(err)
	}
}
