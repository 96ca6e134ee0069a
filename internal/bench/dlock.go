package bench

import (
	"context"
	"sync"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// Dlock returns a subject that locks with dlock Mutexes made with opts, one
// Client per worker over the backend newBackend returns for it. closeFn,
// when not nil, closes what newBackend opened (the Client does not).
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
			return &dlockWorker{c: sc.c, release: release, opts: opts, mutexes: map[string]*dlock.Mutex{}}, nil
		},
	}
}

// sharedClient is a Client and what it runs on, with its workers counted.
type sharedClient struct {
	c       *dlock.Client
	closeFn func() error
	users   int
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
