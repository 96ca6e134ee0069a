package locktest

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// rwUnsupported checks that a backend without read-write locks refuses
// readers. It reports whether it did the checking.
func rwUnsupported(t *testing.T, s *Store, name string) bool {
	if supports(t, s, driver.CapShared) {
		return false
	}
	rw := client(t, s).RWMutex(name)
	mustBeInvalid(t, "of an RWMutex on a backend without read-write locks", map[string]func(context.Context) (*dlock.Lease, error){
		"RLock": rw.RLock, "TryRLock": rw.TryRLock,
	})
	return true
}

// within calls lock with a context that ends after 10s, failing t on error.
func within(t *testing.T, what string, lock func(context.Context) (*dlock.Lease, error)) *dlock.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	l, err := lock(ctx)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return l
}

// tryGet makes an attempt, failing t when it is refused.
//
// A grant the store made too late to be trusted, and that the Client gave
// back (NotObtainedError.Slow, a loaded machine against a short TTL), is
// not a refusal: the attempt is made again, up to 10 times.
func tryGet(t *testing.T, what string, try func(context.Context) (*dlock.Lease, error)) *dlock.Lease {
	t.Helper()
	for attempt := 1; ; attempt++ {
		l, err := try(t.Context())
		var slow *dlock.NotObtainedError
		if err != nil && errors.As(err, &slow) && slow.Slow > 0 && attempt < 10 {
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return l
	}
}

// tryRefused makes one attempt, failing t unless it is refused, and returns
// the refusal.
func tryRefused(t *testing.T, what string, try func(context.Context) (*dlock.Lease, error)) *dlock.NotObtainedError {
	t.Helper()
	l, err := try(t.Context())
	return notObtained(t, what, l, err)
}

// testRWReadersShare checks that readers in several Clients hold at once,
// each with a lease and fence of its own, and keep writers out.
func testRWReadersShare(t *testing.T, s *Store) {
	const name, readers = "locktest/rw-share", 3
	if rwUnsupported(t, s, name) {
		return
	}
	var leases []*dlock.Lease
	var owners []string
	var last uint64
	for i := range readers {
		rw := client(t, s).RWMutex(name)
		var l *dlock.Lease
		if i%2 == 0 {
			l = within(t, "RLock with readers in", rw.RLock)
		} else {
			l = tryGet(t, "TryRLock with readers in", rw.TryRLock)
		}
		if l.Fence() <= last {
			t.Errorf("reader %d: fence %d after %d, want strictly greater", i, l.Fence(), last)
		}
		last = l.Fence()
		leases = append(leases, l)
		owners = append(owners, l.Owner())
	}
	w := client(t, s)
	no := tryRefused(t, "writer's TryLock with readers in", w.RWMutex(name).TryLock)
	if no.Shared != readers || no.WriterWaiting || !slices.Contains(owners, no.Holder) {
		t.Errorf("writer refused with %+v, want Shared %d and a reader as Holder", no, readers)
	}
	mustBeHeldByOther(t, w.Mutex(name))
	for i, l := range leases {
		if err := l.Err(); err != nil {
			t.Errorf("reader %d: lease ended: %v", i, err)
		}
		unlock(t, l)
	}
	wl := tryGet(t, "writer's TryLock after the readers left", w.RWMutex(name).TryLock)
	if wl.Fence() <= last {
		t.Errorf("writer's fence %d after %d, want strictly greater", wl.Fence(), last)
	}
	unlock(t, wl)
	noLeftovers(t, s, name)
}

// testRWWriterExcludes checks that a writer (RWMutex.Lock or a plain Mutex
// of the same name) excludes readers and other writers, and a reader
// excludes writers of both kinds.
func testRWWriterExcludes(t *testing.T, s *Store) {
	const name = "locktest/rw-excludes"
	if rwUnsupported(t, s, name) {
		return
	}
	a, b := client(t, s), client(t, s)
	for _, writer := range []struct {
		what string
		lock func(context.Context) (*dlock.Lease, error)
	}{
		{"RWMutex.Lock", a.RWMutex(name).Lock},
		{"Mutex.Lock", a.Mutex(name).Lock},
	} {
		w := within(t, writer.what, writer.lock)
		no := tryRefused(t, "TryRLock while "+writer.what+" holds", b.RWMutex(name).TryRLock)
		if no.Holder != w.Owner() || no.WriterWaiting {
			t.Errorf("reader refused with %+v, want the writer %q as Holder", no, w.Owner())
		}
		if no := tryRefused(t, "RWMutex.TryLock while "+writer.what+" holds", b.RWMutex(name).TryLock); no.Holder != w.Owner() {
			t.Errorf("writer refused with %+v, want the writer %q as Holder", no, w.Owner())
		}
		mustBeHeldByOther(t, b.Mutex(name))
		unlock(t, w)
	}
	r := tryGet(t, "TryRLock on a free lock", b.RWMutex(name).TryRLock)
	if no := tryRefused(t, "Mutex.TryLock while a reader holds", a.Mutex(name).TryLock); no.Shared != 1 || no.Holder != r.Owner() {
		t.Errorf("plain Mutex refused with %+v, want Shared 1 and the reader %q as Holder", no, r.Owner())
	}
	tryRefused(t, "RWMutex.TryLock while a reader holds", a.RWMutex(name).TryLock)
	unlock(t, r)
	unlock(t, tryGet(t, "Mutex.TryLock after the reader left", a.Mutex(name).TryLock))
	noLeftovers(t, s, name)
}

// testRWWriterNotStarved checks that a writer waiting for readers keeps new
// readers out, gets the lock when the readers leave, and lets the readers
// that waited in after it.
func testRWWriterNotStarved(t *testing.T, s *Store) {
	const name = "locktest/rw-starve"
	if rwUnsupported(t, s, name) {
		return
	}
	first := within(t, "first reader", client(t, s).RWMutex(name).RLock)

	busyW, onBusyW := busySignal()
	outW := goLock(t.Context(), client(t, s).RWMutex(name, dlock.WithMetadata("waiting writer"), onBusyW).Lock)
	// Refused because of the reader: its intent is recorded by now.
	if e := waitBusy(t, "writer", busyW, outW); e.Shared != 1 {
		t.Errorf("writer refused with %+v, want Shared 1", e)
	}
	no := tryRefused(t, "TryRLock with a writer waiting", client(t, s).RWMutex(name).TryRLock)
	if !no.WriterWaiting || !strings.HasSuffix(no.Holder, "|waiting writer") {
		t.Errorf("reader refused with %+v, want WriterWaiting naming the waiting writer", no)
	}
	outR := goLock(t.Context(), client(t, s).RWMutex(name).RLock)

	unlock(t, first)
	w := waitLease(t, "writer after the first reader left", outW, 10*time.Second)
	notYet(t, "reader that waited", outR)
	unlock(t, w)
	r := waitLease(t, "reader after the writer", outR, 10*time.Second)
	if r.Fence() <= w.Fence() {
		t.Errorf("reader's fence %d after the writer's %d, want strictly greater", r.Fence(), w.Fence())
	}
	unlock(t, r)
	noLeftovers(t, s, name)
}

// testRWReaderCrashExpires checks that a reader that stops renewing lets a
// writer in once its lease expires, and was told first.
func testRWReaderCrashExpires(t *testing.T, s *Store) {
	const name = "locktest/rw-crash"
	if rwUnsupported(t, s, name) {
		return
	}
	r := within(t, "reader", client(t, s).RWMutex(name, dlock.WithTTL(ttl), dlock.WithAutoRenew(false), dlock.WithSafetyMargin(ttl/4)).RLock)
	w := within(t, "writer", client(t, s).RWMutex(name).Lock)
	select {
	case <-r.Done():
	default:
		t.Fatal("a writer got the lock while the reader's lease was still shown as held")
	}
	if reason := lostReason(t, r.Err()); reason != dlock.LostExpired {
		t.Errorf("reason = %v, want %v", reason, dlock.LostExpired)
	}
	if w.Fence() <= r.Fence() {
		t.Errorf("writer's fence %d after the reader's %d, want greater", w.Fence(), r.Fence())
	}
	if err := r.Unlock(t.Context()); !errors.Is(err, dlock.ErrNotHeld) {
		t.Errorf("Unlock of the expired read lease = %v, want ErrNotHeld", err)
	}
	unlock(t, w)
	noLeftovers(t, s, name)
}

// testRWFences checks that read and write grants draw strictly increasing
// fences from one counter.
func testRWFences(t *testing.T, s *Store) {
	const name = "locktest/rw-fences"
	if rwUnsupported(t, s, name) {
		return
	}
	a, b := client(t, s), client(t, s)
	var last uint64
	step := func(what string, l *dlock.Lease) {
		t.Helper()
		if l.Fence() <= last {
			t.Fatalf("%s: fence %d after %d, want strictly greater", what, l.Fence(), last)
		}
		last = l.Fence()
	}
	for i := range 30 {
		r1 := tryGet(t, "TryRLock", a.RWMutex(name).TryRLock)
		step("reader", r1)
		r2 := tryGet(t, "TryRLock", b.RWMutex(name).TryRLock)
		step("second reader", r2)
		unlock(t, r1)
		unlock(t, r2)
		var w *dlock.Lease
		if i%2 == 0 {
			w = tryGet(t, "RWMutex.TryLock", a.RWMutex(name).TryLock)
		} else {
			w = tryGet(t, "Mutex.TryLock", b.Mutex(name).TryLock)
		}
		step("writer", w)
		unlock(t, w)
	}
}
