// Release notifications: the Notifier interface and its Listener.

package driver

import "context"

// Notifier is implemented by backends that can wake waiters when a lock is
// released (Redis pub/sub, PostgreSQL LISTEN/NOTIFY, etcd watch). The client
// opens one Listener and multiplexes every key it waits on over it.
type Notifier interface {
	// Listen opens a notification stream. The backend calls fn with the key of
	// every lock released while that key is subscribed, and with key "" when
	// notifications may have been missed (for example after a reconnect), which
	// tells the client to retry every key it waits on. fn must not block and is
	// never called after Close returns. fn("", "") may come several times in a
	// row. ctx bounds the call only: the stream lives until Close.
	//
	// next is "" when any waiter may try, or, when the release left the lock
	// free with a live fair queue (AcquireRequest.Fair), the token at the
	// head of the queue: only that waiter is woken. When the release granted
	// the lock to the head itself (AcquireRequest.Handoff), next is
	// Handoff{head, fence}.Next(): see ParseNext. A release of a shared
	// hold, or the lapse or removal of a writer intent, is announced with
	// next "".
	Listen(ctx context.Context, fn func(key, next string)) (Listener, error)
}

// Listener is one notification stream opened by Notifier.Listen.
type Listener interface {
	// Subscribe starts notifications for key and returns only once the store
	// has confirmed the subscription, so that a release that follows a failed
	// acquire is never missed. A Subscribe that returned an error needs no
	// Unsubscribe.
	//
	// The client keeps at most one subscription of a key live on a
	// Listener: it never subscribes to a key that it has subscribed to and
	// not unsubscribed from, and subscribes again only after that
	// Unsubscribe has returned. A Listener therefore need not count
	// subscriptions (the ones of this module still do, harmlessly).
	Subscribe(ctx context.Context, key string) error
	// Unsubscribe drops the subscription of key. After Close it does nothing.
	Unsubscribe(ctx context.Context, key string) error
	// Close ends the stream and waits for its goroutines.
	Close() error
}

// HandoffWatcher is implemented by a Listener whose backend announces a
// direct handoff (AcquireRequest.Handoff) to the head's client alone, so
// that a plain Subscribe does not hear the handoffs to other clients. The
// client's election observers (Election.Observe) need to hear every change
// of holder: Watch makes the stream report those handoffs of key too (as
// fn(key, Handoff{...}.Next())), until Unwatch. A Watch that returned an
// error needs no Unwatch; after Close, Unwatch does nothing.
type HandoffWatcher interface {
	Watch(ctx context.Context, key string) error
	Unwatch(ctx context.Context, key string) error
}
