package dlock

import (
	"context"
	"errors"
	"testing"
)

// TestValuesOfKeepsTheCallersCause: a context made by valuesOf has the
// observer's values but the caller's cancellation, cause included, even
// when the observer's context has a canceller of its own. (Before,
// context.Cause found the observer's canceller and answered
// context.Canceled.)
func TestValuesOfKeepsTheCallersCause(t *testing.T) {
	if cancelKey == nil {
		t.Fatal("the context package's canceller key was not found by the probe")
	}
	root, rcancel := context.WithCancel(context.Background())
	defer rcancel()
	type key struct{}
	why := errors.New("why")
	ctx, cancel := context.WithCancelCause(context.Background())
	v := valuesOf(ctx, context.WithValue(root, key{}, 1))
	if v.Value(key{}) != 1 {
		t.Errorf("the observer's value is not in the context")
	}
	child, ccancel := context.WithCancel(v)
	defer ccancel()
	cancel(why)
	if v.Err() == nil || context.Cause(v) != why {
		t.Errorf("valuesOf: Err %v, Cause %v; want Cause %v", v.Err(), context.Cause(v), why)
	}
	<-child.Done()
	if context.Cause(child) != why {
		t.Errorf("child: Cause %v, want %v", context.Cause(child), why)
	}
	// The observer's root ending cancels nothing of the caller's.
	ctx2 := context.Background()
	root2, rcancel2 := context.WithCancel(context.Background())
	v2 := valuesOf(ctx2, context.WithValue(root2, key{}, 2))
	rcancel2()
	if v2.Err() != nil || context.Cause(v2) != nil {
		t.Errorf("after the observer's root ended: Err %v, Cause %v; want none", v2.Err(), context.Cause(v2))
	}
}
