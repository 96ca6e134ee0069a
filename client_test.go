package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

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
