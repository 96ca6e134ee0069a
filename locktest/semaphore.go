package locktest

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// semUnsupported checks that a backend without semaphores refuses them. It
// reports whether it did the checking.
func semUnsupported(t *testing.T, s *Store, name string) bool {
	if supports(t, s, driver.CapSemaphore) {
		return false
	}
	sem := client(t, s).Semaphore(name, 2)
	mustBeInvalid(t, "of a Semaphore on a backend without semaphores", map[string]func(context.Context) (*dlock.Lease, error){
		"Acquire": sem.Acquire, "TryAcquire": sem.TryAcquire,
	})
	return true
}

// testSemaphoreLimit checks that at most Permits permits are held at once,
// across Clients, and that a refusal tells how many are in use.
func testSemaphoreLimit(t *testing.T, s *Store) {
	const name, permits = "locktest/sem-limit", 3
	if semUnsupported(t, s, name) {
		return
	}
	var held []*dlock.Lease
	var owners []string
	var last uint64
	for i := range permits {
		l := tryGet(t, "TryAcquire below the limit", client(t, s).Semaphore(name, permits).TryAcquire)
		if l.Fence() <= last {
			t.Errorf("permit %d: fence %d after %d, want strictly greater", i, l.Fence(), last)
		}
		last = l.Fence()
		held = append(held, l)
		owners = append(owners, l.Owner())
	}
	no := tryRefused(t, "TryAcquire at the limit", client(t, s).Semaphore(name, permits).TryAcquire)
	if no.Shared != permits || no.Permits != permits || no.WriterWaiting || !slices.Contains(owners, no.Holder) {
		t.Errorf("refused with %+v, want Shared %d, Permits %d and a holder's owner", no, permits, permits)
	}
	for _, l := range held {
		unlock(t, l)
	}

	const clients, workers, rounds = 3, 3, 8
	var inUse, most, grants atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, clients*workers)
	for range clients {
		sem := client(t, s).Semaphore(name, permits)
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
					l, err := sem.Acquire(ctx)
					cancel()
					if err != nil {
						errs <- err
						return
					}
					n := inUse.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					grants.Add(1)
					time.Sleep(time.Millisecond)
					inUse.Add(-1)
					if err := l.Unlock(t.Context()); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if m := most.Load(); m > permits {
		t.Errorf("%d permits in use at once, want at most %d", m, permits)
	}
	if got, want := grants.Load(), int32(clients*workers*rounds); got != want {
		t.Errorf("%d grants, want %d", got, want)
	}
	t.Logf("at most %d of %d permits in use at once", most.Load(), permits)
	noLeftovers(t, s, name)
}

// testSemaphorePermitExpires checks that the permit of a holder that
// stopped renewing comes back when its lease expires, and that the holder
// was told first.
func testSemaphorePermitExpires(t *testing.T, s *Store) {
	const name = "locktest/sem-expire"
	if semUnsupported(t, s, name) {
		return
	}
	keep := tryGet(t, "TryAcquire", client(t, s).Semaphore(name, 2).TryAcquire)
	crashed := tryGet(t, "TryAcquire", client(t, s).Semaphore(name, 2,
		dlock.WithTTL(ttl), dlock.WithAutoRenew(false), dlock.WithSafetyMargin(ttl/4)).TryAcquire)
	sem := client(t, s).Semaphore(name, 2)
	tryRefused(t, "TryAcquire with both permits held", sem.TryAcquire)
	got := within(t, "Acquire of the crashed holder's permit", sem.Acquire)
	select {
	case <-crashed.Done():
	default:
		t.Fatal("a permit was granted while the crashed holder's lease was still shown as held")
	}
	if r := lostReason(t, crashed.Err()); r != dlock.LostExpired {
		t.Errorf("reason = %v, want %v", r, dlock.LostExpired)
	}
	if err := keep.Err(); err != nil {
		t.Errorf("the renewed permit ended: %v", err)
	}
	if got.Fence() <= crashed.Fence() {
		t.Errorf("fence %d after %d, want greater", got.Fence(), crashed.Fence())
	}
	if err := crashed.Unlock(t.Context()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Unlock of the expired permit = %v, want ErrNotHeld", err)
	}
	unlock(t, got)
	unlock(t, keep)
	noLeftovers(t, s, name)
}

// testSemaphoreLimitBinds checks that the live holds of a name bind its
// kind and limit: a semaphore of another size, a reader on a
// semaphore's name and a permit on a name held by readers are refused at
// once, by TryAcquire and by a waiting Acquire alike, with a
// *dlock.ConflictError naming both; a writer is not (it waits, as it
// always did); once the holds are released or have expired, any kind may
// take the name.
func testSemaphoreLimitBinds(t *testing.T, s *Store) {
	const name = "locktest/sem-binds"
	if semUnsupported(t, s, name) {
		return
	}
	rw := supports(t, s, driver.CapShared)
	three := client(t, s).Semaphore(name, 3)
	two := client(t, s).Semaphore(name, 2)
	readers := client(t, s).RWMutex(name)
	h := []*dlock.Lease{tryGet(t, "TryAcquire with 3 permits", three.TryAcquire), tryGet(t, "TryAcquire with 3 permits", three.TryAcquire)}

	mustConflict(t, "TryAcquire with 2 permits while 2 of 3 are held", two.TryAcquire, 2, 3)
	mustConflict(t, "Acquire with 2 permits while 2 of 3 are held", two.Acquire, 2, 3)
	if rw {
		mustConflict(t, "TryRLock while 2 permits of 3 are held", readers.TryRLock, 0, 3)
		mustConflict(t, "RLock while 2 permits of 3 are held", readers.RLock, 0, 3)
	}
	mustBeHeldByOther(t, client(t, s).Mutex(name)) // a writer waits for permits: no conflict
	h = append(h, tryGet(t, "TryAcquire with 3 permits", three.TryAcquire))
	unlock(t, h[0])
	unlock(t, h[1])
	mustConflict(t, "TryAcquire with 2 permits while 1 of 3 is held", two.TryAcquire, 2, 3)
	unlock(t, h[2])

	// Free again: the next holds set the kind.
	p := tryGet(t, "TryAcquire with 2 permits once none is held", two.TryAcquire)
	mustConflict(t, "TryAcquire with 3 permits while 1 of 2 is held", three.TryAcquire, 3, 2)
	unlock(t, p)
	if rw {
		r := tryGet(t, "TryRLock once no permit is held", readers.TryRLock)
		mustConflict(t, "TryAcquire with 2 permits while a reader holds", two.TryAcquire, 2, 0)
		mustConflict(t, "Acquire with 3 permits while a reader holds", three.Acquire, 3, 0)
		r2 := tryGet(t, "a second TryRLock", readers.TryRLock)
		unlock(t, r)
		unlock(t, r2)
	}

	// A hold that expires, unreleased, binds the name no longer.
	lapsing := tryGet(t, "TryAcquire with 3 permits", client(t, s).Semaphore(name, 3,
		dlock.WithTTL(ttl), dlock.WithAutoRenew(false)).TryAcquire)
	mustConflict(t, "TryAcquire with 2 permits while a permit of 3 lives", two.TryAcquire, 2, 3)
	waitDone(t, lapsing, endWait)
	// The store frees it by its own clock, and some count TTLs in whole
	// seconds (etcd: about 2s for this TTL): as long as within gives an
	// Acquire.
	deadline := time.Now().Add(10 * time.Second)
	for {
		l, err := two.TryAcquire(t.Context())
		if err == nil {
			unlock(t, l)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("TryAcquire with 2 permits after the permit of 3 expired = %v, want a grant", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	noLeftovers(t, s, name)
}

// mustConflict checks that call fails at once with a *dlock.ConflictError
// for a request of permits refused by holds of held permits (0: readers).
func mustConflict(t *testing.T, what string, call func(context.Context) (*dlock.Lease, error), permits, held int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	start := time.Now()
	l, err := call(ctx)
	if err == nil {
		_ = l.Unlock(t.Context())
		t.Fatalf("%s: granted, want a *dlock.ConflictError", what)
	}
	var ce *dlock.ConflictError
	if !errors.As(err, &ce) || !errors.Is(err, dlock.ErrConflict) || errors.Is(err, dlock.ErrInvalid) {
		t.Fatalf("%s = %v, want a *dlock.ConflictError matching ErrConflict and not ErrInvalid", what, err)
	}
	if ce.Permits != permits || ce.HeldPermits != held {
		t.Errorf("%s: %+v, want Permits %d, HeldPermits %d", what, ce, permits, held)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("%s took %v, want a refusal at once", what, took)
	}
}

// testSemaphorePermitLeases checks that each permit is a lease of its own:
// its own fence, renewal, expiry and loss.
func testSemaphorePermitLeases(t *testing.T, s *Store) {
	const name, permits = "locktest/sem-leases", 3
	if semUnsupported(t, s, name) {
		return
	}
	// The auto-renewed permits live longer than ttl, so that a loaded
	// machine cannot hold their renewals back past their deadline: what
	// is checked of them is that another permit's release leaves them.
	const renewedTTL = 5 * ttl
	sem := client(t, s).Semaphore(name, permits, dlock.WithTTL(renewedTTL))
	p1 := tryGet(t, "TryAcquire", sem.TryAcquire)
	p2 := tryGet(t, "TryAcquire", sem.TryAcquire)
	manual := client(t, s).Semaphore(name, permits,
		dlock.WithTTL(ttl), dlock.WithAutoRenew(false), dlock.WithSafetyMargin(ttl/4))
	p3 := tryGet(t, "TryAcquire", manual.TryAcquire)
	if !(p1.Fence() < p2.Fence() && p2.Fence() < p3.Fence()) {
		t.Errorf("fences %d, %d, %d, want strictly increasing", p1.Fence(), p2.Fence(), p3.Fence())
	}
	if ins, ok := s.NewBackend(t).(driver.Inspector); ok {
		info, held, err := ins.Inspect(t.Context(), name)
		var fences []uint64
		for _, h := range info.Shared {
			fences = append(fences, h.Fence)
		}
		if err != nil || !held || info.Owner != "" || info.Limit != permits ||
			!slices.Equal(fences, []uint64{p1.Fence(), p2.Fence(), p3.Fence()}) {
			t.Errorf("Inspect = %+v, %v, %v; want three shared holds, oldest first, and Limit %d", info, held, err, permits)
		}
	}
	for refreshed, restarts := 0, 0; refreshed < 3; {
		// A quarter of the TTL, or half of what is left of the permit on a
		// machine slow enough that the last refresh ate into it: what is
		// checked is that a refresh in time moves the deadline on.
		time.Sleep(min(ttl/4, time.Until(p3.Deadline())/2))
		before := p3.Deadline()
		if err := p3.Refresh(t.Context()); err != nil {
			// A refresh that a loaded machine kept from the store until
			// the permit's deadline was not in time: the permit is lost,
			// and the check starts over with another.
			var lost *dlock.LostError
			if restarts < 5 && errors.As(err, &lost) && (lost.Reason == dlock.LostUnreachable || lost.Reason == dlock.LostExpired) {
				restarts++
				ctx, cancel := context.WithTimeout(t.Context(), 10*ttl)
				next, aerr := manual.Acquire(ctx)
				cancel()
				if aerr != nil {
					t.Fatalf("Acquire of another permit after a refresh came too late (%v): %v", err, aerr)
				}
				p3, refreshed = next, 0
				continue
			}
			t.Fatalf("Refresh of a permit: %v", err)
		}
		if !p3.Deadline().After(before) {
			t.Fatal("Refresh did not move the permit's deadline on")
		}
		refreshed++
	}
	waitDone(t, p3, endWait)
	if r := lostReason(t, p3.Err()); r != dlock.LostExpired {
		t.Errorf("reason = %v, want %v", r, dlock.LostExpired)
	}
	if err := p3.Refresh(t.Context()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Refresh after loss = %v, want ErrNotHeld", err)
	}
	// The renewed permits outlived it, and one's release leaves the other.
	if err := p1.Err(); err != nil {
		t.Fatalf("auto-renewed permit ended: %v", err)
	}
	unlock(t, p1)
	if err := p2.Err(); err != nil {
		t.Fatalf("permit ended with another's release: %v", err)
	}
	if ins, ok := s.NewBackend(t).(driver.Inspector); ok {
		// Removed behind the holder's back: the next renewal notices.
		if _, held, err := ins.ForceRelease(t.Context(), name); err != nil || !held {
			t.Fatalf("ForceRelease = %v, %v; want a permit removed", held, err)
		}
		waitDone(t, p2, max(2*renewedTTL, endWait))
		if r := lostReason(t, p2.Err()); r != dlock.LostMissing {
			t.Errorf("reason = %v, want %v", r, dlock.LostMissing)
		}
	} else {
		unlock(t, p2)
	}
	noLeftovers(t, s, name)
}

// testSemaphoreWaitWokenByRelease checks that a release wakes a waiting
// Acquire, without polling on stores with notifications.
func testSemaphoreWaitWokenByRelease(t *testing.T, s *Store) {
	const name = "locktest/sem-woken"
	if semUnsupported(t, s, name) {
		return
	}
	held := tryGet(t, "TryAcquire", client(t, s).Semaphore(name, 1, dlock.WithTTL(time.Minute)).TryAcquire)
	retry := dlock.ExponentialBackoff(10*time.Millisecond, 50*time.Millisecond)
	if hasNotifier(t, s) {
		// Left to its retry schedule or the holder's TTL it would wait a minute.
		retry = dlock.ExponentialBackoff(time.Hour, time.Hour)
	}
	busy, onBusy := busySignal()
	out := goLock(t.Context(), client(t, s).Semaphore(name, 1, dlock.WithRetry(retry), onBusy).Acquire)
	waitBusy(t, "Acquire", busy, out)
	time.Sleep(100 * time.Millisecond) // let the waiter settle into its wait
	unlock(t, held)
	unlock(t, waitLease(t, "Acquire woken by the release", out, 10*time.Second))
	noLeftovers(t, s, name)
}
