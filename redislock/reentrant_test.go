package redislock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redislock"
	"github.com/redis/go-redis/v9"
)

// heldAnswers is a real Backend whose acquires, once armed, run on the
// store, tell reached, and hold their answer until the test lets it go.
type heldAnswers struct {
	*redislock.Backend
	mu       sync.Mutex
	loseNext bool
	armed    bool
	reached  chan struct{}
	answers  chan chan struct{}
}

func (b *heldAnswers) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	res, err := b.Backend.Acquire(ctx, req)
	b.mu.Lock()
	lose, armed := b.loseNext, b.armed
	b.loseNext = false
	b.mu.Unlock()
	if lose {
		return driver.AcquireResult{}, errors.New("injected: the answer was lost")
	}
	if armed {
		go_ := make(chan struct{})
		b.answers <- go_
		b.reached <- struct{}{}
		<-go_
	}
	return res, err
}

// TestDrainTakesConcurrentGrantOfSameFence: the gate does not make
// the drain's count this grant's. A reentrant handle whose acquire had an
// unknown outcome while it held nothing is marked uncertain; two Locks of
// the handle sent at the same time both find no live grant to join, and
// the store adds both to the hold the unknown acquire made (same fence).
// The client makes two grants of that fence; the first inherits the mark,
// and its last Unlock drains every hold the store reports left, the other
// grant's included: that grant's caller holds a lease for a free lock. No
// Unlock races with an acquire here, so the gate cannot help.
func TestDrainTakesConcurrentGrantOfSameFence(t *testing.T) {
	srv := testserver.StartRedis(t)
	b := &heldAnswers{Backend: redislock.New(srv.Client(t)), reached: make(chan struct{}, 2), answers: make(chan chan struct{}, 2)}
	c := dlock.New(b, dlock.WithTTL(5*time.Second))
	defer c.Close()
	other := dlock.New(redislock.New(srv.Client(t)), dlock.WithTTL(5*time.Second))
	defer other.Close()
	ctx := t.Context()
	const name = "reentrant/two-grants"
	m := c.Mutex(name, dlock.Reentrant())

	b.loseNext = true
	if _, err := m.Lock(ctx); err == nil {
		t.Fatal("the Lock whose answer was lost succeeded")
	}
	// The store holds the token once; the handle is marked uncertain.

	b.mu.Lock()
	b.armed = true
	b.mu.Unlock()
	type result struct {
		l   *dlock.Lease
		err error
	}
	ra, rb := make(chan result, 1), make(chan result, 1)
	go func() { l, err := m.Lock(ctx); ra <- result{l, err} }()
	<-b.reached
	goA := <-b.answers
	go func() { l, err := m.Lock(ctx); rb <- result{l, err} }()
	<-b.reached
	goB := <-b.answers
	b.mu.Lock()
	b.armed = false
	b.mu.Unlock()
	close(goA)
	a := <-ra // the first grant: it inherits the handle's mark
	close(goB)
	bb := <-rb
	if a.err != nil || bb.err != nil {
		t.Fatalf("Locks: %v, %v", a.err, bb.err)
	}
	if a.l.Fence() != bb.l.Fence() {
		t.Fatalf("fences %d and %d, want one store grant", a.l.Fence(), bb.l.Fence())
	}
	if err := a.l.Unlock(ctx); err != nil {
		t.Fatalf("the first lease's Unlock: %v", err)
	}
	defer bb.l.Unlock(context.Background())
	if err := bb.l.Err(); err != nil {
		t.Fatalf("the second lease ended: %v", err)
	}
	if l, err := other.Mutex(name).TryLock(ctx); err == nil {
		defer l.Unlock(context.Background())
		t.Fatalf("another owner obtained the lock (fence %d) while the handle's second lease (fence %d) holds it with no error", l.Fence(), bb.l.Fence())
	}
}

// drainRaceBackend is a real Backend whose next Acquire, when asked, runs
// on the store and then reports an error (a lost answer), and whose next
// tied renewal, when armed, waits for resume after telling entered.
type drainRaceBackend struct {
	*redislock.Backend
	loseNext   atomic.Bool
	renewArmed atomic.Bool
	entered    chan struct{}
	resume     chan struct{}
}

func (b *drainRaceBackend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	res, err := b.Backend.Acquire(ctx, req)
	if b.loseNext.CompareAndSwap(true, false) {
		return driver.AcquireResult{}, errors.New("injected: the answer was lost")
	}
	return res, err
}

func (b *drainRaceBackend) RenewGrant(ctx context.Context, key, token string, fence uint64, ttl time.Duration) (bool, error) {
	if b.renewArmed.CompareAndSwap(true, false) {
		close(b.entered)
		<-b.resume
	}
	return b.Backend.RenewGrant(ctx, key, token, fence, ttl)
}

// TestDrainTakesLockMadeBeforeGate: the gate of bf991b4 only keeps a
// Lock of the same reentrant handle out while the last Unlock releases; a
// Lock that reaches the store after the Unlock dropped its last lease (the
// grant has ended, so the Lock does not join it) but before the Unlock
// takes the gate (here: while the Unlock waits for a renewal in flight)
// adds a hold to the same store grant, under the same fence, and the
// Unlock's drain of the uncertain grant releases it. The Lock's caller holds
// a lease for a lock that the store has freed: another owner gets it.
func TestDrainTakesLockMadeBeforeGate(t *testing.T) {
	t.Run("same-grant", func(t *testing.T) { drainRace(t, false) })
	// The store lost the grant: the Lock makes a fresh grant (a new fence)
	// of the handle's token, and the Unlock's untied orphan release drops it.
	t.Run("orphan-release", func(t *testing.T) { drainRace(t, true) })
}

func drainRace(t *testing.T, broken bool) {
	srv := testserver.StartRedis(t)
	b := &drainRaceBackend{Backend: redislock.New(srv.Client(t)), entered: make(chan struct{}), resume: make(chan struct{})}
	c := dlock.New(b, dlock.WithTTL(5*time.Second))
	defer c.Close()
	other := dlock.New(redislock.New(srv.Client(t)), dlock.WithTTL(5*time.Second))
	defer other.Close()
	ctx := t.Context()
	const name = "reentrant/drain-race"
	m := c.Mutex(name, dlock.Reentrant())
	first, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b.loseNext.Store(true)
	if _, err := m.Lock(ctx); err == nil {
		t.Fatal("the re-entry whose answer was lost succeeded")
	}
	// The grant is uncertain now: its last Unlock drains the extra hold.

	b.renewArmed.Store(true)
	refreshed := make(chan error, 1)
	go func() { refreshed <- first.Refresh(ctx) }()
	<-b.entered // a renewal of the grant is in flight
	if broken {
		if _, _, err := b.ForceRelease(ctx, name); err != nil {
			t.Fatal(err)
		}
	}

	unlocked := make(chan error, 1)
	go func() { unlocked <- first.Unlock(context.Background()) }()
	time.Sleep(100 * time.Millisecond) // the Unlock dropped the last lease and waits for the renewal

	// Before the fix this Lock found the grant ended and added a hold under
	// its fence at once; now it waits for the Unlock to finish.
	locked := make(chan *dlock.Lease, 1)
	go func() {
		l, err := m.Lock(ctx)
		if err != nil {
			t.Errorf("the second Lock: %v", err)
		}
		locked <- l
	}()
	time.Sleep(100 * time.Millisecond)
	close(b.resume)
	second := <-locked
	if second == nil {
		return
	}
	<-refreshed
	if err := <-unlocked; err != nil && !(broken && errors.Is(err, dlock.ErrNotHeld)) {
		t.Fatalf("the last Unlock: %v", err)
	}
	defer second.Unlock(context.Background())
	if err := second.Err(); err != nil {
		t.Fatalf("the second lease has ended: %v", err)
	}
	if l, err := other.Mutex(name).TryLock(ctx); err == nil {
		defer l.Unlock(context.Background())
		t.Fatalf("another owner obtained the lock (fence %d) while the handle's second Lock holds it with fence %d and no error", l.Fence(), second.Fence())
	}
}

// TestLockIgnoresCtxBehindHungUnlock: since bf991b4 every acquire
// of a fixed-token handle (WithOwnerID, Reentrant) takes handle.gate for
// reading, and the last release holds it for writing for as long as the
// store takes to answer. A Redis that hangs (paused here) holds an Unlock
// up; a TryLock or Lock of the same handle with a short context now waits
// for that Unlock instead of returning at its deadline ("promptly", says
// Mutex.Lock): gate.RLock does not watch ctx (nor Close).
func TestLockIgnoresCtxBehindHungUnlock(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  dlock.Option
	}{
		{"owner-id", dlock.WithOwnerID("shared-owner")},
		{"reentrant", dlock.Reentrant()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := testserver.StartRedis(t)
			// As redislock.New asks: context deadlines on the socket.
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = rdb.Close() })
			c := dlock.New(redislock.New(rdb), dlock.WithTTL(5*time.Second))
			m := c.Mutex("reentrant/gate", tc.opt)
			l, err := m.Lock(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			srv.Pause(t)
			unlockCtx, cancelUnlock := context.WithTimeout(context.Background(), 4*time.Second)
			defer cancelUnlock()
			unlocked := make(chan error, 1)
			go func() { unlocked <- l.Unlock(unlockCtx) }()
			time.Sleep(100 * time.Millisecond) // the Unlock holds the gate, its release unanswered

			const wait = 300 * time.Millisecond
			ctx, cancel := context.WithTimeout(t.Context(), wait)
			defer cancel()
			start := time.Now()
			_, err = m.Lock(ctx)
			took := time.Since(start)
			srv.Resume(t)
			<-unlocked
			_ = c.Close()
			if err == nil {
				t.Fatal("Lock succeeded against a paused store")
			}
			if took > wait+time.Second {
				t.Errorf("Lock with a %v context returned after %v (%v): it waited for the hung Unlock's release", wait, took.Round(time.Millisecond), errors.Unwrap(err))
			}
		})
	}
}

// TestUnlockIgnoresCtxBehindHungReentry is the other side of the
// gate: a re-entry is sent without ctx's cancellation, bounded only by the
// TTL, and holds gate.RLock for its round trip. An Unlock of the handle's
// last lease meanwhile (the re-entry has not joined yet) waits for the
// gate, for as long as the re-entry hangs on a store that does not answer,
// whatever its own context says.
func TestUnlockIgnoresCtxBehindHungReentry(t *testing.T) {
	srv := testserver.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	c := dlock.New(redislock.New(rdb), dlock.WithTTL(5*time.Second))
	m := c.Mutex("reentrant/gate-unlock", dlock.Reentrant())
	l, err := m.Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	srv.Pause(t)
	reentered := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		_, err := m.Lock(ctx) // a re-entry: sent without ctx, bounded by the TTL
		reentered <- err
	}()
	time.Sleep(100 * time.Millisecond)

	const wait = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	start := time.Now()
	err = l.Unlock(ctx)
	took := time.Since(start)
	srv.Resume(t)
	<-reentered
	_ = c.Close()
	if took > wait+time.Second {
		t.Errorf("Unlock with a %v context returned after %v (%v): it waited for the hung re-entry", wait, took.Round(time.Millisecond), err)
	}
}

// TestUnlockCutWhileRenewingLeavesHold: bf991b4 marks the handle
// uncertain when the last release of a reentrant grant fails, so that its
// next grant, which may join the hold left on the store, drains it. An
// Unlock whose context ends while it waits for a renewal in flight returns
// without sending any release and without marking the handle: the hold
// stays, the next Lock joins it (same fence, one more hold), and that
// Lock's Unlock releases one hold and returns nil while the lock stays
// held on the store, renewed by nobody, for a TTL.
func TestUnlockCutWhileRenewingLeavesHold(t *testing.T) {
	srv := testserver.StartRedis(t)
	b := &drainRaceBackend{Backend: redislock.New(srv.Client(t)), entered: make(chan struct{}), resume: make(chan struct{})}
	c := dlock.New(b, dlock.WithTTL(5*time.Second))
	defer c.Close()
	other := dlock.New(redislock.New(srv.Client(t)), dlock.WithTTL(5*time.Second))
	defer other.Close()
	ctx := t.Context()
	const name = "reentrant/unlock-cut"
	m := c.Mutex(name, dlock.Reentrant())
	first, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b.renewArmed.Store(true)
	refreshed := make(chan error, 1)
	go func() { refreshed <- first.Refresh(ctx) }()
	<-b.entered // a renewal is in flight

	cut, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := first.Unlock(cut); err == nil {
		t.Fatal("the Unlock cut short by its context reported success")
	}
	close(b.resume)
	<-refreshed

	second, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Unlock(ctx); err != nil {
		t.Fatalf("the second Unlock: %v", err)
	}
	if l, err := other.Mutex(name).TryLock(ctx); err != nil {
		t.Fatalf("after the handle's last Unlock returned nil, another owner cannot lock: %v", err)
	} else {
		_ = l.Unlock(ctx)
	}
}
