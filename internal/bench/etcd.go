package bench

import (
	"context"
	"fmt"
	"math"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// RawEtcd is the floor of a lock on etcd: one transaction that puts the
// key if it is absent, on a lease the worker granted once, spinning until
// it succeeds, and one transaction that deletes the key if it still holds
// the worker's token. No fence, no renewal, no wake-up: what a lock cycle
// costs at the least on etcd (two Raft commits). Each worker has a client
// of its own, made by newClient and closed with the worker.
func RawEtcd(name string, newClient func() (*clientv3.Client, error), ttl time.Duration) Subject {
	return Subject{
		Name: name,
		NewWorker: func(ctx context.Context, id int) (Worker, error) {
			c, err := newClient()
			if err != nil {
				return nil, err
			}
			lease, err := c.Grant(ctx, max(1, int64(math.Ceil(ttl.Seconds()))))
			if err != nil {
				_ = c.Close()
				return nil, err
			}
			return &rawEtcdWorker{c: c, lease: lease.ID, token: fmt.Sprintf("raw-%d-%d", id, time.Now().UnixNano())}, nil
		},
	}
}

type rawEtcdWorker struct {
	c     *clientv3.Client
	lease clientv3.LeaseID
	token string
}

type rawEtcdHeld struct {
	w   *rawEtcdWorker
	key string
}

func (w *rawEtcdWorker) Lock(ctx context.Context, name string) (Held, error) {
	key := "raw/" + name
	for {
		resp, err := w.c.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, w.token, clientv3.WithLease(w.lease))).
			Commit()
		if err != nil {
			return nil, err
		}
		if resp.Succeeded {
			return rawEtcdHeld{w, key}, nil
		}
	}
}

func (h rawEtcdHeld) Unlock(ctx context.Context) error {
	resp, err := h.w.c.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(h.key), "=", h.w.token)).
		Then(clientv3.OpDelete(h.key)).
		Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return fmt.Errorf("raw release of %q: not held", h.key)
	}
	return nil
}

func (w *rawEtcdWorker) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, _ = w.c.Revoke(ctx, w.lease)
	return w.c.Close()
}
