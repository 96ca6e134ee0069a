package memlock

import (
	"context"
	"errors"
	"sync"

	"github.com/dlock-go/dlock/driver"
)

// subscribers returns the callbacks of listeners subscribed to key, or of
// every listener when key is "". The caller holds b.mu.
func (b *Backend) subscribers(key string) []func(key, next string) {
	var fns []func(key, next string)
	for l := range b.listeners {
		l.mu.Lock()
		if !l.closed && (key == "" || l.subs[key] > 0) {
			fns = append(fns, l.fn)
		}
		l.mu.Unlock()
	}
	return fns
}

// Listen implements driver.Notifier. Notifications are delivered
// synchronously by the goroutine that released the lock.
func (b *Backend) Listen(ctx context.Context, fn func(key, next string)) (driver.Listener, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	l := &listener{b: b, fn: fn, subs: make(map[string]int)}
	b.listeners[l] = struct{}{}
	return l, nil
}

type listener struct {
	b  *Backend
	fn func(key, next string)

	mu     sync.Mutex
	subs   map[string]int
	closed bool
}

func (l *listener) Subscribe(ctx context.Context, key string) error {
	l.b.mu.Lock()
	err := l.b.check(ctx)
	l.b.mu.Unlock()
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errors.New("memory: listener closed")
	}
	l.subs[key]++
	return nil
}

func (l *listener) Unsubscribe(_ context.Context, key string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.subs[key]--; l.subs[key] <= 0 {
		delete(l.subs, key)
	}
	return nil
}

func (l *listener) Close() error {
	l.b.mu.Lock()
	delete(l.b.listeners, l)
	l.b.mu.Unlock()
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	return nil
}
