package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

func TestCallContext(t *testing.T) {
	c := dlock.New(memlock.New(), dlock.WithTTL(time.Second))
	defer c.Close()
	l, err := c.Mutex("call").Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := l.CallContext(t.Context())
	defer cancel()
	d, ok := ctx.Deadline()
	if want := l.Deadline().Add(-100 * time.Millisecond); !ok || !d.Equal(want) {
		t.Errorf("deadline = %v, %v; want the safe deadline %v", d, ok, want)
	}
	if got, ok := dlock.LeaseFromContext(ctx); !ok || got != l {
		t.Error("the call's context does not carry the lease")
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(time.Second):
		t.Fatal("the call's context outlived the lease")
	}
	if cause := context.Cause(ctx); !errors.Is(cause, dlock.ErrReleased) {
		t.Errorf("cause = %v, want ErrReleased", cause)
	}
}
