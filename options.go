// Options: their defaults, their scopes, and the checks of names, TTLs and
// the other values a caller gives; RetryStrategy.

package dlock

import (
	"log/slog"
	"math/rand/v2"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/dlock-go/dlock/internal/safetext"
)

// Limits on user input. Calls given values outside them return ErrInvalid.
const (
	// MaxNameLength is the longest lock name in bytes, key prefix included.
	// Names are UTF-8 without control characters and do not start with '}'.
	MaxNameLength = 255
	// MinTTL is the shortest lease time to live.
	MinTTL = 50 * time.Millisecond
	// MaxMetadataLength is the longest WithMetadata text in bytes.
	MaxMetadataLength = 512
	// MaxOwnerIDLength is the longest WithOwnerID value in bytes.
	MaxOwnerIDLength = 128
)

// DefaultTTL is the lease time to live when WithTTL is not given.
const DefaultTTL = 10 * time.Second

// Option configures a Client (as the default for every lock it makes) or one
// lock (Client.Mutex, Client.Do, Client.RWMutex, Client.Semaphore).
// Options given to a lock override the Client's. An option that cannot apply
// where it is given (WithLogger given to a lock, Fair for a Semaphore) makes
// the lock's calls fail with ErrInvalid naming it; nothing is dropped.
type Option interface{ apply(*options) }

type optionFunc func(*options)

func (f optionFunc) apply(o *options) { f(o) }

type options struct {
	ttl         time.Duration
	autoRenew   bool
	wait        time.Duration
	retry       RetryStrategy
	ownerID     string
	metadata    string
	logger      *slog.Logger
	loggerSet   bool // WithLogger was given: a Client option only
	observer    Observer
	observerSet bool // WithObserver was given: a Client option only
	keyPrefix   string
	reentrant   bool
	margin      time.Duration // used when marginSet; else TTL/10
	marginSet   bool
	onBusy      func(*NotObtainedError)
	lockDelay   time.Duration
	fair        bool
}

func defaultOptions() options {
	return options{ttl: DefaultTTL, autoRenew: true}
}

// WithTTL sets the lease time to live: how long the store keeps the lock
// after the last successful acquire or renewal. It must be at least MinTTL.
// The default is DefaultTTL (10s).
func WithTTL(ttl time.Duration) Option { return optionFunc(func(o *options) { o.ttl = ttl }) }

// WithAutoRenew turns automatic renewal on or off. When on, the Client renews
// the lease every TTL/3 until Unlock, batching renewals that fall due
// together; when off, the lease ends at its TTL unless Refresh is called. The
// default is on.
func WithAutoRenew(on bool) Option { return optionFunc(func(o *options) { o.autoRenew = on }) }

// WithWait bounds how long Lock waits for the lock, independently of the TTL
// and of the context. Zero means Lock waits until the context is done. The
// default is 0.
func WithWait(d time.Duration) Option { return optionFunc(func(o *options) { o.wait = d }) }

// WithRetry sets how long a waiter sleeps between attempts when no release
// notification arrives. Waiters are woken by release notifications on stores
// that have them, and when the holder's TTL runs out; the strategy is the
// safety net and the only mechanism on stores without notification. A delay
// never exceeds the holder's remaining TTL. The default is
// ExponentialBackoff(100ms, 2s) on stores with notification and
// ExponentialBackoff(5ms, 500ms) on others.
func WithRetry(s RetryStrategy) Option { return optionFunc(func(o *options) { o.retry = s }) }

// WithOwnerID sets the owner token instead of a random one, so that several
// handles or processes that use the same ID count as one owner (for reentrancy)
// and can release each other's holds. Keep IDs secret and unique per owner:
// anyone who knows one can release the lock. At most MaxOwnerIDLength bytes;
// the names a store keeps beside the owner tokens ("owner", "fence", "at",
// "exp", "delay", "rid", "rrid") are refused. The default is a random 128-bit token per handle (reentrant) or per Lock
// call (not reentrant).
func WithOwnerID(id string) Option { return optionFunc(func(o *options) { o.ownerID = id }) }

// WithMetadata adds free text to the owner string stored with the lock, shown
// to waiters that fail to obtain it and by dlock ls. At most
// MaxMetadataLength bytes of valid UTF-8 without control characters (C0,
// DEL, C1) or bidi formatting characters (U+202E and the like): others see
// this text on their terminals. The default is empty.
func WithMetadata(text string) Option { return optionFunc(func(o *options) { o.metadata = text }) }

// WithLogger sets the Client's logger for renewals, losses and store errors.
// It is a Client option: a lock given it fails with ErrInvalid. The default
// discards everything.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(o *options) { o.logger, o.loggerSet = l, true })
}

// WithKeyPrefix puts prefix in front of every lock name, to keep several
// applications apart on one store. The prefix counts toward MaxNameLength.
// The default is empty.
func WithKeyPrefix(prefix string) Option {
	return optionFunc(func(o *options) { o.keyPrefix = prefix })
}

// WithSafetyMargin sets how long before the local validity deadline a lease
// is treated as lost when it could not be renewed: Lease.Context is cancelled
// and Done closed at Deadline minus this margin, so the holder has time to
// stop before another owner can get the lock. It must be between 0 and half
// the TTL. The default is TTL/10.
func WithSafetyMargin(d time.Duration) Option {
	return optionFunc(func(o *options) { o.margin, o.marginSet = d, true })
}

// WithOnBusy sets a function that Lock calls after every attempt that found
// the lock held, with the store's answer (holder and remaining TTL), for
// progress reports such as "waiting for host-a|pid 42": once for the first
// attempt, then for each retry (only the goroutine that retries for its
// Client and name makes them). A Lock that joins its Client's waiters on
// the name without a first attempt is called once as it joins, with the
// last answer its Client had (none yet while the Client's first attempt
// is under way), and an attempt that waits for its own Client's release
// (see driver.ReleaseAcquirer) reports that hold before it waits. fn must
// not block. The default is none.
func WithOnBusy(fn func(*NotObtainedError)) Option {
	return optionFunc(func(o *options) { o.onBusy = fn })
}

// WithLockDelay keeps a lock out of reach for d after a lease of it expired
// without a release, the lock-delay of Google's Chubby: when a holder is
// paused (a GC pause, a stopped VM, a slow disk) past its TTL, no one else
// can take the lock until d later, so the paused holder has d to wake up,
// notice the loss (Lease.Err) and stop before a new holder starts. A lock
// that is released, or whose holder's Client is closed, is free at once; only
// an expiry costs the delay. The delay is fixed when a grant is made;
// re-entries keep it. 0, the default, means no delay.
//
// Only backends that keep the delay on the store support it (memlock and
// redislock on one node, Sentinel or Cluster, and redlock); with others the
// lock fails with ErrInvalid.
func WithLockDelay(d time.Duration) Option { return optionFunc(func(o *options) { o.lockDelay = d }) }

// Fair makes a lock fair: the lock is granted in the order the waiters
// arrived, and a release wakes only the waiter at the head of the store's
// queue, or, where the store hands the lock over itself (redislock), grants
// it to that waiter. A Client keeps one place per name in the queue,
// renewed while it waits (it lapses within min(TTL, 5s) when the process
// dies, and is removed when a wait ends). TryLock yields to the queue and
// leaves no entry. Give Fair to every lock of a name; see
// docs/LOCK-KINDS.md for how plain ones behave beside it.
//
// A fair Mutex needs a backend with driver.CapFair (memlock, redislock,
// sqllock; not redlock). A fair RWMutex (both sides) or Semaphore needs
// driver.CapFairShared (redislock): its writers, readers and permits queue
// together in arrival order; a release hands a Semaphore's freed permit to
// the head, and a writer's release hands the lock to the readers queued
// together at the head, up to the next writer.
func Fair() Option { return optionFunc(func(o *options) { o.fair = true }) }

// Reentrant makes a Mutex reentrant: while the handle holds the lock, Lock and
// TryLock succeed at once and add one hold (counted on the store); each lease
// must be unlocked, and the last Unlock releases the lock. Without it, a
// second Lock on the same handle waits like any other owner.
func Reentrant() Option { return optionFunc(func(o *options) { o.reentrant = true }) }

// checkScope refuses the options that cannot apply to a handle of kind
// ("Mutex", "RWMutex", "Semaphore"): given, the options given to the
// handle, client, the Client's defaults, and eff, the handle's options in
// effect. A Client option given to a lock is refused, and so are the
// Mutex-only options (Reentrant, Fair, WithOwnerID) in effect for the other
// kinds, given or by default: a lock never runs with an option silently
// dropped.
func checkScope(kind string, client, given, eff *options) error {
	if given.loggerSet {
		return invalid("WithLogger: a Client option (give it to New), not one of a lock")
	}
	if given.observerSet {
		return invalid("WithObserver: a Client option (give it to New), not one of a lock")
	}
	if kind == "Mutex" {
		return nil
	}
	for _, o := range []struct {
		name, why         string
		on, given, client bool
	}{
		{"Reentrant", "only Mutex", eff.reentrant, given.reentrant, client.reentrant},
		{"WithOwnerID", "every hold has a token of its own", eff.ownerID != "", given.ownerID != "", client.ownerID != ""},
	} {
		switch {
		case !o.on:
		case o.given:
			return invalid("%s: not supported by %s (%s)", o.name, kind, o.why)
		case o.client:
			return invalid("%s: not supported by %s (%s), and a default of the Client: make the %s with a Client without it", o.name, kind, o.why, kind)
		}
	}
	return nil
}

// queueTTL is the time to live of a waiter's queue entry or writer intent.
func (o *options) queueTTL() time.Duration { return min(o.ttl, maxQueueTTL) }

const maxQueueTTL = 5 * time.Second

func (o *options) safetyMargin() time.Duration {
	if !o.marginSet {
		return o.ttl / 10
	}
	return o.margin
}

// validate checks the options and the full key (prefix + name).
func (o *options) validate(name string) error {
	if err := validateName("name", name); err != nil {
		return err
	}
	if key := o.keyPrefix + name; key[0] == '}' {
		// A Redis hash tag around such a key would be empty, and the lock's
		// keys would fall into different Cluster slots.
		return invalid("name: %q may not start with '}'", key)
	}
	if len(o.keyPrefix)+len(name) > MaxNameLength {
		return invalid("name: %d bytes with key prefix, over MaxNameLength (%d)", len(o.keyPrefix)+len(name), MaxNameLength)
	}
	if o.keyPrefix != "" {
		if err := validateName("key prefix", o.keyPrefix); err != nil {
			return err
		}
	}
	if o.ttl < MinTTL {
		return invalid("ttl: %v is below MinTTL (%v)", o.ttl, MinTTL)
	}
	if o.wait < 0 {
		return invalid("wait: %v is negative", o.wait)
	}
	if o.lockDelay < 0 {
		return invalid("lock delay: %v is negative", o.lockDelay)
	}
	if m := o.safetyMargin(); m < 0 || m > o.ttl/2 {
		return invalid("safety margin: %v is not between 0 and half the TTL (%v)", m, o.ttl)
	}
	if len(o.metadata) > MaxMetadataLength {
		return invalid("metadata: %d bytes, over MaxMetadataLength (%d)", len(o.metadata), MaxMetadataLength)
	}
	if err := checkText("metadata", o.metadata); err != nil {
		return err
	}
	if len(o.ownerID) > MaxOwnerIDLength {
		return invalid("owner ID: %d bytes, over MaxOwnerIDLength (%d)", len(o.ownerID), MaxOwnerIDLength)
	}
	if o.ownerID != "" {
		if err := validateName("owner ID", o.ownerID); err != nil {
			return err
		}
		if slices.Contains(reservedOwnerIDs, o.ownerID) {
			return invalid("owner ID: %q is reserved", o.ownerID)
		}
	}
	return nil
}

// reservedOwnerIDs are the field names that Redis stores keep in a lock's
// hash next to the owner tokens.
var reservedOwnerIDs = []string{"owner", "fence", "at", "exp", "delay", "rid", "rrid"}

// CheckName reports whether name is a valid lock name (see MaxNameLength),
// with the same ErrInvalid error Lock would return, so that programs can
// check user input before they reach a store.
func CheckName(name string) error {
	o := defaultOptions()
	return o.validate(name)
}

func validateName(field, s string) error {
	if s == "" {
		return invalid("%s: empty", field)
	}
	if len(s) > MaxNameLength {
		return invalid("%s: %d bytes, over MaxNameLength (%d)", field, len(s), MaxNameLength)
	}
	return checkText(field, s)
}

// checkText refuses text that is not valid UTF-8 or holds a control (C0,
// DEL, C1) or bidi formatting character: names and metadata are stored and
// shown to other users, whose terminals must not take them for commands.
func checkText(field, s string) error {
	r, at, ok := safetext.Check(s)
	switch {
	case ok:
		return nil
	case r == utf8.RuneError:
		return invalid("%s: not valid UTF-8 (byte %d)", field, at)
	}
	return invalid("%s: %s contains %U at byte %d, a control character or a bidi formatting character", field, safetext.Escape(s), r, at)
}

// RetryStrategy gives the pause before the next attempt of a waiter that was
// not woken by a notification. attempt counts from 1.
type RetryStrategy interface {
	Delay(attempt int) time.Duration
}

// ExponentialBackoff returns a RetryStrategy that starts at min, doubles on
// every attempt up to max, and picks each delay at random between half and
// all of that value, so that waiters of many clients spread out.
func ExponentialBackoff(min, max time.Duration) RetryStrategy {
	if min <= 0 {
		min = time.Millisecond
	}
	if max < min {
		max = min
	}
	return expBackoff{min: min, max: max}
}

type expBackoff struct{ min, max time.Duration }

func (b expBackoff) Delay(attempt int) time.Duration {
	d := b.min
	for i := 1; i < attempt && d < b.max; i++ {
		d *= 2
	}
	d = min(d, b.max)
	return d/2 + rand.N(d/2+1)
}
