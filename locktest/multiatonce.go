package locktest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// testMultiAtOnce checks Client.MultiAtOnce across Clients, where the
// backend has driver.MultiAcquirer (elsewhere, that the client refuses
// it): every name or none at every instant. While another Client holds
// one of the names, a waiting MultiAtOnce holds none of the others (a
// second Client takes them with TryLock), and it gets all of them once
// that name is released; a TryLock that finds a name held takes none; a
// bounded wait ends holding none; Unlock releases everything.
func testMultiAtOnce(t *testing.T, s *Store) {
	// One hash tag: on Redis Cluster the names of a MultiAtOnce share a slot.
	const x, y, z = "{locktest/atonce}x", "{locktest/atonce}y", "{locktest/atonce}z"
	// What is checked is which names are held, not expiry (a loss is
	// caused by deleting a name): a TTL that a loaded store's transaction
	// over three names (PostgreSQL's took up to 0.9s) does not outlast, so
	// that its grant is not given back as too late to trust. The loss is
	// seen at the next renewal, a third of it later.
	const atOnceTTL = 3 * time.Second
	a := client(t, s, dlock.WithTTL(atOnceTTL))
	b := client(t, s, dlock.WithTTL(atOnceTTL))
	if _, ok := s.NewBackend(t).(driver.MultiAcquirer); !ok {
		_, err := a.MultiAtOnce([]string{x, y}).TryLock(t.Context())
		if !errors.Is(err, dlock.ErrInvalid) || !errors.Is(err, dlock.ErrUnsupported) {
			t.Fatalf("MultiAtOnce on a backend without driver.MultiAcquirer = %v, want ErrInvalid and ErrUnsupported", err)
		}
		return
	}

	ml, err := a.MultiAtOnce([]string{z, x, y}).TryLock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{x, y, z} {
		if f, ok := ml.Fence(name); !ok || f == 0 || f != ml.Lease(name).Fence() {
			t.Errorf("Fence(%q) = %d, %v; want its lease's fence", name, f, ok)
		}
		mustBeHeldByOther(t, b.Mutex(name))
	}
	const free = "{locktest/atonce}free"
	_, err = b.MultiAtOnce([]string{free, y}).TryLock(t.Context())
	var no *dlock.NotObtainedError
	if !errors.As(err, &no) || no.Name != y {
		t.Fatalf("MultiAtOnce.TryLock over a held name = %v, want a *NotObtainedError naming y", err)
	}
	unlock(t, lock(t, b.Mutex(free))) // never taken
	if err := ml.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}

	// y is held by b; a waits for x, y and z at once and holds none of
	// them meanwhile: b takes x and z with TryLock, again and again.
	held := lock(t, b.Mutex(y))
	refused := make(chan string, 64)
	type result struct {
		ml  *dlock.MultiLease
		err error
	}
	got := make(chan result, 1)
	go func() {
		ml, err := a.MultiAtOnce([]string{x, y, z}, dlock.WithOnBusy(func(e *dlock.NotObtainedError) {
			select {
			case refused <- e.Name:
			default:
			}
		})).Lock(t.Context())
		got <- result{ml, err}
	}()
	select {
	case name := <-refused:
		if name != y {
			t.Errorf("the waiter was refused by %q, want y", name)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("MultiAtOnce.Lock made no attempt")
	}
	for range 5 {
		for _, name := range []string{x, z} {
			l, err := b.Mutex(name).TryLock(t.Context())
			if err != nil {
				t.Fatalf("TryLock(%q) while a MultiAtOnce waits for y = %v, want the name free", name, err)
			}
			unlock(t, l)
		}
		time.Sleep(10 * time.Millisecond)
	}
	unlock(t, held)
	var all *dlock.MultiLease
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatal(r.err)
		}
		all = r.ml
	case <-time.After(10 * time.Second):
		t.Fatal("MultiAtOnce.Lock did not get x, y and z after y was released")
	}
	for _, name := range []string{x, y, z} {
		mustBeHeldByOther(t, b.Mutex(name))
	}

	// Lost together, as a Multi's.
	s.Delete(t, z)
	select {
	case <-all.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the MultiLease did not end after z was deleted")
	}
	if err := all.Err(); !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("Err after z was deleted = %v, want ErrLost", err)
	}
	_ = all.Unlock(t.Context())

	// A bounded wait ends holding nothing.
	held = lock(t, b.Mutex(z))
	if _, err := a.MultiAtOnce([]string{x, z}, dlock.WithWait(100*time.Millisecond)).Lock(t.Context()); !errors.Is(err, dlock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("MultiAtOnce.Lock with z held and WithWait = %v, want ErrNotObtained and DeadlineExceeded", err)
	}
	unlock(t, lock(t, b.Mutex(x)))
	unlock(t, held)
	noLeftoversWithin(t, s, 3*time.Second, x, y, z, free)
}

// testMultiAtOnceCrossing checks that two MultiAtOnce callers over
// overlapping names in opposite orders, beside a plain Mutex on one of
// them, never deadlock and never hold a name together.
func testMultiAtOnceCrossing(t *testing.T, s *Store) {
	const p, q, r = "{locktest/atonce}p", "{locktest/atonce}q", "{locktest/atonce}r"
	// What is checked is the order of grants, not expiry: a TTL that a
	// store's write lock held up under load (SQLite's took up to 1.7s)
	// cannot run out in a round.
	const crossTTL = 5 * time.Second
	a := client(t, s, dlock.WithTTL(crossTTL))
	b := client(t, s, dlock.WithTTL(crossTTL))
	if _, ok := s.NewBackend(t).(driver.MultiAcquirer); !ok {
		t.Log("no driver.MultiAcquirer: MultiAtOnce is refused (see the MultiAtOnce case)")
		return
	}
	var inside [3]atomic.Int32 // p, q, r
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	enter := func(idx ...int) error {
		for _, i := range idx {
			if !inside[i].CompareAndSwap(0, 1) {
				return errors.New("two holders of one name at once")
			}
		}
		time.Sleep(time.Millisecond)
		for _, i := range idx {
			inside[i].Store(0)
		}
		return nil
	}
	for _, c := range []struct {
		c     *dlock.Client
		names []string
		idx   []int
	}{{a, []string{p, q, r}, []int{0, 1, 2}}, {b, []string{r, q}, []int{2, 1}}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := c.c.MultiAtOnce(c.names)
			for range 20 {
				ml, err := m.Lock(ctx)
				if err != nil {
					errs <- err
					return
				}
				if err := enter(c.idx...); err != nil {
					errs <- err
				}
				if err := ml.Unlock(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		m := b.Mutex(p)
		for range 20 {
			l, err := m.Lock(ctx)
			if err != nil {
				errs <- err
				return
			}
			if err := enter(0); err != nil {
				errs <- err
			}
			if err := l.Unlock(ctx); err != nil {
				errs <- err
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	noLeftoversWithin(t, s, 3*time.Second, p, q, r)
}
