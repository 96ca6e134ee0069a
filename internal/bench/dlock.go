package bench

import (
	"context"
	"errors"
	"sync"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// Dlock returns a subject that locks with dlock Mutexes made with opts, one
// Client per worker over the backend newBackend returns for it. closeFn,
// when not nil, closes what newBackend opened (the Client does not). Its
// workers take RWMutexes and Semaphores too (RWWorker, SemaphoreWorker)
// where the backend has them and opts suit them (Fair, on backends with
// driver.CapFairShared).
func Dlock(name string, newBackend func(ctx context.Context, id int) (b driver.Backend, closeFn func() error, err error), opts ...dlock.Option) Subject {
	return DlockShared(name, 1, newBackend, opts...)
}

// DlockShared is Dlock with perClient workers to each Client: the
// goroutines of one service that share a Client, each with Mutexes of its
// own. Workers id and id+1 share a Client when id/perClient is the same;
// newBackend is called once per Client, with the id of its first worker.
func DlockShared(name string, perClient int, newBackend func(ctx context.Context, id int) (b driver.Backend, closeFn func() error, err error), opts ...dlock.Option) Subject {
	perClient = max(perClient, 1)
	var (
		mu      sync.Mutex
		clients = map[int]*sharedClient{} // by id/perClient, while a worker uses it
	)
	return Subject{
		Name: name,
		NewWorker: func(ctx context.Context, id int) (Worker, error) {
			mu.Lock()
			defer mu.Unlock()
			sc := clients[id/perClient]
			if sc == nil {
				b, closeFn, err := newBackend(ctx, id)
				if err != nil {
					return nil, err
				}
				sc = &sharedClient{c: dlock.New(b), closeFn: closeFn}
				sc.rw, sc.sem = kindsOf(sc.c, opts)
				clients[id/perClient] = sc
			}
			sc.users++
			release := func() error {
				mu.Lock()
				defer mu.Unlock()
				if sc.users--; sc.users > 0 {
					return nil
				}
				delete(clients, id/perClient)
				return sc.close()
			}
			w := &dlockWorker{c: sc.c, release: release, opts: opts, mutexes: map[string]*dlock.Mutex{},
				rws: map[string]*dlock.RWMutex{}, sems: map[string]*dlock.Semaphore{}}
			var (
				rw  RWLocker
				sem PermitAcquirer
			)
			if sc.rw {
				rw = dlockRW{w}
			}
			if sc.sem {
				sem = dlockSem{w}
			}
			return WithKinds(w, rw, sem), nil
		},
	}
}

// sharedClient is a Client and what it runs on, with its workers counted.
type sharedClient struct {
	c       *dlock.Client
	closeFn func() error
	users   int
	rw, sem bool // whether RWMutexes and Semaphores made with the opts work
}

// kindsOf reports whether c's RWMutexes and Semaphores made with opts can
// lock: a handle's backend and option errors come before its context's, so
// a try on an ended context asks the store nothing.
func kindsOf(c *dlock.Client, opts []dlock.Option) (rw, sem bool) {
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	works := func(err error) bool { return !errors.Is(err, dlock.ErrInvalid) }
	const probe = "dlock-bench/kinds-probe"
	_, rerr := c.RWMutex(probe, opts...).TryRLock(ended)
	_, werr := c.RWMutex(probe, opts...).TryLock(ended)
	_, serr := c.Semaphore(probe, 1, opts...).TryAcquire(ended)
	return works(rerr) && works(werr), works(serr)
}

func (sc *sharedClient) close() error {
	err := sc.c.Close()
	if sc.closeFn != nil {
		if cerr := sc.closeFn(); err == nil {
			err = cerr
		}
	}
	return err
}

type dlockWorker struct {
	c       *dlock.Client
	release func() error // closes the Client after its last worker
	opts    []dlock.Option
	mutexes map[string]*dlock.Mutex // a worker locks from one goroutine
	rws     map[string]*dlock.RWMutex
	sems    map[string]*dlock.Semaphore
}

func (w *dlockWorker) Lock(ctx context.Context, name string) (Held, error) {
	m := w.mutexes[name]
	if m == nil {
		m = w.c.Mutex(name, w.opts...)
		w.mutexes[name] = m
	}
	l, err := m.Lock(ctx)
	if err != nil {
		return nil, err
	}
	return l, nil
}

func (w *dlockWorker) Close() error { return w.release() }

// dlockRW and dlockSem are a dlock worker's read-write locks and
// semaphores, apart from it: WithKinds gives a worker those that work.
type (
	dlockRW  struct{ *dlockWorker }
	dlockSem struct{ *dlockWorker }
)

// RLock implements RWLocker with a dlock RWMutex.
func (w dlockRW) RLock(ctx context.Context, name string) (Held, error) {
	return held(w.rwMutex(name).RLock(ctx))
}

// WLock implements RWLocker with a dlock RWMutex.
func (w dlockRW) WLock(ctx context.Context, name string) (Held, error) {
	return held(w.rwMutex(name).Lock(ctx))
}

// AcquirePermit implements PermitAcquirer with a dlock Semaphore.
func (w dlockSem) AcquirePermit(ctx context.Context, name string, permits int) (Held, error) {
	s := w.sems[name]
	if s == nil {
		s = w.c.Semaphore(name, permits, w.opts...)
		w.sems[name] = s
	}
	return held(s.Acquire(ctx))
}

func (w *dlockWorker) rwMutex(name string) *dlock.RWMutex {
	rw := w.rws[name]
	if rw == nil {
		rw = w.c.RWMutex(name, w.opts...)
		w.rws[name] = rw
	}
	return rw
}

// held returns l as a Held, and no nil *Lease in one.
func held(l *dlock.Lease, err error) (Held, error) {
	if err != nil {
		return nil, err
	}
	return l, nil
}
