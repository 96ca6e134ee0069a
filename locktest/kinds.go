package locktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// testKindsLeaveNothing checks that readers, permits, fair waiters and
// writers that waited leave nothing on the store once they released or
// gave up (cancelled, or WithWait elapsed). Each part is checked within 3s
// of its first waiter: queue entries and writer intents live 5s, so they
// must have been removed, not left to lapse.
func testKindsLeaveNothing(t *testing.T, s *Store) {
	const rwName, semName, fairName = "locktest/kinds-rw", "locktest/kinds-sem", "locktest/kinds-fair"
	shared, sem, fair := supports(t, s, driver.CapShared), supports(t, s, driver.CapSemaphore), supports(t, s, driver.CapFair)

	// giveUp starts a waiter, waits until it was refused once (it has
	// queued or recorded an intent, if it does), then cancels it.
	giveUp := func(what string, lock func(context.Context) (*dlock.Lease, error), busy <-chan *dlock.NotObtainedError) {
		t.Helper()
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		out := goLock(ctx, lock)
		waitBusy(t, what, busy, out)
		cancel()
		select {
		case o := <-out:
			if !errors.Is(o.err, dlock.ErrNotObtained) {
				t.Fatalf("%s cancelled = %v, want ErrNotObtained", what, o.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s did not return after cancellation", what)
		}
	}
	// timeOut starts a waiter whose WithWait elapses.
	timeOut := func(what string, lock func(context.Context) (*dlock.Lease, error)) {
		t.Helper()
		if _, err := lock(t.Context()); !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s = %v, want ErrNotObtained and DeadlineExceeded", what, err)
		}
	}
	short := dlock.WithWait(300 * time.Millisecond)

	// done releases the part's holds and checks that nothing is left.
	var held []*dlock.Lease
	done := func(name string) {
		t.Helper()
		for _, l := range held {
			unlock(t, l)
		}
		held = nil
		noLeftoversWithin(t, s, 3*time.Second, name)
	}
	if shared {
		held = append(held,
			within(t, "RLock", client(t, s).RWMutex(rwName).RLock),
			tryGet(t, "TryRLock", client(t, s).RWMutex(rwName).TryRLock))
		busy, onBusy := busySignal()
		giveUp("a writer waiting for readers", client(t, s).RWMutex(rwName, onBusy).Lock, busy)
		timeOut("a writer waiting for readers", client(t, s).Mutex(rwName, short).Lock)
		if fair {
			busy, onBusy := busySignal()
			giveUp("a fair writer waiting for readers", client(t, s).Mutex(rwName, dlock.Fair(), onBusy).Lock, busy)
			timeOut("a fair writer waiting for readers", client(t, s).Mutex(rwName, dlock.Fair(), short).Lock)
		}
		done(rwName)
	}
	if sem {
		for range 2 {
			held = append(held, tryGet(t, "TryAcquire", client(t, s).Semaphore(semName, 2).TryAcquire))
		}
		busy, onBusy := busySignal()
		giveUp("an Acquire at the limit", client(t, s).Semaphore(semName, 2, onBusy).Acquire, busy)
		timeOut("an Acquire at the limit", client(t, s).Semaphore(semName, 2, short).Acquire)
		busy, onBusy = busySignal()
		giveUp("a writer waiting for permits", client(t, s).Mutex(semName, onBusy).Lock, busy)
		done(semName)
	}
	if fair {
		held = append(held, lock(t, client(t, s).Mutex(fairName, dlock.Fair())))
		busy, onBusy := busySignal()
		giveUp("a fair waiter", client(t, s).Mutex(fairName, dlock.Fair(), onBusy).Lock, busy)
		timeOut("a fair waiter", client(t, s).Mutex(fairName, dlock.Fair(), short).Lock)
		done(fairName)
	}
	if !shared && !sem && !fair {
		held = append(held, lock(t, client(t, s).Mutex(rwName)))
		timeOut("a waiter", client(t, s).Mutex(rwName, short).Lock)
		done(rwName)
	}
}

// testKindsInvalid checks the options and counts that read-write locks and
// semaphores refuse, whatever the backend.
func testKindsInvalid(t *testing.T, s *Store) {
	c := client(t, s)
	type calls = map[string]func(context.Context) (*dlock.Lease, error)
	rwCalls := func(rw *dlock.RWMutex) calls {
		return calls{"RLock": rw.RLock, "TryRLock": rw.TryRLock, "Lock": rw.Lock, "TryLock": rw.TryLock}
	}
	semCalls := func(s *dlock.Semaphore) calls {
		return calls{"Acquire": s.Acquire, "TryAcquire": s.TryAcquire}
	}
	for what, opt := range map[string]dlock.Option{
		"Reentrant": dlock.Reentrant(), "WithOwnerID": dlock.WithOwnerID("job-1"),
	} {
		mustBeInvalid(t, "of an RWMutex with "+what, rwCalls(c.RWMutex("locktest/kinds-invalid", opt)))
		mustBeInvalid(t, "of a Semaphore with "+what, semCalls(c.Semaphore("locktest/kinds-invalid", 2, opt)))
	}
	if !supports(t, s, driver.CapFairShared) {
		mustBeInvalid(t, "of an RWMutex with Fair", rwCalls(c.RWMutex("locktest/kinds-invalid", dlock.Fair())))
		mustBeInvalid(t, "of a Semaphore with Fair", semCalls(c.Semaphore("locktest/kinds-invalid", 2, dlock.Fair())))
	}
	for _, n := range []int{0, -1, dlock.MaxPermits + 1} {
		mustBeInvalid(t, "of a Semaphore with a bad permit count", semCalls(c.Semaphore("locktest/kinds-invalid", n)))
	}
	mustBeInvalid(t, "of a Semaphore with WithLockDelay", semCalls(c.Semaphore("locktest/kinds-invalid", 2, dlock.WithLockDelay(time.Second))))
	rw := c.RWMutex("locktest/kinds-invalid", dlock.WithLockDelay(time.Second))
	mustBeInvalid(t, "of an RWMutex reader with WithLockDelay", calls{"RLock": rw.RLock, "TryRLock": rw.TryRLock})
	mustBeInvalid(t, "of an RWMutex with an empty name", rwCalls(c.RWMutex("")))
	mustBeInvalid(t, "of a Semaphore with an empty name", semCalls(c.Semaphore("", 1)))
	mustBeInvalid(t, "of an RWMutex of a nil Client", rwCalls((*dlock.Client)(nil).RWMutex("x")))
	mustBeInvalid(t, "of a Semaphore of a nil Client", semCalls((*dlock.Client)(nil).Semaphore("x", 1)))

	if rw := c.RWMutex("locktest/kinds-name"); rw.Name() != "locktest/kinds-name" {
		t.Errorf("RWMutex.Name() = %q", rw.Name())
	}
	if sem := c.Semaphore("locktest/kinds-name", 7); sem.Name() != "locktest/kinds-name" || sem.Permits() != 7 {
		t.Errorf("Semaphore Name(), Permits() = %q, %d", sem.Name(), sem.Permits())
	}
}
