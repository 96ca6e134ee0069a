package dlock_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memlock"
)

// plainBackend hides every optional interface of memlock but the contract's
// core, like a backend without the new lock kinds.
type plainBackend struct{ driver.Backend }

func TestKindsNeedCapabilities(t *testing.T) {
	c := dlock.New(plainBackend{memlock.New()})
	defer c.Close()
	ctx := t.Context()
	for name, call := range map[string]func() error{
		"RLock":     func() error { _, err := c.RWMutex("x").RLock(ctx); return err },
		"TryRLock":  func() error { _, err := c.RWMutex("x").TryRLock(ctx); return err },
		"Semaphore": func() error { _, err := c.Semaphore("x", 2).Acquire(ctx); return err },
		"Fair":      func() error { _, err := c.Mutex("x", dlock.Fair()).Lock(ctx); return err },
		"WithLockDelay": func() error {
			_, err := c.Mutex("x", dlock.WithLockDelay(time.Second)).TryLock(ctx)
			return err
		},
	} {
		err := call()
		if !errors.Is(err, dlock.ErrInvalid) || !errors.Is(err, dlock.ErrUnsupported) || !strings.Contains(err.Error(), "not supported by the backend") {
			t.Errorf("%s on a backend without the capability: %v, want ErrInvalid naming it", name, err)
		}
	}
	// The write side is a plain lock: it works everywhere.
	l, err := c.RWMutex("x").Lock(ctx)
	if err != nil {
		t.Fatalf("RWMutex.Lock on a plain backend: %v", err)
	}
	_ = l.Unlock(ctx)
	fc := dlock.New(plainBackend{memlock.New()}, dlock.Fair())
	defer fc.Close()
	if _, err := fc.Mutex("x").TryLock(ctx); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Client-wide Fair on a backend without fair queues: %v, want ErrInvalid", err)
	}
}

func TestKindOptionsRefused(t *testing.T) {
	c := dlock.New(memlock.New())
	defer c.Close()
	ctx := t.Context()
	cases := map[string]func() error{
		"RWMutex Reentrant":         func() error { _, err := c.RWMutex("x", dlock.Reentrant()).RLock(ctx); return err },
		"RWMutex Fair":              func() error { _, err := c.RWMutex("x", dlock.Fair()).Lock(ctx); return err },
		"RWMutex WithOwnerID":       func() error { _, err := c.RWMutex("x", dlock.WithOwnerID("me")).TryLock(ctx); return err },
		"RLock WithLockDelay":       func() error { _, err := c.RWMutex("x", dlock.WithLockDelay(time.Second)).RLock(ctx); return err },
		"Semaphore 0":               func() error { _, err := c.Semaphore("x", 0).Acquire(ctx); return err },
		"Semaphore -1":              func() error { _, err := c.Semaphore("x", -1).TryAcquire(ctx); return err },
		"Semaphore over MaxPermits": func() error { _, err := c.Semaphore("x", dlock.MaxPermits+1).TryAcquire(ctx); return err },
		"Semaphore Reentrant":       func() error { _, err := c.Semaphore("x", 2, dlock.Reentrant()).TryAcquire(ctx); return err },
		"Semaphore Fair":            func() error { _, err := c.Semaphore("x", 2, dlock.Fair()).TryAcquire(ctx); return err },
		"Semaphore WithLockDelay": func() error {
			_, err := c.Semaphore("x", 2, dlock.WithLockDelay(time.Second)).TryAcquire(ctx)
			return err
		},
		"Semaphore bad name": func() error { _, err := c.Semaphore("", 2).TryAcquire(ctx); return err },
		"Semaphore bad TTL": func() error {
			_, err := c.Semaphore("x", 2, dlock.WithTTL(time.Millisecond)).TryAcquire(ctx)
			return err
		},
	}
	for name, call := range cases {
		if err := call(); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	var nilClient *dlock.Client
	if _, err := nilClient.Semaphore("x", 1).Acquire(ctx); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("Semaphore on a nil Client: %v, want ErrInvalid", err)
	}
	if _, err := nilClient.RWMutex("x").RLock(ctx); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("RWMutex on a nil Client: %v, want ErrInvalid", err)
	}

	// Client-wide defaults that cannot apply to the kinds are refused,
	// naming the option, not dropped.
	for _, o := range []struct {
		name string
		opt  dlock.Option
	}{{"Reentrant", dlock.Reentrant()}, {"Fair", dlock.Fair()}, {"WithOwnerID", dlock.WithOwnerID("svc")}} {
		dc := dlock.New(memlock.New(), o.opt)
		if _, err := dc.RWMutex("y").RLock(ctx); !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), o.name) {
			t.Errorf("RLock on a Client with %s by default: %v, want ErrInvalid naming %s", o.name, err, o.name)
		}
		if _, err := dc.Semaphore("z", 1).TryAcquire(ctx); !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), o.name) {
			t.Errorf("TryAcquire on a Client with %s by default: %v, want ErrInvalid naming %s", o.name, err, o.name)
		}
		// The Client's Mutexes have it.
		l, err := dc.Mutex("m").TryLock(ctx)
		if err != nil {
			t.Errorf("Mutex on a Client with %s by default: %v", o.name, err)
		} else {
			_ = l.Unlock(ctx)
		}
		dc.Close()
	}
}

// TestClientOptionGivenToLock checks that WithLogger, a Client option, is
// refused when given to a lock rather than ignored.
func TestClientOptionGivenToLock(t *testing.T) {
	c := dlock.New(memlock.New())
	defer c.Close()
	ctx := t.Context()
	log := slog.New(slog.DiscardHandler)
	calls := map[string]func() error{
		"Mutex":     func() error { _, err := c.Mutex("x", dlock.WithLogger(log)).TryLock(ctx); return err },
		"RWMutex":   func() error { _, err := c.RWMutex("x", dlock.WithLogger(log)).TryRLock(ctx); return err },
		"Semaphore": func() error { _, err := c.Semaphore("x", 2, dlock.WithLogger(log)).TryAcquire(ctx); return err },
		"Do": func() error {
			return c.Do(ctx, "x", func(context.Context) error { return nil }, dlock.WithLogger(log))
		},
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), "WithLogger") {
			t.Errorf("%s with WithLogger: %v, want ErrInvalid naming WithLogger", name, err)
		}
	}
}

func TestNotObtainedWording(t *testing.T) {
	cases := []struct {
		err  dlock.NotObtainedError
		want string
	}{
		{dlock.NotObtainedError{Name: "a", Holder: "h|pid 1", HolderTTL: 2 * time.Second},
			`dlock: lock "a" not obtained: held by h|pid 1 (expires in 2s)`},
		{dlock.NotObtainedError{Name: "a", Holder: "w|pid 2", HolderTTL: time.Second, WriterWaiting: true},
			`dlock: lock "a" not obtained: a writer is waiting (w|pid 2, for up to 1s more)`},
		{dlock.NotObtainedError{Name: "s", Holder: "p|pid 3", HolderTTL: 3 * time.Second, Shared: 5, Permits: 5},
			`dlock: semaphore "s" not obtained: 5 of 5 permits in use (the first to expire, held by p|pid 3, in 3s)`},
		{dlock.NotObtainedError{Name: "a", Holder: "r|pid 4", HolderTTL: time.Second, Shared: 2},
			`dlock: lock "a" not obtained: held by 2 shared holders (the last to expire, r|pid 4, in 1s)`},
		{dlock.NotObtainedError{Name: "a", Holder: "h|pid 1", HolderTTL: time.Second, Position: 3},
			`dlock: lock "a" not obtained: held by h|pid 1 (expires in 1s); place 3 in the queue`},
		// A store that does not say how long the holder has left (etcd's
		// refusals of a waiting request) leaves the expiry out, rather
		// than saying it is 0.
		{dlock.NotObtainedError{Name: "a", Holder: "h|pid 1"},
			`dlock: lock "a" not obtained: held by h|pid 1`},
		{dlock.NotObtainedError{Name: "a", Holder: "w|pid 2", WriterWaiting: true},
			`dlock: lock "a" not obtained: a writer is waiting (w|pid 2)`},
		{dlock.NotObtainedError{Name: "s", Holder: "p|pid 3", Shared: 5, Permits: 5},
			`dlock: semaphore "s" not obtained: 5 of 5 permits in use (the first to expire, held by p|pid 3)`},
	}
	for _, c := range cases {
		if got := c.err.Error(); got != c.want {
			t.Errorf("got  %s\nwant %s", got, c.want)
		}
		if !errors.Is(&c.err, dlock.ErrNotObtained) {
			t.Errorf("%v does not match ErrNotObtained", &c.err)
		}
	}
}

// A fair waiter whose wait ends leaves the queue at once, so the next one
// is not held up by its entry.
func TestFairCancelledWaiterLeavesQueue(t *testing.T) {
	store := memlock.New()
	ctx := t.Context()
	holder := dlock.New(store)
	defer holder.Close()
	h, err := holder.Mutex("q", dlock.Fair()).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	quitter := dlock.New(store)
	defer quitter.Close()
	qctx, cancel := context.WithCancel(ctx)
	queued := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		_, err := quitter.Mutex("q", dlock.Fair(), dlock.WithOnBusy(func(*dlock.NotObtainedError) {
			select {
			case queued <- struct{}{}:
			default:
			}
		})).Lock(qctx)
		done <- err
	}()
	<-queued
	cancel()
	if err := <-done; !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled fair Lock: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		info, _, err := store.Inspect(ctx, "q")
		if err != nil {
			t.Fatal(err)
		}
		if info.Queued == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cancelled waiter is still queued: %+v", info)
		}
		time.Sleep(5 * time.Millisecond)
	}
	_ = h.Unlock(ctx)
}

// Goroutines of one reentrant fair handle share a token; when some of them
// give up, the one still waiting must still be woken by a release that
// names the token (not only by its refresh timer, seconds later).
func TestReentrantFairWaitersShareWakeUps(t *testing.T) {
	t.Parallel()
	store := memlock.New()
	ctx := t.Context()
	holder := dlock.New(store)
	defer holder.Close()
	h, err := holder.Mutex("rq", dlock.Fair()).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := dlock.New(store)
	defer c.Close()
	busy := make(chan struct{}, 16)
	m := c.Mutex("rq", dlock.Fair(), dlock.Reentrant(), dlock.WithTTL(time.Minute),
		dlock.WithOnBusy(func(*dlock.NotObtainedError) { busy <- struct{}{} }))

	type result struct {
		l   *dlock.Lease
		err error
	}
	start := func(ctx context.Context) chan result {
		out := make(chan result, 1)
		go func() {
			l, err := m.Lock(ctx)
			out <- result{l, err}
		}()
		// Refused twice: by Lock's first attempt, then by the first
		// attempt of the wait, which registers the waiter before it.
		<-busy
		<-busy
		return out
	}
	a := start(ctx)
	bctx, bcancel := context.WithCancel(ctx)
	b := start(bctx)
	cctx, ccancel := context.WithCancel(ctx)
	cw := start(cctx)
	bcancel()
	if r := <-b; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("B: %v", r.err)
	}
	ccancel()
	if r := <-cw; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("C: %v", r.err)
	}
	released := time.Now()
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-a
	if r.err != nil {
		t.Fatalf("A: %v", r.err)
	}
	// The refresh timer would wake A only after min(TTL, 5s)/3 ≈ 1.7s.
	if d := time.Since(released); d > time.Second {
		t.Errorf("A obtained the lock %v after the release: it was not woken by it", d)
	}
	_ = r.l.Unlock(ctx)
}

// TestClientDefaultOverridden: a Client default that a kind refuses is no
// reason to refuse a lock that overrides it (WithOwnerID("") takes the
// Client's owner ID away).
func TestClientDefaultOverridden(t *testing.T) {
	c := dlock.New(memlock.New(), dlock.WithOwnerID("svc"))
	defer c.Close()
	l, err := c.RWMutex("x", dlock.WithOwnerID("")).TryRLock(t.Context())
	if err != nil {
		t.Fatalf("RWMutex with the Client's owner ID overridden to none: %v", err)
	}
	_ = l.Unlock(t.Context())
}

// A semaphore limit that disagrees with the holders' is another process's
// doing, not a bad argument of the caller's: ErrConflict, not ErrInvalid,
// whether the refused limit is smaller or larger than the held one.
func TestSemaphoreLimitConflictIsNotInvalid(t *testing.T) {
	ctx := t.Context()
	store := memlock.New()
	holder := dlock.New(store)
	defer holder.Close()
	other := dlock.New(store)
	defer other.Close()

	l, err := holder.Semaphore("pool", 3).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(ctx)
	for _, permits := range []int{2, 4} {
		_, err := other.Semaphore("pool", permits).TryAcquire(ctx)
		var ce *dlock.ConflictError
		if !errors.As(err, &ce) || !errors.Is(err, dlock.ErrConflict) || ce.HeldPermits != 3 {
			t.Errorf("Semaphore of %d beside permits of 3 = %v; want a *ConflictError", permits, err)
		}
		if errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("Semaphore of %d beside permits of 3 matches ErrInvalid; want ErrConflict alone", permits)
		}
	}
}
