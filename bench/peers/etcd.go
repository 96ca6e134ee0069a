package peers

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/dlock-go/dlock/internal/bench"
)

// Subject names of the etcd comparison (TestCompareEtcd).
const (
	SubjectEtcdDlock     = "dlock-etcd"       // dlock's default Mutex over etcdlock
	SubjectEtcdDlockFair = "dlock-etcd-fair"  // dlock.Fair() over etcdlock
	SubjectEtcdRaw       = "raw-etcd"         // bench.RawEtcd: put-if-absent on a lease, spinning, then delete
	SubjectEtcdMutex     = "etcd-concurrency" // go.etcd.io/etcd/client/v3/concurrency.Mutex
)

// EtcdSessionTTL is the TTL, in seconds, of the concurrency.Session each
// etcd-concurrency worker locks with: the package's default (60s) would do
// as well; 10s matches dlock's default TTL.
const EtcdSessionTTL = 10

// EtcdMutex returns a subject that locks with etcd's own
// concurrency.Mutex, the reference lock on etcd: each worker has a client
// and a Session (a lease kept alive by the session's goroutine) of its own;
// Lock puts the worker's key under the lock's prefix and waits, watching
// the key just before it, until its key is the oldest.
func EtcdMutex(name string, newClient func() (*clientv3.Client, error)) bench.Subject {
	return bench.Subject{
		Name: name,
		NewWorker: func(ctx context.Context, id int) (bench.Worker, error) {
			c, err := newClient()
			if err != nil {
				return nil, err
			}
			s, err := concurrency.NewSession(c, concurrency.WithTTL(EtcdSessionTTL), concurrency.WithContext(context.WithoutCancel(ctx)))
			if err != nil {
				_ = c.Close()
				return nil, err
			}
			return &etcdWorker{c: c, s: s}, nil
		},
	}
}

type etcdWorker struct {
	c *clientv3.Client
	s *concurrency.Session
}

type etcdHeld struct{ m *concurrency.Mutex }

func (w *etcdWorker) Lock(ctx context.Context, name string) (bench.Held, error) {
	m := concurrency.NewMutex(w.s, "/peers/"+name)
	if err := m.Lock(ctx); err != nil {
		return nil, fmt.Errorf("peers: concurrency.Mutex lock %q: %w", name, errors.Join(err, ctx.Err()))
	}
	return etcdHeld{m}, nil
}

func (h etcdHeld) Unlock(ctx context.Context) error {
	if err := h.m.Unlock(ctx); err != nil {
		return fmt.Errorf("peers: concurrency.Mutex unlock: %w", err)
	}
	return nil
}

func (w *etcdWorker) Close() error {
	err := w.s.Close() // revokes the session's lease
	return errors.Join(err, w.c.Close())
}
