package sqllock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	dldriver "github.com/dlock-go/dlock/driver"
)

// testPlainNotStarved checks that a plain Mutex's waiter is not starved by
// an owner that holds the lock nearly all the time and locks it again the
// moment it releases it: the waiter, a Client of its own as in another
// process, claims the next grant and gets it at the owner's next release,
// every time, instead of hoping that one of its polls falls into the
// owner's short gap between two holds. Without the claim, three such Locks
// take minutes; the bound below leaves room for a slow machine.
func testPlainNotStarved(t *testing.T, newDB newDatabase) {
	d := newDB(t)
	const name = "starve"
	hog := dlock.New(d.clientBackend(t))
	t.Cleanup(func() { _ = hog.Close() })
	waiter := dlock.New(d.clientBackend(t))
	t.Cleanup(func() { _ = waiter.Close() })

	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	started := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		m := hog.Mutex(name)
		for i := 0; ctx.Err() == nil; i++ {
			l, err := m.Lock(ctx)
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("hog: %v", err)
				}
				return
			}
			if i == 0 {
				close(started)
			}
			time.Sleep(20 * time.Millisecond) // held ~99% of the time
			if err := l.Unlock(context.WithoutCancel(ctx)); err != nil {
				t.Errorf("hog: unlock: %v", err)
				return
			}
		}
	}()
	defer wg.Wait()
	defer stop()
	<-started

	m := waiter.Mutex(name)
	wctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for i := range 3 {
		l, err := m.Lock(wctx)
		if err != nil {
			t.Fatalf("lock %d of the waiter, beside an owner that locks again at once: %v", i, err)
		}
		if err := l.Unlock(t.Context()); err != nil {
			t.Fatalf("unlock %d: %v", i, err)
		}
	}
}

// testClaimLeftOnCancel checks that a starving waiter whose wait ends
// removes its claim, so that the lock is free for anyone at once, and that
// a claim keeps a free lock for its claimer only.
func testClaimLeftOnCancel(t *testing.T, newDB newDatabase) {
	b := newDB(t).backend(t)
	ctx := t.Context()
	req := func(token string) dldriver.AcquireRequest {
		return dldriver.AcquireRequest{Key: "c", Token: token, Owner: token, TTL: time.Minute, Wait: true, QueueTTL: time.Minute, Claim: true}
	}
	if res, err := b.Acquire(ctx, req("holder")); err != nil || !res.Acquired {
		t.Fatalf("holder: %+v, %v", res, err)
	}
	if res, err := b.Acquire(ctx, req("w1")); err != nil || res.Acquired || !res.Queued || res.Holder != "holder" {
		t.Fatalf("w1 behind the holder = %+v, %v; want refused with its claim recorded", res, err)
	}
	if res, err := b.Acquire(ctx, req("w2")); err != nil || res.Acquired || res.Queued {
		t.Fatalf("w2 behind the holder and w1's claim = %+v, %v; want refused, no claim", res, err)
	}
	if _, err := b.Release(ctx, "c", "holder"); err != nil {
		t.Fatal(err)
	}
	again := req("holder")
	again.Wait, again.Claim, again.QueueTTL = false, false, 0
	if res, err := b.Acquire(ctx, again); err != nil || res.Acquired || res.Holder != "w1" || !res.WriterWaiting {
		t.Fatalf("the old holder again, the lock free but claimed by w1 = %+v, %v; want refused naming w1", res, err)
	}
	// w1 gives up: its release drops the claim.
	if res, err := b.Release(ctx, "c", "w1"); err != nil || res.Held {
		t.Fatalf("release of w1's claim = %+v, %v", res, err)
	}
	if res, err := b.Acquire(ctx, again); err != nil || !res.Acquired {
		t.Fatalf("the old holder after w1 gave up = %+v, %v; want granted", res, err)
	}
	if _, err := b.Release(ctx, "c", "holder"); err != nil {
		t.Fatal(err)
	}
}

// testClaimKeepsIntent checks that a writer that waits for readers and
// then claims the next grant behind an exclusive holder keeps its writer
// intent, for QueueTTL, while its claim lives ClaimTTL: first while another
// token's claim goes ahead of it, then while its own claim is live. Each
// phase lasts longer than QueueTTL; the intent still keeps readers out at
// its end.
func testClaimKeepsIntent(t *testing.T, newDB newDatabase) {
	b := newDB(t).backend(t)
	const key, qttl = "ci", 1500 * time.Millisecond
	claimer := func(owner string) dldriver.AcquireRequest {
		req := waiting(writeReq(key, owner, time.Minute), qttl)
		req.Claim, req.ClaimTTL = true, 500*time.Millisecond
		return req
	}
	r := readReq(key, "r", time.Minute, 0)
	mustAcquire(t, b, r)
	w := claimer("w")
	if res := refused(t, b, w); !res.Queued || res.Shared != 1 {
		t.Fatalf("writer beside a reader = %+v, want its intent recorded", res)
	}
	release(t, b, key, r.Token)
	x := writeReq(key, "x", time.Minute)
	mustAcquire(t, b, x)

	keep := func(phase string, reqs ...dldriver.AcquireRequest) {
		t.Helper()
		for end := time.Now().Add(qttl + 500*time.Millisecond); time.Now().Before(end); {
			for _, req := range reqs {
				refused(t, b, req)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if info, _ := inspect(t, b, key); !info.WriterWaiting {
			t.Errorf("%s: the writer's intent lapsed: %+v", phase, info)
		}
	}
	other := claimer("other")
	if res := refused(t, b, other); !res.Queued {
		t.Fatalf("another claimer behind x = %+v, want its claim recorded", res)
	}
	keep("behind another's claim", other, w)
	release(t, b, key, other.Token)
	keep("with its own claim", w)

	release(t, b, key, x.Token)
	if res := refused(t, b, readReq(key, "late", time.Minute, 0)); !res.WriterWaiting {
		t.Errorf("a reader once x left = %+v, want refused by the writer's intent", res)
	}
	mustAcquire(t, b, w)
	release(t, b, key, w.Token)
}
