package ctxend

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestErr(t *testing.T) {
	if err := Err(context.Background()); err != nil {
		t.Errorf("Err(Background) = %v, want nil", err)
	}
	live, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if err := Err(live); err != nil {
		t.Errorf("Err(an hour left) = %v, want nil", err)
	}
	cancelled, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if err := Err(cancelled); !errors.Is(err, context.Canceled) {
		t.Errorf("Err(cancelled) = %v, want Canceled", err)
	}
	// A deadline in the past: WithDeadline ends such a context at once, so
	// a context that only reports the deadline stands for one whose timer
	// has not run yet.
	past := deadlineOnly{Context: context.Background(), d: time.Now().Add(-time.Millisecond)}
	if err := Err(past); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Err(deadline passed, timer not run) = %v, want DeadlineExceeded", err)
	}
}

type deadlineOnly struct {
	context.Context
	d time.Time
}

func (c deadlineOnly) Deadline() (time.Time, bool) { return c.d, true }
func (deadlineOnly) Err() error                    { return nil }
