package dlock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memlock"
)

// faulty is a memlock store with faults a real store shows only by chance:
// answers lost after the store acted, and calls that hang.
type faulty struct {
	*memlock.Backend
	loseAcquireAnswer atomic.Bool   // Acquire acts, then reports an error
	hangAcquire       atomic.Bool   // Acquire waits for its context to end
	renewGate         chan struct{} // when non-nil, Renew waits for it
	acquires          atomic.Int64
}

var errLostAnswer = errors.New("faulty: connection reset after the command ran")

func newFaulty() *faulty { return &faulty{Backend: memlock.New()} }

func (f *faulty) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	f.acquires.Add(1)
	if f.hangAcquire.Load() {
		<-ctx.Done()
		return driver.AcquireResult{}, ctx.Err()
	}
	res, err := f.Backend.Acquire(ctx, req)
	if err == nil && f.loseAcquireAnswer.Load() {
		return driver.AcquireResult{}, errLostAnswer
	}
	return res, err
}

func (f *faulty) Renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	if f.renewGate != nil {
		select {
		case <-f.renewGate:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	return f.Backend.Renew(ctx, key, token, ttl)
}

// RenewGrant is the renewal the client sends (memlock ties renewals to
// their grant); it waits for renewGate as Renew does.
func (f *faulty) RenewGrant(ctx context.Context, key, token string, fence uint64, ttl time.Duration) (bool, error) {
	if f.renewGate != nil {
		select {
		case <-f.renewGate:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	return f.Backend.RenewGrant(ctx, key, token, fence, ttl)
}

func held(t *testing.T, b *memlock.Backend, key string) driver.LockInfo {
	t.Helper()
	info, ok, err := b.Inspect(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return driver.LockInfo{}
	}
	return info
}

// An acquire whose answer is lost may have taken the lock: Close must not
// return before the clean-up has removed it.
func TestCloseWaitsForCleanup(t *testing.T) {
	f := newFaulty()
	c := dlock.New(f)
	f.loseAcquireAnswer.Store(true)
	if _, err := c.Mutex("k").TryLock(t.Context()); !errors.Is(err, errLostAnswer) {
		t.Fatalf("TryLock = %v, want the store error", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if info := held(t, f.Backend, "k"); info.Holds != 0 {
		t.Errorf("after Close the lock is still held: %+v", info)
	}
}

// A re-entry whose answer is lost may have added a hold; the last Unlock
// must still free the lock.
func TestUncertainReentryIsDrained(t *testing.T) {
	f := newFaulty()
	c := dlock.New(f)
	defer c.Close()
	m := c.Mutex("k", dlock.Reentrant())
	l, err := m.Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	f.loseAcquireAnswer.Store(true)
	if _, err := m.Lock(t.Context()); !errors.Is(err, errLostAnswer) {
		t.Fatalf("re-entry = %v, want the store error", err)
	}
	f.loseAcquireAnswer.Store(false)
	if info := held(t, f.Backend, "k"); info.Holds != 2 {
		t.Fatalf("store holds %d, want 2 (the lost answer's hold)", info.Holds)
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if info := held(t, f.Backend, "k"); info.Holds != 0 {
		t.Errorf("after the last Unlock the store still holds: %+v", info)
	}
}

// Close ends a wait even while its store call hangs.
func TestCloseEndsHangingWait(t *testing.T) {
	f := newFaulty()
	holder := dlock.New(f)
	defer holder.Close()
	if _, err := holder.Mutex("k").Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	c := dlock.New(f)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Mutex("k", dlock.WithRetry(dlock.ExponentialBackoff(time.Millisecond, time.Millisecond))).Lock(context.Background())
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	f.hangAcquire.Store(true)
	time.Sleep(50 * time.Millisecond) // the waiter is inside a hanging Acquire now
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close blocked by a hanging store call")
	}
	f.hangAcquire.Store(false)
	if err := <-errc; !errors.Is(err, dlock.ErrClosed) || !errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("Lock ended by Close = %v, want ErrClosed and ErrNotObtained", err)
	}
}

// Refresh during an Unlock that waits for a renewal in flight returns at once.
func TestRefreshDuringUnlock(t *testing.T) {
	f := newFaulty()
	f.renewGate = make(chan struct{})
	c := dlock.New(f)
	defer c.Close()
	l, err := c.Mutex("k", dlock.WithAutoRenew(false)).Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = l.Refresh(context.Background()) }() // blocks in Renew
	time.Sleep(20 * time.Millisecond)
	unlocked := make(chan error, 1)
	go func() { unlocked <- l.Unlock(context.Background()) }() // waits for that renewal
	time.Sleep(20 * time.Millisecond)

	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = l.Refresh(ctx)
	if took := time.Since(start); took > time.Second {
		t.Errorf("Refresh took %v while Unlock was in progress", took)
	}
	if !errors.Is(err, dlock.ErrReleased) {
		t.Errorf("Refresh during Unlock = %v, want ErrReleased", err)
	}
	close(f.renewGate)
	if err := <-unlocked; err != nil {
		t.Fatalf("Unlock: %v", err)
	}
}

// A second Unlock while the first is on its way returns when the lease has
// ended, with ErrReleased.
func TestConcurrentUnlock(t *testing.T) {
	f := newFaulty()
	f.renewGate = make(chan struct{})
	c := dlock.New(f)
	defer c.Close()
	l, err := c.Mutex("k", dlock.WithAutoRenew(false)).Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = l.Refresh(context.Background()) }()
	time.Sleep(20 * time.Millisecond)
	first := make(chan error, 1)
	go func() { first <- l.Unlock(context.Background()) }()
	time.Sleep(20 * time.Millisecond)
	second := make(chan error, 1)
	go func() { second <- l.Unlock(context.Background()) }()
	time.Sleep(20 * time.Millisecond)
	close(f.renewGate)
	if err := <-first; err != nil {
		t.Fatalf("first Unlock: %v", err)
	}
	err = <-second
	if !errors.Is(err, dlock.ErrReleased) {
		t.Errorf("second Unlock = %v, want ErrReleased", err)
	}
	if l.Err() == nil {
		t.Error("second Unlock returned before the lease ended")
	}
}

// A retry strategy that says "no pause" must not become a busy loop.
func TestZeroRetryDelayIsNotABusyLoop(t *testing.T) {
	f := newFaulty()
	holder := dlock.New(f)
	defer holder.Close()
	if _, err := holder.Mutex("k").Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	c := dlock.New(f)
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	before := f.acquires.Load()
	_, _ = c.Mutex("k", dlock.WithRetry(zeroDelay{})).Lock(ctx)
	if n := f.acquires.Load() - before; n > 300 {
		t.Errorf("%d attempts in 100ms with a zero retry delay, want at most 300", n)
	}
}

type zeroDelay struct{}

func (zeroDelay) Delay(int) time.Duration { return 0 }

// slowAcquire is a memlock store whose acquires answer after a delay, as a
// store far away or overloaded would, and that counts releases per token.
type slowAcquire struct {
	*memlock.Backend
	delay    atomic.Int64 // time.Duration
	mu       sync.Mutex
	released map[string]int
	granted  []string // tokens granted, in order
}

func newSlowAcquire(d time.Duration) *slowAcquire {
	s := &slowAcquire{Backend: memlock.New(), released: make(map[string]int)}
	s.delay.Store(int64(d))
	return s
}

func (s *slowAcquire) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	res, err := s.Backend.Acquire(ctx, req)
	if err == nil && res.Acquired {
		s.mu.Lock()
		s.granted = append(s.granted, req.Token)
		s.mu.Unlock()
	}
	time.Sleep(time.Duration(s.delay.Load()))
	return res, err
}

func (s *slowAcquire) Release(ctx context.Context, key, token string) (driver.ReleaseResult, error) {
	return s.count(token)(s.Backend.Release(ctx, key, token))
}

// ReleaseGrant is the release the client sends for a grant (memlock ties
// releases to their grant), counted as Release is.
func (s *slowAcquire) ReleaseGrant(ctx context.Context, key, token string, fence uint64) (driver.ReleaseResult, error) {
	return s.count(token)(s.Backend.ReleaseGrant(ctx, key, token, fence))
}

// count returns what counts a release of token that held.
func (s *slowAcquire) count(token string) func(driver.ReleaseResult, error) (driver.ReleaseResult, error) {
	return func(res driver.ReleaseResult, err error) (driver.ReleaseResult, error) {
		if res.Held {
			s.mu.Lock()
			s.released[token]++
			s.mu.Unlock()
		}
		return res, err
	}
}

// A grant whose answer arrives after the lease's safe validity is of no use:
// Lock and TryLock must not return it (found by the chaos latency scenario
// on MariaDB: a lease was handed out already past its deadline), and the
// grant must be given back at once, not left to expire. The delay is past
// the safe validity (TTL 1s − margin 500ms) but inside the TTL, so the hold
// is still on the store when the answer comes.
func TestGrantAnsweredTooLateIsGivenBack(t *testing.T) {
	t.Parallel()
	store := newSlowAcquire(600 * time.Millisecond)
	c := dlock.New(store, dlock.WithTTL(time.Second), dlock.WithSafetyMargin(500*time.Millisecond))
	defer c.Close()
	for i, lock := range []func(context.Context) (*dlock.Lease, error){c.Mutex("x").TryLock, c.RWMutex("y").TryRLock} {
		l, err := lock(t.Context())
		if err == nil {
			t.Fatalf("got a lease with %v left before its deadline; want an error", time.Until(l.Deadline()))
		}
		var no *dlock.NotObtainedError
		if !errors.As(err, &no) || no.Slow < 600*time.Millisecond || !strings.Contains(err.Error(), "given back") {
			t.Fatalf("err = %v; want a *NotObtainedError with Slow >= 600ms saying the grant was given back", err)
		}
		store.mu.Lock()
		token := store.granted[i]
		released := store.released[token]
		store.mu.Unlock()
		if released != 1 {
			t.Fatalf("the late grant was released %d times before TryLock returned, want 1", released)
		}
	}
	// Lock gives the late grant back and goes on waiting: once the store
	// is fast again, it gets the lock.
	go func() {
		time.Sleep(300 * time.Millisecond)
		store.delay.Store(0)
	}()
	l, err := c.Mutex("x").Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if left := time.Until(l.Deadline()); left < 300*time.Millisecond {
		t.Errorf("Lock returned a lease with %v left; want a fresh one", left)
	}
	store.mu.Lock()
	late := len(store.granted) - 3 // the two TryLocks' and the last, good grant
	var givenBack int
	for _, tok := range store.granted[2 : len(store.granted)-1] {
		givenBack += store.released[tok]
	}
	store.mu.Unlock()
	if late < 1 || givenBack != late {
		t.Errorf("Lock saw %d late grants and gave back %d", late, givenBack)
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// A reentrant handle's acquire whose answer is lost may have added a hold
// that no lease stands for. Releasing it in the background could take
// another goroutine's hold away (the handle's token is shared), so the
// handle's next grant drains it at its last Unlock instead.
func TestReentrantLostAnswerDrainedByNextGrant(t *testing.T) {
	f := newFaulty()
	c := dlock.New(f)
	defer c.Close()
	m := c.Mutex("k", dlock.Reentrant())
	f.loseAcquireAnswer.Store(true)
	if _, err := m.TryLock(t.Context()); !errors.Is(err, errLostAnswer) {
		t.Fatalf("TryLock = %v, want the store error", err)
	}
	f.loseAcquireAnswer.Store(false)
	if info := held(t, f.Backend, "k"); info.Holds != 1 {
		t.Fatalf("after the lost answer the store has %+v, want the hold the acquire made", info)
	}
	l, err := m.Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if info := held(t, f.Backend, "k"); info.Holds != 0 {
		t.Errorf("after the last Unlock the lock is still held: %+v", info)
	}
}
