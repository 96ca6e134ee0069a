package locktest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// fairQueueTTL is the time to live of a fair waiter's queue entry for a
// lease TTL: the client keeps it alive by trying again every third of it.
func fairQueueTTL(ttl time.Duration) time.Duration { return min(ttl, 5*time.Second) }

// fairUnsupported checks that a backend without fair locks refuses them.
// It reports whether it did the checking.
func fairUnsupported(t *testing.T, s *Store, name string) bool {
	if supports(t, s, driver.CapFair) {
		return false
	}
	m := client(t, s).Mutex(name, dlock.Fair())
	mustBeInvalid(t, "of a fair Mutex on a backend without fair locks", map[string]func(context.Context) (*dlock.Lease, error){
		"Lock": m.Lock, "TryLock": m.TryLock,
	})
	return true
}

// handsOff reports whether backends of s hand a released lock to the fair
// queue's head themselves (driver.CapHandoff).
func handsOff(t *testing.T, s *Store) bool { return supports(t, s, driver.CapHandoff) }

// testFairOrder checks, for each fair kind, that fair waiters, each in a
// Client of its own, are granted the lock in the order they arrived: their
// grants' fences rise in that order (readers let in together, and permits,
// are granted one after the other too).
func testFairOrder(t *testing.T, s *Store) {
	const waiters = 16
	eachFairKind(t, s, "locktest/fair-order", false, func(t *testing.T, k fairKind, name string) {
		held := k.hold(t, s, name, []dlock.Option{dlock.Fair()})
		stop := k.watch(t, s, name)
		defer stop()
		fences := make([]uint64, waiters)
		outs := make([]<-chan outcome, waiters)
		for i := range waiters {
			busy, onBusy := busySignal()
			lock := k.head(client(t, s), name, dlock.Fair(), onBusy).lock
			outs[i] = goLock(t.Context(), func(ctx context.Context) (*dlock.Lease, error) {
				l, err := lock(ctx)
				if err != nil {
					return nil, err
				}
				fences[i] = l.Fence()
				return l, l.Unlock(ctx)
			})
			// Refused once: queued, so the next one arrives after it.
			if e := waitBusy(t, fmt.Sprintf("waiter %d", i), busy, outs[i]); e.Position != i+1 {
				t.Errorf("waiter %d: Position %d, want %d", i, e.Position, i+1)
			}
		}
		unlockAll(t, held)
		deadline := time.Now().Add(60 * time.Second)
		for i, out := range outs {
			waitLease(t, fmt.Sprintf("waiter %d", i), out, time.Until(deadline))
		}
		order := rangeOf(waiters)
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(fences[a], fences[b]) })
		if want := rangeOf(waiters); !slices.Equal(order, want) {
			t.Errorf("granted (by fence) in order %v, want arrival order %v; fences %v", order, want, fences)
		}
		stop()
	})
}

func rangeOf(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// testFairWakesOnlyHead checks that a release wakes only the head of the
// queue: the other waiters do not try again until their own refresh timer.
func testFairWakesOnlyHead(t *testing.T, s *Store) {
	const name, waiters = "locktest/fair-head", 6
	if fairUnsupported(t, s, name) {
		return
	}
	// A long TTL: waiters refresh their entries only every third of the
	// queue TTL (5s), so an attempt sooner than that after a waiter's
	// previous one was caused by a wake-up.
	const lockTTL = 30 * time.Second
	refresh := fairQueueTTL(lockTTL) / 3
	opts := []dlock.Option{dlock.Fair(), dlock.WithTTL(lockTTL)}
	holder := lock(t, client(t, s).Mutex(name, opts...))

	granted := make(chan int, waiters)
	release := make([]chan struct{}, waiters)
	probes := make([]*probe, waiters)
	outs := make([]<-chan outcome, waiters)
	for i := range waiters {
		release[i] = make(chan struct{})
		probes[i] = newProbe(s.NewBackend(t))
		busy, onBusy := busySignal()
		m := clientOn(t, probes[i].backend()).Mutex(name, append(opts, onBusy)...)
		outs[i] = goLock(t.Context(), func(ctx context.Context) (*dlock.Lease, error) {
			l, err := m.Lock(ctx)
			if err != nil {
				return nil, err
			}
			granted <- i
			select {
			case <-release[i]:
			case <-ctx.Done():
			}
			return l, l.Unlock(ctx)
		})
		waitBusy(t, fmt.Sprintf("waiter %d", i), busy, outs[i])
	}
	// Each holder keeps the lock a moment, so that waiters woken by mistake
	// try while it is held, and are seen.
	const hold = 50 * time.Millisecond
	time.Sleep(hold)
	// Only a release wakes waiters: attempts before the first one are
	// arrivals (on a loaded machine a waiter whose subscription is not yet
	// confirmed polls a few times more).
	firstRelease := time.Now()
	unlock(t, holder)
	for want := range waiters {
		select {
		case got := <-granted:
			if got != want {
				t.Fatalf("waiter %d got the lock, want %d (arrival order)", got, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("waiter %d not granted the lock within 30s", want)
		}
		time.Sleep(hold)
		close(release[want])
		waitLease(t, fmt.Sprintf("waiter %d", want), outs[want], 10*time.Second)
	}

	if !hasNotifier(t, s) {
		// Without notifications every waiter polls the store: nobody is
		// woken, so only the order above can be checked.
		return
	}
	// A refused attempt sooner than the refresh period after the waiter's
	// previous one was a wake-up of a waiter that was not at the head: a
	// thundering herd makes one per waiter and release. The first two
	// attempts of each waiter are its arrival (Lock's, then its wait's).
	// A waiter is never blocked on its subscription: until the store
	// confirms it, the waiter polls, and the confirmation wakes it once;
	// so only a gap that began after the confirmation can be a wake-up by a
	// release.
	woken, total := 0, 0
	for i, p := range probes {
		as := p.recorded()
		total += len(as)
		confirmed := p.subscribedAt()
		if confirmed.IsZero() {
			t.Errorf("waiter %d: its subscription to the lock's releases was never confirmed", i)
		}
		for j := 2; j < len(as); j++ {
			// An attempt before the first release, or in a gap that began
			// before the subscription was confirmed, was no release's
			// wake-up.
			if as[j].at.Before(firstRelease) || confirmed.IsZero() || as[j-1].at.Before(confirmed) {
				continue
			}
			if gap := as[j].at.Sub(as[j-1].at); !as[j].acquired && gap < refresh-10*time.Millisecond {
				woken++
				t.Logf("waiter %d: refused attempt %v after its previous one", i, gap)
			}
		}
	}
	t.Logf("%d acquire attempts by %d fair waiters; %d refused wake-ups", total, waiters, woken)
	if woken > 2 {
		t.Errorf("%d refused wake-ups of waiters behind the head (a thundering herd?), want at most 2", woken)
	}
}

// testFairCancelledLeaves checks that a fair waiter whose wait is cancelled
// leaves the queue at once: the waiter behind it does not wait for its
// entry to lapse.
func testFairCancelledLeaves(t *testing.T, s *Store) {
	const name = "locktest/fair-cancel"
	if fairUnsupported(t, s, name) {
		return
	}
	const lockTTL = 10 * time.Second // queue entries live 5s
	opts := []dlock.Option{dlock.Fair(), dlock.WithTTL(lockTTL)}
	holder := lock(t, client(t, s).Mutex(name, opts...))

	ctxA, cancelA := context.WithCancel(t.Context())
	defer cancelA()
	busyA, onBusyA := busySignal()
	outA := goLock(ctxA, client(t, s).Mutex(name, append(opts, onBusyA)...).Lock)
	waitBusy(t, "waiter A", busyA, outA)
	busyB, onBusyB := busySignal()
	outB := goLock(t.Context(), client(t, s).Mutex(name, append(opts, onBusyB)...).Lock)
	if e := waitBusy(t, "waiter B", busyB, outB); e.Position != 2 {
		t.Errorf("waiter B: Position %d, want 2", e.Position)
	}

	cancelA()
	select {
	case o := <-outA:
		if !errors.Is(o.err, dlock.ErrNotObtained) || !errors.Is(o.err, context.Canceled) {
			t.Fatalf("cancelled Lock = %v, want ErrNotObtained and context.Canceled", o.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("cancelled Lock did not return")
	}
	unlock(t, holder)
	// Had A's entry stayed, B would wait for it to lapse: 5s after A's last
	// refresh, at least 3s from now.
	b := waitLease(t, "waiter B after A cancelled", outB, 2*time.Second)
	unlock(t, b)
	noLeftovers(t, s, name)
}

// testFairDeadWaiterLeaves checks that the queue entry of a waiter whose
// process died lapses, and the waiter behind it gets the lock.
func testFairDeadWaiterLeaves(t *testing.T, s *Store) {
	const name = "locktest/fair-dead"
	if fairUnsupported(t, s, name) {
		return
	}
	opts := []dlock.Option{dlock.Fair(), dlock.WithTTL(ttl)} // queue entries live ttl
	holder := lock(t, client(t, s).Mutex(name, opts...))

	dying := newProbe(s.NewBackend(t))
	a := clientOn(t, dying.backend())
	busyA, onBusyA := busySignal()
	outA := goLock(t.Context(), a.Mutex(name, append(opts, onBusyA)...).Lock)
	waitBusy(t, "waiter A", busyA, outA)
	busyB, onBusyB := busySignal()
	outB := goLock(t.Context(), client(t, s).Mutex(name, append(opts, onBusyB)...).Lock)
	if e := waitBusy(t, "waiter B", busyB, outB); e.Position != 2 {
		t.Errorf("waiter B: Position %d, want 2", e.Position)
	}

	dying.kill() // A's entry stays on the store, and A never refreshes it again
	unlock(t, holder)
	b := waitLease(t, "waiter B behind a dead waiter", outB, 10*time.Second)
	unlock(t, b)

	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Logf("closing the dead waiter's Client: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the dead waiter's Client did not close within 10s")
	}
	select {
	case o := <-outA:
		if o.err == nil {
			t.Errorf("the dead waiter obtained the lock")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the dead waiter's Lock did not return after Close")
	}
	noLeftovers(t, s, name)
}

// testFairTryLockYields checks that a fair TryLock yields to queued waiters
// even when the lock is free, and records nothing; a plain TryLock ignores
// the queue.
func testFairTryLockYields(t *testing.T, s *Store) {
	const name = "locktest/fair-trylock"
	if fairUnsupported(t, s, name) {
		return
	}
	const lockTTL = 10 * time.Second // queue entries live 5s
	opts := []dlock.Option{dlock.Fair(), dlock.WithTTL(lockTTL)}
	holder := lock(t, client(t, s).Mutex(name, opts...))

	// A queues, then stalls: once the holder releases, the lock is free,
	// with A at the head of the queue.
	stalled := newProbe(s.NewBackend(t))
	busyA, onBusyA := busySignal()
	outA := goLock(t.Context(), clientOn(t, stalled.backend()).Mutex(name, append(opts, onBusyA)...).Lock)
	waitBusy(t, "waiter A", busyA, outA)
	stalled.pause()
	defer stalled.resume()
	unlock(t, holder)

	c := client(t, s)
	l, err := c.Mutex(name, opts...).TryLock(t.Context())
	if no := notObtained(t, "fair TryLock with a waiter queued", l, err); no.Position != 0 {
		t.Errorf("fair TryLock: Position %d, want 0 (a TryLock does not queue)", no.Position)
	}
	if handsOff(t, s) {
		// The release handed the lock to A: it is held, for A, though A
		// has not heard of it yet.
		l, err := c.Mutex(name, dlock.WithTTL(lockTTL)).TryLock(t.Context())
		notObtained(t, "plain TryLock of a lock handed to the queue's head", l, err)
	} else {
		// A plain TryLock ignores the queue (a name is fair for all or none).
		plain, err := c.Mutex(name, dlock.WithTTL(lockTTL)).TryLock(t.Context())
		if err != nil {
			t.Fatalf("plain TryLock on a free lock with a fair queue: %v", err)
		}
		unlock(t, plain)
	}
	// D queues second (first when A holds the lock already): the TryLock
	// left no entry ahead of it.
	want := 2
	if handsOff(t, s) {
		want = 1
	}
	busyD, onBusyD := busySignal()
	outD := goLock(t.Context(), client(t, s).Mutex(name, append(opts, onBusyD)...).Lock)
	if e := waitBusy(t, "waiter D", busyD, outD); e.Position != want {
		t.Errorf("waiter D: Position %d, want %d", e.Position, want)
	}

	stalled.resume()
	la := waitLease(t, "waiter A", outA, 10*time.Second)
	notYet(t, "waiter D", outD)
	unlock(t, la)
	unlock(t, waitLease(t, "waiter D", outD, 10*time.Second))
	noLeftovers(t, s, name)
}

// testGivenUpLeavesAtOnce checks that a wait that ends has left the queue,
// or withdrawn its writer intent, by the time Lock returns, or soon after
// on a store slow to answer (see afterCleanUp): the next request sees the
// lock as free as it is, not blocked by a waiter that has gone until its
// place lapses. A reentrant fair handle's token may hold the lock again later, so it
// cannot be released; its queue entry must go all the same.
func testGivenUpLeavesAtOnce(t *testing.T, s *Store) {
	cases := []struct {
		name string
		opts []dlock.Option
		need driver.Capability
		rw   bool
	}{
		{"fair", []dlock.Option{dlock.Fair()}, driver.CapFair, false},
		{"fair-reentrant", []dlock.Option{dlock.Fair(), dlock.Reentrant()}, driver.CapFair, false},
		{"writer", nil, driver.CapShared, true},
	}
	for _, tc := range cases {
		name := "locktest/given-up-" + tc.name
		if !supports(t, s, tc.need) {
			continue
		}
		// Long TTLs: an entry left behind would block the check for seconds.
		opts := append([]dlock.Option{dlock.WithTTL(10 * time.Second)}, tc.opts...)
		holderC, waiterC, probeC := client(t, s), client(t, s), client(t, s)
		busy, onBusy := busySignal()
		for round := range 4 {
			var holder *dlock.Lease
			var waitFn func(context.Context) (*dlock.Lease, error)
			if tc.rw {
				holder = within(t, "RLock", holderC.RWMutex(name, opts...).RLock)
				waitFn = waiterC.RWMutex(name, append(opts, onBusy)...).Lock
			} else {
				holder = lock(t, holderC.Mutex(name, opts...))
				waitFn = waiterC.Mutex(name, append(opts, onBusy)...).Lock
			}
			ctx, cancel := context.WithCancel(t.Context())
			out := goLock(ctx, waitFn)
			waitBusy(t, tc.name+" waiter", busy, out)
			cancel()
			if o := <-out; !errors.Is(o.err, dlock.ErrNotObtained) {
				t.Fatalf("%s, round %d: cancelled Lock = %v, want ErrNotObtained", tc.name, round, o.err)
			}
			if tc.rw {
				// A reader is let in at once: the writer that gave up no
				// longer waits.
				l, err := afterCleanUp(probeC.RWMutex(name).TryRLock)
				if err != nil {
					t.Fatalf("%s, round %d: TryRLock after the writer gave up = %v", tc.name, round, err)
				}
				unlock(t, l)
				unlock(t, holder)
				continue
			}
			unlock(t, holder)
			// The lock is free and nobody waits: a fair TryLock gets it.
			l, err := afterCleanUp(probeC.Mutex(name, dlock.Fair()).TryLock)
			if err != nil {
				t.Fatalf("%s, round %d: fair TryLock of the free lock after the waiter gave up = %v", tc.name, round, err)
			}
			unlock(t, l)
		}
		noLeftovers(t, s, name)
	}
}

// afterCleanUp tries try, a TryLock, until it succeeds or 2s pass, and
// returns its last outcome. A wait that gives up has its clean-up answered
// before Lock returns when the store answers within settleWait (250ms), and
// goes on in the background otherwise (a loaded machine): either way it
// lands well before a place left behind would lapse (the QueueTTL, 5s).
func afterCleanUp(try func(context.Context) (*dlock.Lease, error)) (*dlock.Lease, error) {
	deadline := time.Now().Add(2 * time.Second)
	for {
		l, err := try(context.Background())
		if err == nil || time.Now().After(deadline) {
			return l, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}
