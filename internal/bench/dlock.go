package bench

import (
	"context"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// Dlock returns a subject that locks with dlock Mutexes made with opts, one
// Client per worker over the backend newBackend returns for it. closeFn,
// when not nil, closes what newBackend opened (the Client does not).
func Dlock(name string, newBackend func(ctx context.Context, id int) (b driver.Backend, closeFn func() error, err error), opts ...dlock.Option) Subject {
	return Subject{
		Name: name,
		NewWorker: func(ctx context.Context, id int) (Worker, error) {
			b, closeFn, err := newBackend(ctx, id)
			if err != nil {
				return nil, err
			}
			return &dlockWorker{c: dlock.New(b), closeFn: closeFn, opts: opts, mutexes: map[string]*dlock.Mutex{}}, nil
		},
	}
}

type dlockWorker struct {
	c       *dlock.Client
	closeFn func() error
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

func (w *dlockWorker) Close() error {
	err := w.c.Close()
	if w.closeFn != nil {
		if cerr := w.closeFn(); err == nil {
			err = cerr
		}
	}
	return err
}
