package dlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

// TestMultiAtOnceObserved: a MultiAtOnce reports each name's Lock or
// TryLock as a Multi does: started, then granted with its fence or not
// obtained, and its unlock.
func TestMultiAtOnceObserved(t *testing.T) {
	t.Parallel()
	store := memlock.New()
	rec := &recorder{}
	c := dlock.New(store, dlock.WithObserver(rec))
	defer c.Close()
	other := dlock.New(store)
	defer other.Close()
	ctx := t.Context()
	names := []string{"x", "y"}

	ml, err := c.MultiAtOnce(names).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	es := rec.take()
	for _, name := range names {
		var started, granted []dlock.Event
		for _, e := range es {
			if e.Name != name {
				continue
			}
			switch e.Kind {
			case dlock.EventLockStarted:
				started = append(started, e)
			case dlock.EventLockGranted:
				granted = append(granted, e)
			}
		}
		if len(started) != 1 || !started[0].TryLock || started[0].Type != dlock.TypeMutex {
			t.Errorf("%q: started events %+v, want one of a TryLock", name, started)
		}
		f, _ := ml.Fence(name)
		if len(granted) != 1 || granted[0].Fence != f || granted[0].Attempts != 1 || !granted[0].TryLock {
			t.Errorf("%q: granted events %+v, want one with fence %d and one attempt", name, granted, f)
		}
	}
	if err := ml.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if u := of(rec.take(), dlock.EventUnlocked); len(u) != len(names) {
		t.Errorf("unlocked events %+v, want one per name", u)
	}

	held, err := other.Mutex("y").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = held.Unlock(ctx) }()
	_, err = c.MultiAtOnce(names, dlock.WithWait(50*time.Millisecond)).Lock(ctx)
	if !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("Lock with y held = %v, want ErrNotObtained", err)
	}
	es = rec.take()
	if g := of(es, dlock.EventLockGranted); len(g) != 0 {
		t.Errorf("granted events %+v after a refusal, want none", g)
	}
	no := of(es, dlock.EventLockNotObtained)
	if len(no) != len(names) {
		t.Fatalf("not-obtained events %+v, want one per name", no)
	}
	for _, e := range no {
		if e.TryLock || e.Attempts < 1 || e.Wait <= 0 {
			t.Errorf("not obtained = %+v, want a Lock with its attempts and wait", e)
		}
	}
}
