package etcdlock_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"testing"
	"time"

	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/testserver"
)

// Review: BreakIf with the fence of the holder whose release handed the
// lock on must not break the handed grant (driver.Breaker: only when the
// grant's fence is fence). The handed key keeps its releaser's create
// revision, which BreakIf's first transaction compares.
func TestReviewBreakIfOldFenceKeepsHandedGrant(t *testing.T) {
	srv := testserver.StartEtcd(t)
	hb, held := hoHolder(t, srv, "k")
	b := etcdlock.New(srv.Client(t))
	hoHead(t, b, "k", "head", 5*time.Second)
	if _, err := hb.Release(t.Context(), "k", "holder"); err != nil {
		t.Fatal(err)
	}
	info, ok := hoInspect(t, b, "k")
	if !ok || info.Owner != "head head" || info.Fence <= held.Fence {
		t.Fatalf("after the release: %+v; want handed to the head", info)
	}
	broken, err := b.BreakIf(t.Context(), "k", held.Fence)
	if err != nil {
		t.Fatal(err)
	}
	after, ok := hoInspect(t, b, "k")
	if broken || !ok || after.Owner != "head head" {
		t.Fatalf("BreakIf(old holder's fence %d) = %v; lock now %+v held=%v; want false and the head's grant (fence %d) kept", held.Fence, broken, after, ok, info.Fence)
	}
}

// Review: mixed fair (handoff) waiters, cancelled fair waiters and plain
// waiters on one hot key: one holder at a time, fences strictly increasing
// in the order of the critical sections.
func TestReviewHandoffStress(t *testing.T) {
	srv := testserver.StartEtcd(t)
	var (
		mu       sync.Mutex
		inCS     int
		last     uint64
		overlaps int
		backward []string
		grants   int
		handed   int
	)
	run := 8 * time.Second
	ctx, cancel := context.WithTimeout(t.Context(), run)
	defer cancel()
	var wg sync.WaitGroup
	worker := func(i int, opts []dlock.Option, short bool) {
		c := dlock.New(etcdlock.New(srv.Client(t)))
		t.Cleanup(func() { c.Close() })
		m := c.Mutex("hot", opts...)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				lctx := ctx
				var lc context.CancelFunc = func() {}
				if short {
					lctx, lc = context.WithTimeout(ctx, time.Duration(1+i%7)*time.Millisecond*3)
				}
				l, err := m.Lock(lctx)
				lc()
				if err != nil {
					continue
				}
				mu.Lock()
				inCS++
				if inCS > 1 {
					overlaps++
				}
				if l.Fence() <= last {
					backward = append(backward, fmt.Sprintf("%d after %d", l.Fence(), last))
				}
				last = max(last, l.Fence())
				grants++
				mu.Unlock()
				time.Sleep(time.Duration(i%3) * 300 * time.Microsecond)
				mu.Lock()
				inCS--
				mu.Unlock()
				select {
				case <-l.Done():
					t.Errorf("worker %d lost its lease: %v", i, l.Err())
				default:
				}
				_ = l.Unlock(context.Background())
			}
		}()
	}
	for i := range 5 {
		worker(i, []dlock.Option{dlock.Fair(), dlock.WithTTL(3 * time.Second)}, false)
	}
	for i := 5; i < 7; i++ {
		worker(i, []dlock.Option{dlock.Fair(), dlock.WithTTL(3 * time.Second)}, true)
	}
	for i := 7; i < 9; i++ {
		worker(i, []dlock.Option{dlock.WithTTL(3 * time.Second)}, false)
	}
	wg.Wait()
	_ = handed
	t.Logf("%d grants", grants)
	if overlaps > 0 || len(backward) > 0 {
		t.Fatalf("%d overlaps; fences not increasing: %v", overlaps, backward)
	}
}

// Review: a Client of the main branch on the same namespace reads a
// grant's fence as its key's create revision (Inspect, BreakIf,
// ReleaseGrant there). After a handoff that is the releaser's fence: such
// a client sees the handed holder with the previous holder's fence (a
// repeated fence) and its BreakIf of the previous holder breaks the new
// one. This emulates main's reading with a raw Get.
func TestReviewMixedVersionFenceRepeats(t *testing.T) {
	srv := testserver.StartEtcd(t)
	hb, held := hoHolder(t, srv, "k")
	b := etcdlock.New(srv.Client(t))
	hoHead(t, b, "k", "head", 5*time.Second)
	if _, err := hb.Release(t.Context(), "k", "holder"); err != nil {
		t.Fatal(err)
	}
	kv, err := srv.Client(t).Get(t.Context(), "dlock/k\x00e")
	if err != nil || len(kv.Kvs) != 1 {
		t.Fatal(kv, err)
	}
	if got := uint64(kv.Kvs[0].CreateRevision); got == held.Fence {
		t.Fatalf("main-branch view of the handed grant (value %q): fence %d = the previous holder's %d", kv.Kvs[0].Value, got, held.Fence)
	}
}

// Review: fair (handoff) workers on a 3-member cluster while the leader is
// killed and restarted: no two live holders, fences increasing.
func TestReviewHandoffLeaderKill(t *testing.T) {
	srv := testserver.StartEtcdCluster(t, 3)
	var (
		mu       sync.Mutex
		in       = map[*dlock.Lease]bool{}
		last     uint64
		overlaps []string
		grants   int
	)
	ctx, cancel := context.WithTimeout(t.Context(), 12*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 6 {
		c := dlock.New(etcdlock.New(srv.Client(t)))
		t.Cleanup(func() { c.Close() })
		m := c.Mutex("hot", dlock.Fair(), dlock.WithTTL(2*time.Second))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				l, err := m.Lock(ctx)
				if err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				mu.Lock()
				for o := range in {
					select {
					case <-o.Done():
					default:
						overlaps = append(overlaps, fmt.Sprintf("%d entered while %d live", l.Fence(), o.Fence()))
					}
				}
				if l.Fence() <= last {
					overlaps = append(overlaps, fmt.Sprintf("fence %d after %d", l.Fence(), last))
				}
				last = max(last, l.Fence())
				in[l] = true
				grants++
				mu.Unlock()
				time.Sleep(time.Duration(i) * 200 * time.Microsecond)
				mu.Lock()
				delete(in, l)
				mu.Unlock()
				uctx, uc := context.WithTimeout(context.Background(), 3*time.Second)
				_ = l.Unlock(uctx)
				uc()
			}
		}()
	}
	time.Sleep(3 * time.Second)
	leader := srv.Leader(t)
	srv.Kill(t, leader)
	time.Sleep(3 * time.Second)
	srv.Start(t, leader)
	wg.Wait()
	t.Logf("%d grants", grants)
	if len(overlaps) > 0 {
		t.Fatalf("%d violations: %v", len(overlaps), overlaps[:min(10, len(overlaps))])
	}
}

// Review: a head's clean-up release that drops a handed grant writes no
// release record (only a release that finds nothing does), so a request of
// that token still on its way (here: sent through a second Backend, as a
// request whose caller gave up before its answer) grants or queues the
// token again: a grant nobody holds, or a ghost entry that a later release
// hands the lock to. Before the handoff the clean-up found nothing and its
// record refused such a request.
func TestReviewLateRequestAfterHandedCleanup(t *testing.T) {
	for _, withNext := range []bool{false, true} {
		t.Run(fmt.Sprintf("next_waiter_%v", withNext), func(t *testing.T) {
			srv := testserver.StartEtcd(t)
			hb, _ := hoHolder(t, srv, "k")
			b := etcdlock.New(srv.Client(t))
			b2 := etcdlock.New(srv.Client(t))
			req := hoHead(t, b, "k", "head", 5*time.Second)
			// The same request again, through b2 (its isQueued path).
			if res, err := b2.Acquire(t.Context(), req); err != nil || !res.Queued {
				t.Fatalf("refresh: %+v %v", res, err)
			}
			if withNext {
				hoHead(t, b, "k", "next", 5*time.Second)
			}
			if _, err := hb.Release(t.Context(), "k", "holder"); err != nil {
				t.Fatal(err)
			}
			if info, ok := hoInspect(t, b, "k"); !ok || info.Owner != "head head" {
				t.Fatalf("not handed: %+v", info)
			}
			// The head's Lock ended: its clean-up releases the token.
			if res, err := b.Release(t.Context(), "k", "head"); err != nil || !res.Held {
				t.Fatalf("clean-up: %+v %v", res, err)
			}
			// The request of the head that was on its way lands now.
			res, err := b2.Acquire(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			if res.Acquired || res.Queued {
				info, _ := hoInspect(t, b, "k")
				t.Fatalf("late request of the released head: acquired=%v queued=%v (lock now %+v); want refused, as a release record would", res.Acquired, res.Queued, info)
			}
		})
	}
}

// Review control: the same sequence without the handoff: the clean-up
// finds nothing, records the release, and the late request is refused.
func TestReviewLateRequestControlNoHandoff(t *testing.T) {
	srv := testserver.StartEtcd(t)
	hb, _ := hoHolder(t, srv, "k")
	b := etcdlock.New(srv.Client(t))
	b2 := etcdlock.New(srv.Client(t))
	req := driver.AcquireRequest{Key: "k", Token: "head", Owner: "head head", TTL: hoTTL, Fair: true, Wait: true, QueueTTL: 5 * time.Second}
	for _, x := range []*etcdlock.Backend{b, b2} {
		if res, err := x.Acquire(t.Context(), req); err != nil || !res.Queued {
			t.Fatalf("queue: %+v %v", res, err)
		}
	}
	if _, err := hb.Release(t.Context(), "k", "holder"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Release(t.Context(), "k", "head"); err != nil {
		t.Fatal(err)
	}
	res, err := b2.Acquire(t.Context(), req)
	if err != nil || res.Acquired || res.Queued {
		t.Fatalf("late request: %+v %v; want refused", res, err)
	}
}

// Review: the key's create revision survives a chain of handoffs, so
// BreakIf with the fence of the grant that started the chain breaks
// whoever holds the lock now, two handoffs later.
func TestReviewBreakIfChain(t *testing.T) {
	srv := testserver.StartEtcd(t)
	hb, held := hoHolder(t, srv, "k")
	b := etcdlock.New(srv.Client(t))
	hoHead(t, b, "k", "h1", 5*time.Second)
	hoHead(t, b, "k", "h2", 5*time.Second)
	if _, err := hb.Release(t.Context(), "k", "holder"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Release(t.Context(), "k", "h1"); err != nil {
		t.Fatal(err)
	}
	info, ok := hoInspect(t, b, "k")
	if !ok || info.Owner != "head h2" {
		t.Fatalf("want h2 handed the lock: %+v", info)
	}
	if broken, err := b.BreakIf(t.Context(), "k", held.Fence); err != nil || broken {
		t.Fatalf("BreakIf(first holder's fence %d) = %v, %v while h2 holds fence %d; want false", held.Fence, broken, err, info.Fence)
	}
}
