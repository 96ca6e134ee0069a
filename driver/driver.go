// Package driver defines the contract between the dlock client and a lock store,
// in the way database/sql/driver separates database/sql from its drivers.
//
// Users of dlock never call these methods; they construct a backend (for example
// redislock.New or memlock.New) and hand it to dlock.New. Backend authors
// implement Backend and, where the store allows it, the optional interfaces
// Notifier, BatchRenewer and Inspector, which the client finds by type assertion.
//
// Every method is one atomic operation on the store (one script, one statement):
// the client relies on that for its safety arguments. Keys arrive already
// validated and prefixed (1 to 255 bytes of UTF-8, no control characters, not
// starting with '}' so that a Redis hash tag around the key is never empty);
// tokens are opaque strings chosen by the client.
//
// "Someone else holds the lock" and "the token is not the holder" are normal
// answers, reported in the result with a nil error. An error always means the
// store failed or could not be reached, and then the outcome is unknown.
package driver

import (
	"context"
	"os"
	"strconv"
	"time"
)

// ProcessIdentity returns "host|pid N" for this process. The dlock client
// starts every owner description (AcquireRequest.Owner) with it and a '|',
// so a backend can tell owners of this process from others (redlock does,
// to spot nodes split between contenders of one process).
func ProcessIdentity() string { return processIdentity }

var processIdentity = func() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return host + "|pid " + strconv.Itoa(os.Getpid())
}()

// Backend is a lock store. Implementations must be safe for concurrent use.
type Backend interface {
	// Acquire grants the lock named req.Key to req.Token when it is free or
	// expired, or, when req.Reentrant is set and req.Token already holds it,
	// increments the hold count. A new grant draws a fence strictly greater than
	// every fence the store has granted for that key, in the same atomic step.
	// A new grant sets the store-side time to live to req.TTL; a re-entry
	// extends it to req.TTL from now but never shortens it (holders that share
	// a token may use different TTLs).
	//
	// When Acquire returns an error the outcome is unknown: the grant may
	// have been made. The client then calls Release with the same token,
	// which is harmless when nothing was granted.
	Acquire(ctx context.Context, req AcquireRequest) (AcquireResult, error)

	// Renew extends the time to live of key to ttl from now if token still
	// holds it and the lock has not expired; it never shortens it.
	// It reports false, with a nil error, when token is not the holder.
	Renew(ctx context.Context, key, token string, ttl time.Duration) (held bool, err error)

	// Release drops one hold of token on key. When the last hold goes, the lock
	// is deleted (the fence counter stays) and waiters are notified.
	Release(ctx context.Context, key, token string) (ReleaseResult, error)
}

// AcquireRequest is the input of Backend.Acquire.
type AcquireRequest struct {
	Key       string        // the lock's key, prefix included
	Token     string        // the owner token compared by Renew and Release
	Owner     string        // a human-readable owner description stored with the lock
	TTL       time.Duration // store-side time to live, always > 0
	Reentrant bool          // a holder with the same token may acquire again
	// LockDelay, when > 0, asks the store to keep the lock out of reach for
	// this long after a new grant's lease expires without a release (the
	// lock-delay of Google's Chubby): a holder that was paused past its TTL
	// cannot meet a new holder at once. A release frees the lock at once.
	// The delay is fixed by the grant; re-entries and renewals keep it. Only
	// backends that implement LockDelayer honour it; the client refuses the
	// option for the others.
	LockDelay time.Duration
	// Joining is the fence of the grant the client already holds with Token
	// when it re-enters (Reentrant, and the client holds the lock), or 0.
	// A backend that must tell a re-entry from a stray hold of an earlier
	// attempt (Redlock) compares the fences; others may ignore it.
	Joining uint64
}

// AcquireResult is the output of Backend.Acquire.
type AcquireResult struct {
	// Acquired reports whether req.Token now holds the lock.
	Acquired bool
	// Fence is the grant's fencing token when Acquired. A reentrant acquire
	// returns the fence of the grant it joined.
	Fence uint64
	// Holds is the hold count of req.Token after the call when Acquired, or
	// 0 when the store cannot tell without another round trip.
	Holds int
	// Holder is the owner description of the current holder when not Acquired.
	Holder string
	// HolderTTL is the holder's remaining store-side time to live when not
	// Acquired, or 0 when unknown.
	HolderTTL time.Duration
}

// ReleaseResult is the output of Backend.Release.
type ReleaseResult struct {
	// Held reports whether token held the lock when the call arrived. When it
	// is false nothing was changed.
	Held bool
	// Remaining is the hold count left after the release; 0 means the lock was
	// deleted.
	Remaining int
}

// Notifier is implemented by backends that can wake waiters when a lock is
// released (Redis pub/sub, PostgreSQL LISTEN/NOTIFY, etcd watch). The client
// opens one Listener and multiplexes every key it waits on over it.
type Notifier interface {
	// Listen opens a notification stream. The backend calls fn with the key of
	// every lock released while that key is subscribed, and with "" when
	// notifications may have been missed (for example after a reconnect), which
	// tells the client to retry every key it waits on. fn must not block and is
	// never called after Close returns. fn("") may come several times in a
	// row. ctx bounds the call only: the stream lives until Close.
	Listen(ctx context.Context, fn func(key string)) (Listener, error)
}

// Listener is one notification stream opened by Notifier.Listen.
type Listener interface {
	// Subscribe starts notifications for key and returns only once the store
	// has confirmed the subscription, so that a release that follows a failed
	// acquire is never missed. Subscriptions are counted: each Subscribe needs
	// its own Unsubscribe; a Subscribe that returned an error needs none.
	Subscribe(ctx context.Context, key string) error
	// Unsubscribe drops one subscription of key. After Close it does nothing.
	Unsubscribe(ctx context.Context, key string) error
	// Close ends the stream and waits for its goroutines.
	Close() error
}

// RenewRequest is one lease in a BatchRenewer call.
type RenewRequest struct {
	Key   string        // the lock's key, as in Backend.Renew
	Token string        // the owner token that must hold it
	TTL   time.Duration // the new store-side time to live
}

// RenewResult is the outcome of one RenewRequest.
type RenewResult struct {
	Held bool  // as Backend.Renew's result
	Err  error // as Backend.Renew's error
}

// BatchRenewer is implemented by backends that renew many leases in one round
// trip (a pipeline, a single statement). The result has one entry per request,
// in order.
type BatchRenewer interface {
	RenewBatch(ctx context.Context, reqs []RenewRequest) []RenewResult
}

// LockDelayer is implemented by backends that honour AcquireRequest.LockDelay.
type LockDelayer interface {
	// SupportsLockDelay reports whether AcquireRequest.LockDelay is honoured.
	SupportsLockDelay() bool
}

// Drifter is implemented by backends whose grants stay valid for less than
// their TTL as the client measures it, such as Redlock, which allows for the
// drift between the clocks of its nodes and the client's. The client ends
// every grant and renewal Drift(ttl) before send time + ttl, before its own
// safety margin.
type Drifter interface {
	// Drift returns how much shorter than ttl a grant of ttl is valid.
	Drift(ttl time.Duration) time.Duration
}

// LockInfo describes a held lock, for listing and inspection.
type LockInfo struct {
	Key   string
	Owner string
	Fence uint64
	Holds int
	TTL   time.Duration // remaining store-side time to live
	// HeldFor is how long the current grant has been held, by the store's
	// clock, or 0 when the store does not know.
	HeldFor time.Duration
	// Delayed reports that the holder's lease expired without a release and
	// the lock is kept out of reach for its lock-delay; TTL is then the time
	// left until it is free.
	Delayed bool
}

// Inspector is implemented by backends that can describe the locks they hold.
type Inspector interface {
	// Inspect describes the lock named key; ok is false when it is not held.
	Inspect(ctx context.Context, key string) (info LockInfo, ok bool, err error)
	// List describes every held lock whose key starts with prefix.
	List(ctx context.Context, prefix string) ([]LockInfo, error)
	// ForceRelease deletes the lock named key whoever holds it, notifies
	// waiters, and returns what it removed; ok is false when it was not held.
	ForceRelease(ctx context.Context, key string) (info LockInfo, ok bool, err error)
}
