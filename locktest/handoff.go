// Cases for the direct handoff (driver.CapHandoff): a release grants the
// lock to the fair queue's head, whose Client completes its Lock from the
// announcement, or from its next request when the announcement is lost.

package locktest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// handoffCase prepares a case on the direct handoff: it returns false, and
// the case does nothing, on a store without it (every other fair case holds
// such stores to the queue's order).
func handoffCase(t *testing.T, s *Store) bool {
	return supports(t, s, driver.CapHandoff)
}

// queuedHead starts a fair Lock of name (of the side head makes) on probe
// p's Client, waits until it is refused and queued at the head, and
// returns its outcome channel.
func queuedHead(t *testing.T, p *probe, head sideOf, name string, opts []dlock.Option) <-chan outcome {
	t.Helper()
	return queuedAt(t, p, head, name, opts, 1)
}

// queuedAt is queuedHead for a waiter queued at position.
func queuedAt(t *testing.T, p *probe, head sideOf, name string, opts []dlock.Option, position int) <-chan outcome {
	t.Helper()
	busy, onBusy := busySignal()
	out := goLock(t.Context(), head(clientOn(t, p.backend()), name, append(opts, onBusy)...).lock)
	what := fmt.Sprintf("the waiter queued at %d", position)
	if e := waitBusy(t, what, busy, out); e.Position != position {
		t.Fatalf("%s: Position %d, want %d", what, e.Position, position)
	}
	// A first wait tries once more right after it has subscribed (a
	// release may have come in between); it sleeps after that.
	for deadline := time.Now().Add(10 * time.Second); len(p.recorded()) < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not try again after subscribing", what)
		}
	}
	return out
}

// handedFence returns the fence of the grant that a release handed to the
// queue's head of name (of mode), read right after the release: the next
// after the last of the holders' fences, unless the store's fences are
// revisions of the whole store (Store.RevisionFences), where it is the
// newest one its Inspector reports, which must be above the holders'.
func handedFence(t *testing.T, s *Store, name string, held []*dlock.Lease, mode driver.Mode) uint64 {
	t.Helper()
	last := lastFence(held)
	if !s.RevisionFences {
		return last + 1
	}
	in, ok := s.NewBackend(t).(driver.Inspector)
	if !ok {
		t.Fatal("locktest: a Store with RevisionFences needs a backend with an Inspector")
	}
	info, ok, err := in.Inspect(t.Context(), name)
	if err != nil || !ok {
		t.Fatalf("Inspect right after the release: held %v, %v; want the grant handed to the head", ok, err)
	}
	fence := info.Fence
	if mode == driver.Shared {
		for _, h := range info.Shared {
			fence = max(fence, h.Fence)
		}
	}
	if fence <= last {
		t.Fatalf("the handed grant's fence %d is not above the holders' %d", fence, last)
	}
	return fence
}

// testHandoffWithoutRequest checks, for each fair kind, that the queue's
// head gets the lock that a release handed it without another request of
// its own: the next fence, a lease that renews, a grant that keeps others
// out (and a Semaphore at its limit at every point), and nothing left
// behind.
func testHandoffWithoutRequest(t *testing.T, s *Store) {
	eachFairKind(t, s, "locktest/handoff", true, func(t *testing.T, k fairKind, name string) {
		opts := []dlock.Option{dlock.Fair(), dlock.WithTTL(ttl)}
		held := k.hold(t, s, name, opts)
		stop := k.watch(t, s, name)
		defer stop()
		p := newProbe(s.NewBackend(t))
		out := queuedHead(t, p, k.head, name, opts)
		before := len(p.recorded())
		unlock(t, held[0])
		want := handedFence(t, s, name, held, k.mode)
		l := waitLease(t, "the queue's head", out, 10*time.Second)
		if n := len(p.recorded()) - before; n != 0 {
			t.Errorf("the head made %d acquire requests after the release; want 0 (the release handed it the lock)", n)
		}
		if l.Fence() != want {
			t.Errorf("handed grant's fence %d, want %d (the grant the release made)", l.Fence(), want)
		}
		if l.Owner() == "" {
			t.Error("handed grant without an owner string")
		}
		if err := l.Refresh(t.Context()); err != nil {
			t.Errorf("Refresh of a handed lease: %v", err)
		}
		tryRefused(t, "a TryLock of "+k.name+" kept out by the handed grant", k.other(client(t, s), name, opts...).try)
		unlock(t, l)
		unlockAll(t, held[1:])
		stop()
		noLeftovers(t, s, name)
	})
}

// testHandoffNoticeLost checks, for each fair kind, that a head that
// never hears of the handoff still gets the lock, by its next request (a
// queue refresh), and gets the grant that was handed to it.
func testHandoffNoticeLost(t *testing.T, s *Store) {
	eachFairKind(t, s, "locktest/handoff-lost", true, func(t *testing.T, k fairKind, name string) {
		opts := []dlock.Option{dlock.Fair(), dlock.WithTTL(ttl)}
		held := k.hold(t, s, name, opts)
		p := newProbe(s.NewBackend(t))
		p.deafen()
		out := queuedHead(t, p, k.head, name, opts)
		unlock(t, held[0])
		want := handedFence(t, s, name, held, k.mode)
		// The head refreshes its entry every third of its time to live.
		l := waitLease(t, "the queue's head that missed the handoff", out, fairQueueTTL(ttl)+5*time.Second)
		if l.Fence() != want {
			t.Errorf("fence %d, want %d: the head got a grant other than the one handed to it", l.Fence(), want)
		}
		unlock(t, l)
		unlockAll(t, held[1:])
		noLeftovers(t, s, name)
	})
}

// testHandoffDeadHead checks, for each fair kind, that a grant handed to
// a head that died, and so never claims it, lapses with the head's queue
// entry, not after a whole TTL.
func testHandoffDeadHead(t *testing.T, s *Store) {
	eachFairKind(t, s, "locktest/handoff-dead", true, func(t *testing.T, k fairKind, name string) {
		const lockTTL = 30 * time.Second // far longer than the entry's 1s
		opts := []dlock.Option{dlock.Fair(), dlock.WithTTL(lockTTL)}
		held := k.hold(t, s, name, opts)
		// The dead head: queued by a request of its own, then gone.
		b := s.NewBackend(t)
		res, err := b.Acquire(t.Context(), driver.AcquireRequest{
			Key: name, Token: "dead-head", Owner: "dead head", TTL: lockTTL, Mode: k.mode, Limit: k.limit,
			Fair: true, Wait: true, QueueTTL: time.Second, Handoff: true,
		})
		if err != nil || res.Acquired || !res.Queued || res.Position != 1 {
			t.Fatalf("queueing the dead head: %+v, %v; want refused, queued first", res, err)
		}
		start := time.Now()
		unlock(t, held[0])
		waiter := k.other(client(t, s), name, opts...)
		if l, err := waiter.try(t.Context()); err == nil {
			_ = l.Unlock(t.Context())
			t.Fatal("TryLock right after the release got the lock; want it handed to the dead head")
		} else if no := notObtained(t, "TryLock of the lock handed to the dead head", l, err); no.Holder != "dead head" {
			t.Errorf("holder %q, want the dead head", no.Holder)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		l, err := waiter.lock(ctx)
		if err != nil {
			t.Fatalf("Lock after the dead head's grant: %v", err)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("the lock came free %v after the release; want about the entry's 1s, not the TTL (%v)", took, lockTTL)
		}
		unlock(t, l)
		unlockAll(t, held[1:])
		noLeftovers(t, s, name)
	})
}

// testHandoffCancelledHead checks, for each fair kind, that a head whose
// wait ends while the lock is handed to it (it has not heard yet) gives
// the lock back before Lock returns: the next TryLock of its kind gets it.
func testHandoffCancelledHead(t *testing.T, s *Store) {
	eachFairKind(t, s, "locktest/handoff-cancel", true, func(t *testing.T, k fairKind, name string) {
		opts := []dlock.Option{dlock.Fair(), dlock.WithTTL(ttl)}
		held := k.hold(t, s, name, opts)
		p := newProbe(s.NewBackend(t))
		p.deafen()
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		busy, onBusy := busySignal()
		out := goLock(ctx, k.head(clientOn(t, p.backend()), name, append(opts, onBusy)...).lock)
		waitBusy(t, "the queue's head", busy, out)
		unlock(t, held[0])
		cancel()
		select {
		case o := <-out:
			if o.err == nil {
				// It claimed the grant before the cancel: fine, and nothing
				// to check.
				unlock(t, o.l)
				unlockAll(t, held[1:])
				return
			}
			if !errors.Is(o.err, dlock.ErrNotObtained) {
				t.Fatalf("cancelled head: %v, want ErrNotObtained", o.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the cancelled head's Lock did not return")
		}
		l, err := k.head(client(t, s), name, opts...).try(t.Context())
		if err != nil {
			t.Fatalf("TryLock after the cancelled head returned: %v; want the lock given back", err)
		}
		unlock(t, l)
		unlockAll(t, held[1:])
		noLeftovers(t, s, name)
	})
}

// testHandoffBreakIf checks driver.Breaker on a grant that a release
// handed on, on backends with both: BreakIf with the fence of the holder
// that released leaves the handed grant alone (on etcd, the lock's key
// keeps that holder's create revision), and BreakIf with the handed
// grant's fence breaks it.
func testHandoffBreakIf(t *testing.T, s *Store) {
	const name = "locktest/handoff-break"
	if !handoffCase(t, s) {
		return
	}
	br, ok := s.NewBackend(t).(driver.Breaker)
	if !ok {
		t.Log("the backend has no BreakIf (driver.Breaker is optional)")
		return
	}
	opts := []dlock.Option{dlock.Fair(), dlock.WithTTL(ttl)}
	holder := lock(t, client(t, s).Mutex(name, opts...))
	p := newProbe(s.NewBackend(t))
	out := queuedHead(t, p, mutexSide, name, opts)
	unlock(t, holder)
	l := waitLease(t, "the queue's head", out, 10*time.Second)
	if broken, err := br.BreakIf(t.Context(), name, holder.Fence()); err != nil || broken {
		t.Fatalf("BreakIf with the fence %d of the holder that handed the lock on = %v, %v; want false, nil (the head holds fence %d)", holder.Fence(), broken, err, l.Fence())
	}
	mustBeHeldByOther(t, client(t, s).Mutex(name, opts...))
	if broken, err := br.BreakIf(t.Context(), name, l.Fence()); err != nil || !broken {
		t.Fatalf("BreakIf with the handed grant's fence = %v, %v; want true, nil", broken, err)
	}
	waitDone(t, l, ttl/3+ttl/4)
	if r := lostReason(t, l.Err()); r != dlock.LostMissing {
		t.Errorf("the broken head's reason = %v, want %v", r, dlock.LostMissing)
	}
	noLeftovers(t, s, name)
}
