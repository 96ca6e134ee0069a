// Leader election: Election, its campaigns (Leadership), and reading and
// observing the current leader.

package dlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// ErrNoLeader is returned by Election.Leader when no campaign holds the
// election.
var ErrNoLeader = errors.New("dlock: election has no leader")

// Election is a leader election on one name: at most one campaigner leads
// at a time, and everyone can read who leads and with what value. It is
// built on the Mutex of that name: a leadership is a lease, with its loss
// signal, its renewal and its fence, and the leader's value is kept in the
// owner string as metadata (WithMetadata), so that other processes read it
// with the lock (Leader, Observe, dlock ls).
//
// Do the leader's work under Leadership.Context, which ends as soon as the
// leadership is lost or could no longer be trusted, and fence every write
// the leader makes with Leadership.Fence, so that the resource refuses a
// write of a leader that was deposed while it paused (see the package
// documentation and docs/LOCK-KINDS.md). A leader that merely stops
// working when its context ends is not safe on its own: its last write can
// land after a new leader's first.
//
// An Election needs a backend that can describe its locks
// (driver.Inspector): memlock, redislock, redlock, sqllock and etcdlock all
// can. Its methods return ErrInvalid (and ErrUnsupported) on another. An
// Election is safe for concurrent use.
type Election struct {
	c    *Client
	name string
	key  string
	opts []Option
	o    options // the options in effect, for the retry schedule
	err  error
	insp driver.Inspector
}

// Election returns the election named name. It shares the name with the
// Mutex of that name: a Mutex holder is the leader, and takes part as
// one. The options are a Mutex's (WithTTL, WithWait, Fair, ...), except
// that Reentrant and WithOwnerID are refused (ErrInvalid): a leadership
// has one owner token of its own, so that a second Campaign waits like
// any other campaigner; WithMetadata is replaced by each campaign's value.
// Making an Election touches no store.
func (c *Client) Election(name string, opts ...Option) *Election {
	e := &Election{c: c, name: name, opts: opts}
	if c == nil {
		e.err = invalid("client: nil")
		return e
	}
	m := c.Mutex(name, opts...)
	e.key, e.o, e.err = m.h.key, m.h.opts, m.h.err
	switch {
	case e.err != nil:
	case e.o.reentrant:
		e.err = invalid("Reentrant: not supported by Election (a leadership is one hold)")
	case e.o.ownerID != "":
		e.err = invalid("WithOwnerID: not supported by Election (a leadership has a token of its own)")
	default:
		insp, ok := c.backend.(driver.Inspector)
		if !ok {
			e.err = &unsupportedError{what: "elections (the backend cannot describe its locks)", backend: fmt.Sprintf("%T", c.backend)}
		}
		e.insp = insp
	}
	return e
}

// Name returns the election's name, without the key prefix.
func (e *Election) Name() string {
	if e == nil {
		return ""
	}
	return e.name
}

// Campaign waits until this caller leads the election, with value as the
// leader's value, and returns the leadership. It waits as Mutex.Lock does
// (woken by the store's release notifications, the leader's TTL and the
// WithRetry schedule), for as long as ctx and WithWait allow. value
// follows WithMetadata's rules (at most MaxMetadataLength bytes of UTF-8
// without control or bidi formatting characters). Each Campaign is a
// campaigner of its own: a second Campaign while the first leads waits
// for the first to resign or lose.
//
// When the wait ends first it returns errors.Join(*NotObtainedError,
// ctx.Err()), naming the leader (and the last store error, as Mutex.Lock
// does); it returns ErrInvalid for a bad name, option or value, ErrClosed
// after Client.Close, and the store's error, wrapped, when the store fails
// with an error that will not heal (transient ones are retried, as by
// Mutex.Lock).
func (e *Election) Campaign(ctx context.Context, value string) (*Leadership, error) {
	if e == nil {
		return nil, invalid("election: nil")
	}
	if e.err != nil {
		return nil, e.err
	}
	return e.campaign(ctx, value, true)
}

// TryCampaign makes one attempt to lead the election, with value as the
// leader's value, as Mutex.TryLock does. When another campaigner leads,
// it returns a *NotObtainedError (errors.Is(err, ErrNotObtained)) naming
// the leader; its other errors are Campaign's.
func (e *Election) TryCampaign(ctx context.Context, value string) (*Leadership, error) {
	if e == nil {
		return nil, invalid("election: nil")
	}
	if e.err != nil {
		return nil, e.err
	}
	return e.campaign(ctx, value, false)
}

// campaign is Campaign (wait) or TryCampaign.
func (e *Election) campaign(ctx context.Context, value string, wait bool) (*Leadership, error) {
	opts := append(e.opts[:len(e.opts):len(e.opts)], WithMetadata(value))
	m := e.c.Mutex(e.name, opts...)
	take := m.TryLock
	if wait {
		take = m.Lock
	}
	l, err := take(ctx)
	if err != nil {
		return nil, err
	}
	e.c.hub.wakeWatchers(e.key) // grants are not announced by the store
	return &Leadership{l: l, value: value}, nil
}

// Leader returns the current leader: its value, fence and owner string,
// as the store describes the lock now. It returns an error matching
// ErrNoLeader when no campaigner (nor a Mutex holder of the name) holds
// it, ErrInvalid for a bad name or option or a backend without
// driver.Inspector, ErrClosed after Client.Close, and the store's error,
// wrapped, when the store fails. On redlock the leader counts when a
// quorum of nodes agree on it.
func (e *Election) Leader(ctx context.Context) (LeaderInfo, error) {
	if e == nil {
		return LeaderInfo{}, invalid("election: nil")
	}
	if e.err != nil {
		return LeaderInfo{}, e.err
	}
	if err := e.c.enter(); err != nil {
		return LeaderInfo{}, err
	}
	defer e.c.exit()
	return e.leader(ctx)
}

// leader is Leader, inside a call in progress.
func (e *Election) leader(ctx context.Context) (LeaderInfo, error) {
	info, ok, err := e.insp.Inspect(ctx, e.key)
	if err != nil {
		return LeaderInfo{}, wrapStore("leader of election", e.name, err)
	}
	if !ok || info.Owner == "" || info.Delayed {
		return LeaderInfo{}, fmt.Errorf("dlock: leader of election %q: %w", e.name, ErrNoLeader)
	}
	value, _ := ownerMetadata(info.Owner)
	return LeaderInfo{Value: value, Fence: info.Fence, Owner: info.Owner, TTL: info.TTL}, nil
}

// Observe returns a channel that receives the election's leader now and
// each time the leadership changes hands (a new Fence or a new Owner), a
// LeaderInfo whose Fence is 0 each time the election is found without a
// leader after it had one (or at once, when it has none), and a LeaderInfo
// whose Err is set (and Fence 0) when a read of the election failed or
// took longer than 2 seconds: the leader sent before may be stale, and the
// next good read is sent whatever it finds. The channel is closed when
// ctx is done or the Client is closed. Values are not buffered: a change
// that comes while the receiver is busy replaces the one not yet taken, so
// the receiver always gets the latest state (as with etcd's Observe, a
// leadership that came and went unseen is skipped).
//
// Observe is woken by the store's release notifications where the store
// has them (Redis pub/sub, PostgreSQL LISTEN/NOTIFY, etcd watches,
// memlock), so a
// resignation or a removal is seen at once; a leader whose lease lapses
// is seen when its TTL, as last read, runs out; and, since a notification
// can be lost (or a releasing process may announce nothing, as a plain
// sqllock.New does), Observe reads the election at least every 2 seconds
// while it has a leader. Stores do not announce grants, so while the
// election has no leader, Observe reads it on the WithRetry schedule (by
// default 5ms growing to 500ms; a campaign of this Client is seen at
// once); without notifications it reads it on that schedule throughout.
// Each read is one Inspect of the lock (a quorum read on redlock).
//
// It returns ErrInvalid for a bad name or option or a backend without
// driver.Inspector, and ErrClosed after Client.Close. Store errors while
// observing are sent (Err), logged, and retried on the WithRetry schedule.
func (e *Election) Observe(ctx context.Context) (<-chan LeaderInfo, error) {
	if e == nil {
		return nil, invalid("election: nil")
	}
	if e.err != nil {
		return nil, e.err
	}
	if err := e.c.enter(); err != nil {
		return nil, err
	}
	ch := make(chan LeaderInfo)
	octx, cancel := e.c.closeAware(ctx)
	go func() {
		defer e.c.exit()
		defer cancel()
		defer close(ch)
		e.observe(octx, ch)
	}()
	return ch, nil
}

// observe is Observe's loop: it reads the leader, sends it when it
// changed, and sleeps until a notification, the leader's TTL or the retry
// schedule.
func (e *Election) observe(ctx context.Context, ch chan<- LeaderInfo) {
	hub := e.c.hub
	wake := hub.watch(e.key)
	defer hub.unwatch(e.key, wake)
	notified := false
	var unwatchHandoffs func()
	defer func() {
		if unwatchHandoffs != nil {
			unwatchHandoffs()
		}
		if notified {
			hub.unlisten(e.key)
		}
	}()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()

	var (
		sent    LeaderInfo
		pending *LeaderInfo // a change not yet taken by the receiver
		first   = true
		attempt int
	)
	for {
		if !notified {
			// Subscribed before the read, so that a release after it is heard.
			notified = hub.listenOrPoll(ctx, e.key)
			if notified {
				// A handoff to another Client's waiter changes the
				// leader too; a store may announce it to that Client alone.
				unwatchHandoffs = hub.watchHandoffs(ctx, e.key)
			}
		}
		rctx, rcancel := context.WithTimeout(ctx, observeSafetyNet)
		info, err := e.leader(rctx)
		rcancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && !errors.Is(err, ErrNoLeader):
			e.c.log.Warn("dlock: observing an election", "lock", e.name, "err", err)
			attempt++
			if first || sent.Err == nil {
				// The leader last sent may be stale by now: say so.
				sent, first = LeaderInfo{Err: err}, false
				pending = &sent
			}
		case first || sent.Err != nil || info.Fence != sent.Fence || info.Owner != sent.Owner:
			// A new owner with the fence of the last is a new leader too
			// (a store that lost its fence counter).
			sent, pending, first, attempt = info, &info, false, 1
		default:
			attempt++
		}

		retry := e.o.retry
		if retry == nil {
			retry = defaultPolledRetry
		}
		d := max(retry.Delay(attempt), time.Millisecond)
		if err == nil && info.TTL > 0 {
			if notified && e.o.retry == nil {
				// A release will be heard, and the lease otherwise ends
				// when its TTL runs out; but a notification can be lost
				// (a refused publish, a lost datagram, a releasing
				// process that announces nothing), so read again every
				// observeSafetyNet all the same, as waiters do.
				d = min(info.TTL+time.Millisecond, observeSafetyNet)
			} else {
				d = min(d, info.TTL+time.Millisecond)
			}
		}
		timer.Reset(d) // Go 1.23 timers: Reset and Stop leave no stale tick
	wait:
		for {
			var out chan<- LeaderInfo
			var v LeaderInfo
			if pending != nil {
				out, v = ch, *pending
			}
			select {
			case out <- v:
				pending = nil
			case <-wake:
				timer.Stop()
				break wait
			case <-timer.C:
				break wait
			case <-ctx.Done():
				return
			}
		}
	}
}

// LeaderInfo describes an election's leader, as the store described it.
type LeaderInfo struct {
	// Value is the value the leader campaigned with, or proclaimed last
	// (Leadership.Proclaim); "" for a holder that gave none, such as a
	// Mutex holder without metadata.
	Value string
	// Fence is the leadership's fence, the same as the leader's
	// Leadership.Fence; 0 in a LeaderInfo from Observe that says the
	// election has no leader, and in one that says the election could not
	// be read (Err set): check Err first, since then a leader may well
	// exist.
	Fence uint64
	// Owner is the owner string stored with the lock:
	// "host|pid N|acquired-at|value".
	Owner string
	// TTL is the leadership's remaining time to live on the store when it
	// was read; the leader renews it.
	TTL time.Duration
	// Err is set, in a LeaderInfo from Observe, when the election could
	// not be read (the store's error, or a read cut short): the other
	// fields are zero, and the leader sent before may no longer lead.
	Err error
}

// Leadership is one campaign's hold of an election: a lease of the
// election's lock. Do the leader's work under Context and fence its writes
// with Fence. A Leadership is safe for concurrent use. A nil or zero
// Leadership acts as one that has ended: Err and Resign return ErrInvalid.
type Leadership struct {
	l       *Lease
	seq     atomic.Uint64 // the last Proclaim's sequence number
	mu      sync.Mutex
	value   string // guarded by mu
	applied uint64 // the sequence number of value, guarded by mu
}

// Value returns the leader's value: the one it campaigned with, or the
// value of its last Proclaim that returned nil.
func (ld *Leadership) Value() string {
	if ld == nil {
		return ""
	}
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return ld.value
}

// Name returns the election's name, without the key prefix.
func (ld *Leadership) Name() string { return ld.lease().Name() }

// Fence returns the leadership's fencing token: larger than the fence of
// every earlier leadership (and grant of the name's lock) on this store.
// Give it with every write the leader makes, to a resource that refuses a
// fence lower than one it has seen, so that a deposed leader's late writes
// are refused.
func (ld *Leadership) Fence() uint64 { return ld.lease().Fence() }

// Context returns a context that is cancelled when the leadership ends:
// at Resign, or when it is lost (the store no longer has it, or it could
// not be renewed in time). Its context.Cause is Err, and LeaseFromContext
// gives the lease behind it. Run the leader's work under it.
func (ld *Leadership) Context() context.Context { return ld.lease().Context() }

// Done returns a channel that is closed when the leadership ends.
func (ld *Leadership) Done() <-chan struct{} { return ld.lease().Done() }

// Err returns nil while the leadership is held, ErrReleased after Resign,
// and a *LostError (errors.Is(err, ErrLost)) when it was lost. It reads the
// safe deadline when called, as Lease.Err does: a leader resumed after a
// pause finds itself deposed before it writes.
func (ld *Leadership) Err() error { return ld.lease().Err() }

// Lease returns the lease behind the leadership (Deadline, Refresh,
// Owner).
func (ld *Leadership) Lease() *Lease { return ld.lease() }

// Resign gives the leadership up, so that another campaign can win at
// once; its Context ends. Its errors are Lease.Unlock's: ErrNotHeld when
// the leadership had been lost, ErrReleased when it was resigned already.
func (ld *Leadership) Resign(ctx context.Context) error { return ld.lease().Unlock(ctx) }

// lease returns the lease behind ld; nil (whose methods report ErrInvalid
// or act as released) for a nil or zero Leadership.
func (ld *Leadership) lease() *Lease {
	if ld == nil {
		return nil
	}
	return ld.l
}

// ownerMetadata returns the metadata of an owner string written by
// dlock, "host|pid N[ client K][|proc:MACHINE:START]|2026-11-21T10:00:03Z[|metadata]"
// (see ownerString; the metadata may hold '|'); ok is false for another
// string, or when there is no metadata.
func ownerMetadata(owner string) (metadata string, ok bool) {
	parts := strings.SplitN(owner, "|", 3)
	if len(parts) < 3 || !strings.HasPrefix(parts[1], "pid ") {
		return "", false
	}
	rest := parts[2]
	if strings.HasPrefix(rest, "proc:") {
		_, after, found := strings.Cut(rest, "|")
		if !found {
			return "", false
		}
		rest = after
	}
	at, meta, hasMeta := strings.Cut(rest, "|")
	if _, err := time.Parse(time.RFC3339, at); err != nil || !hasMeta {
		return "", false
	}
	return meta, true
}

// observeSafetyNet is the longest an observer on a store that announces
// releases goes without reading the election while it has a leader.
const observeSafetyNet = 2 * time.Second
