package dlock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// pausingRelease is a faulty store whose next tied release, once armed,
// waits for resume before it reaches the store, after telling entered.
type pausingRelease struct {
	*faulty
	armed   atomic.Bool
	entered chan struct{}
	resume  chan struct{}
}

func (p *pausingRelease) ReleaseGrant(ctx context.Context, key, token string, fence uint64) (driver.ReleaseResult, error) {
	if p.armed.CompareAndSwap(true, false) {
		close(p.entered)
		<-p.resume
	}
	return p.faulty.ReleaseGrant(ctx, key, token, fence)
}

// A reentrant handle whose grant counts a hold of unknown outcome drains
// it at its last Unlock: it releases as many holds as the store reports
// left. A Lock of the same handle that reaches the store between the
// Unlock's decision and its releases joins the same grant, under the same
// fence, and was drained with them: its caller held a lease for a lock that
// the store had freed. The last release now keeps the
// handle's acquires out until it is done.
func TestLastUnlockDrainKeepsConcurrentLock(t *testing.T) {
	p := &pausingRelease{faulty: newFaulty(), entered: make(chan struct{}), resume: make(chan struct{})}
	c := dlock.New(p)
	defer c.Close()
	m := c.Mutex("k", dlock.Reentrant())
	first, err := m.Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	p.loseAcquireAnswer.Store(true)
	if _, err := m.Lock(t.Context()); !errors.Is(err, errLostAnswer) {
		t.Fatalf("re-entry = %v, want the store error", err)
	}
	p.loseAcquireAnswer.Store(false)
	if info := held(t, p.Backend, "k"); info.Holds != 2 {
		t.Fatalf("the store has %+v, want 2 holds (one of unknown outcome)", info)
	}

	p.armed.Store(true)
	unlocked := make(chan error, 1)
	go func() { unlocked <- first.Unlock(context.Background()) }()
	<-p.entered // the last Unlock is about to release and drain

	locked := make(chan *dlock.Lease, 1)
	go func() {
		l, err := m.Lock(context.Background())
		if err != nil {
			t.Errorf("the concurrent Lock: %v", err)
		}
		locked <- l
	}()
	select {
	case l := <-locked:
		// Before the fix the Lock re-entered the grant being drained.
		t.Logf("the Lock returned before the last release (fence %d)", l.Fence())
		locked <- l
	case <-time.After(100 * time.Millisecond):
	}
	close(p.resume)
	if err := <-unlocked; err != nil {
		t.Fatalf("the last Unlock: %v", err)
	}
	l := <-locked
	if l == nil {
		return
	}
	defer l.Unlock(context.Background())
	if err := l.Err(); err != nil {
		t.Fatalf("the new lease has ended: %v", err)
	}
	info := held(t, p.Backend, "k")
	if info.Holds != 1 || info.Fence != l.Fence() {
		t.Fatalf("the store has %+v while the handle's Lock holds fence %d: the lock was freed under it", info, l.Fence())
	}
	other := dlock.New(p)
	defer other.Close()
	if _, err := other.Mutex("k").TryLock(t.Context()); !errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("another owner's TryLock = %v, want ErrNotObtained", err)
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
