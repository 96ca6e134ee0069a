// Package driver defines the contract between the dlock client and a lock store,
// in the way database/sql/driver separates database/sql from its drivers.
//
// Users of dlock never call these methods; they construct a backend (for example
// redislock.New or memlock.New) and hand it to dlock.New. Backend authors
// implement Backend and, where the store allows it, more. A feature is found
// one way: extra methods are optional interfaces (Notifier, Withdrawer,
// BatchRenewer, Inspector, Drifter), which the client finds by type
// assertion; request fields that only some backends honour are
// capabilities, which a backend announces with Capabler.Supports.
//
// The errors the client and the backends share, ErrInvalid and
// ErrUnsupported, are defined here and re-exported by the dlock package, as
// database/sql re-exports what database/sql/driver defines.
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
	"strings"
	"time"
)

// ProcessIdentity returns "host|pid N" for this process. The dlock client
// starts every owner description (AcquireRequest.Owner) with it: the first
// Client of a process follows it with '|', the others with " client N|"
// (N numbering the process's Clients), so that a backend can tell owners of
// this process from others, and the Clients of one process apart (redlock
// does, to spot nodes split between contenders). See OfThisProcess.
func ProcessIdentity() string { return processIdentity }

// OfThisProcess reports whether the owner description owner was made by a
// dlock client of this process.
func OfThisProcess(owner string) bool {
	rest, ok := strings.CutPrefix(owner, processIdentity)
	return ok && (strings.HasPrefix(rest, "|") || strings.HasPrefix(rest, " client "))
}

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
	// which is harmless when nothing was granted, when the token was drawn
	// for that one call; a token that other calls use too (a reentrant
	// handle's, a shared owner ID) may hold the lock for one of them, so the
	// client calls Withdraw instead, where the backend has it.
	Acquire(ctx context.Context, req AcquireRequest) (AcquireResult, error)

	// Renew extends the time to live of key to ttl from now if token still
	// holds it and the lock has not expired; it never shortens it.
	// It reports false, with a nil error, when token is not the holder.
	Renew(ctx context.Context, key, token string, ttl time.Duration) (held bool, err error)

	// Release drops one hold of token on key. When the last hold goes, the lock
	// is deleted (the fence counter stays) and waiters are notified.
	//
	// Renew and Release find the hold by key and token whatever its Mode; a
	// shared hold has one hold, so its release leaves Remaining 0. Release
	// also removes token's queue entry and writer intent, if any, even when
	// token holds nothing (a waiter that gives up), and then notifies
	// waiters as a release would when that lets another in.
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
	// backends with CapLockDelay honour it; the client refuses the option
	// for the others.
	LockDelay time.Duration
	// Joining is the fence of the grant the client already holds with Token
	// when it re-enters (Reentrant, and the client holds the lock), or 0.
	// A backend that must tell a re-entry from a stray hold of an earlier
	// attempt (Redlock) compares the fences; others may ignore it.
	Joining uint64

	// Mode is Exclusive (the zero value: a mutex, the write side of a
	// read-write lock) or Shared (a reader, a semaphore permit). An
	// Exclusive grant needs the lock free of exclusive and of live shared
	// holds; a Shared grant needs it free of an exclusive hold and of a
	// live writer intent of another token (see Wait), and, when Limit > 0,
	// fewer than Limit live shared holds. Every shared hold is a lease of
	// its own: its own token, TTL, fence (drawn from the same counter as
	// exclusive grants) and expiry; Reentrant and LockDelay are never set
	// with Shared, and a token that has a shared hold already is refused,
	// or, where the backend must answer a request the network delivered
	// twice as it answered it the first time (redislock), given that hold
	// back as the grant: the client draws a token for every shared request,
	// so a token that holds already is that same request. Only backends whose Capabilities include CapShared (and
	// CapSemaphore for Limit > 0) receive Shared requests.
	Mode Mode
	// Limit, with Mode Shared, is the most live shared holds the lock may
	// have after this grant (a semaphore's permits); 0 means no limit (the
	// readers of a read-write lock). The live shared holds bind it: a
	// Shared request whose Limit is not the Limit of the lock's live
	// shared holds (a semaphore of another size, a reader on a semaphore's
	// name, a permit beside readers) is refused with Conflict, whatever
	// else the lock holds, until those holds are gone. A store keeps the
	// Limit with the holds, not a count of its own.
	Limit int
	// Fair grants the lock in arrival order: a new grant is made only when
	// no live queue entry of another token is ahead of Token in the lock's
	// queue. Requests without Fair ignore the queue (a name is fair for all
	// of its users or for none). Only backends whose Capabilities include
	// CapFair receive Fair requests, and with Mode Shared only those with
	// CapFairShared: there a Fair Shared request is queued as an exclusive
	// one is, and a live writer intent of a token that has a queue entry
	// does not refuse it (the queue orders them).
	Fair bool
	// Wait tells the store that the caller will wait and try again when the
	// request is refused. A refused Fair request then enqueues Token at the
	// tail of the lock's queue, or keeps its place when it is queued already;
	// a refused Exclusive request that found live shared holds records a
	// writer intent for Token, unless another token's intent is live, which
	// keeps new Shared grants out so that writers are not starved by
	// readers. Queue entries and intents expire QueueTTL after the last
	// request that made or kept them, so a waiter that died leaves (a store
	// may leave the entry of a request without Handoff as it is while it has
	// more than half of QueueTTL left, answering from a read: a handed
	// grant lives on the entry, see Handoff; the caller tries again within
	// QueueTTL/2); a grant
	// removes Token's entry and intent, and Release with Token removes them
	// at once. Without Wait (TryLock) nothing is recorded, though a Fair
	// request still yields to the queue.
	Wait bool
	// QueueTTL is the time to live of a queue entry or writer intent made or
	// kept by this request (> 0 whenever Wait is set).
	QueueTTL time.Duration
	// Handoff, with Fair and Wait, lets the store grant the lock to Token
	// without another request, when a release leaves it to Token as the
	// queue's head (a direct handoff; backends with CapHandoff). The
	// release then announces the grant (see Handoff), and the grant lives
	// on the store until the expiry of the queue entry as the last request
	// of Token that the store answered before the grant set it (that
	// request's arrival + QueueTTL), unless renewed; Owner is the one of
	// that request. A later request of Token (Wait) is answered with the
	// grant (Acquired, its fence) and gives it TTL; a refusal says where the
	// fence counter stood (AcquireResult.Counter). With Mode Shared
	// (backends with CapFairShared) the grant is a shared hold, made when
	// the lock lets Token in (no exclusive hold, no live writer intent of a
	// token that is not queued, and the Limit of the live shared holds
	// matched and, when set, not reached); a release that hands a shared
	// hold over goes on with the shared entries behind it that the lock
	// lets in. Never set with Reentrant or LockDelay, nor with a token that
	// outlives one Lock call.
	Handoff bool
	// KeepPlace, with Handoff and Mode Exclusive (backends with
	// CapKeepPlace), says that the requester's client has another waiter
	// for the lock after this one: a release that hands the lock to Token's
	// queue entry also queues, at the tail, an entry for Successor(Token),
	// with the same owner and expiry, and marks its announcement
	// (Handoff.Successor). The client's next waiter takes
	// that token, and so its place, without a request of its own. An entry
	// made or kept by a request without KeepPlace has no successor. A store
	// may hand the lock over without queueing a successor (the mark then
	// says so).
	KeepPlace bool
	// Claim, with Mode Exclusive and Wait and without Fair, says that the
	// request is a plain waiter that has starved (backends with CapClaim):
	// when a holder refuses it, the store records Token's claim on the
	// lock's next grant, or keeps it, unless another token's claim or
	// writer intent is live. A claim is a writer intent (it expires
	// ClaimTTL after the last request that made or kept it, a grant to
	// Token removes it, Release with Token removes it at once), and, as
	// every live intent does on such a store, it keeps out the exclusive
	// requests without Fair of every other token (a re-entry of the holder
	// goes in): the next exclusive grant of a free lock is Token's. (Shared
	// requests are kept out by a writer intent, which a claimer refused by
	// shared holds records, not by the claim itself.) A request refused by another token's claim on a free lock
	// is answered with the claimer's owner as Holder, HolderTTL 0 and
	// WriterWaiting set. Never set with a token that outlives one Lock
	// call.
	Claim bool
	// ClaimTTL, with Claim, is the time to live of the claim (0 means
	// QueueTTL). QueueTTL stays the time to live of Token's writer intent,
	// which a claiming request records or keeps as any request with Wait
	// does, and which the store refreshes whenever it records or refreshes
	// the claim: a waiting writer that claims keeps new readers out for as
	// long as one that does not.
	ClaimTTL time.Duration
}

// Handoff is a grant that a release made to the head of the fair queue
// (AcquireRequest.Handoff), as its notification names it: a Notifier's fn
// gets Handoff{Token, Fence, Successor}.Next() as next.
type Handoff struct {
	Token string
	Fence uint64
	// Successor says that the release queued Successor(Token) too
	// (AcquireRequest.KeepPlace).
	Successor bool
}

// Next encodes h for a Notifier's next: the token, a NUL byte and the fence
// in decimal, and, with Successor, a NUL byte and "s". Tokens never hold a
// NUL (the client refuses control characters in owner IDs).
func (h Handoff) Next() string {
	s := h.Token + "\x00" + strconv.FormatUint(h.Fence, 10)
	if h.Successor {
		s += "\x00s"
	}
	return s
}

// ParseNext splits a Notifier's next into the token it names and, when the
// release handed the lock to that token, the grant's fence (0 otherwise).
func ParseNext(next string) (token string, fence uint64) {
	h := ParseHandoff(next)
	return h.Token, h.Fence
}

// ParseHandoff decodes a Notifier's next (see Handoff.Next): Fence is 0
// when the release did not hand the lock to Token.
func ParseHandoff(next string) Handoff {
	token, rest, ok := strings.Cut(next, "\x00")
	if !ok {
		return Handoff{Token: next}
	}
	f, mark, _ := strings.Cut(rest, "\x00")
	fence, err := strconv.ParseUint(f, 10, 64)
	if err != nil {
		return Handoff{Token: token}
	}
	return Handoff{Token: token, Fence: fence, Successor: mark == "s"}
}

// Successor returns the token that takes the place of token's client in
// the fair queue after token (AcquireRequest.KeepPlace): token with the
// number after its last dot raised by one, when that is a decimal of up to
// 15 digits without a leading zero, else token with ".1" added.
func Successor(token string) string {
	i := strings.LastIndexByte(token, '.')
	digits := token[i+1:]
	if i >= 0 && len(digits) > 0 && len(digits) <= 15 && (digits[0] != '0' || digits == "0") {
		if n, err := strconv.ParseUint(digits, 10, 64); err == nil {
			return token[:i+1] + strconv.FormatUint(n+1, 10)
		}
	}
	return token + ".1"
}

// Mode is how an acquire holds a lock.
type Mode uint8

const (
	// Exclusive: one holder (with its re-entries) at a time.
	Exclusive Mode = iota
	// Shared: many holders at once, each with a lease of its own, up to
	// AcquireRequest.Limit when it is set.
	Shared
)

// String returns "exclusive" or "shared".
func (m Mode) String() string {
	switch m {
	case Exclusive:
		return "exclusive"
	case Shared:
		return "shared"
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// Capability names a part of the contract that a backend may leave out.
type Capability int

const (
	// CapShared: AcquireRequest.Mode Shared without a Limit (read-write
	// locks), with writer intents.
	CapShared Capability = iota + 1
	// CapSemaphore: Mode Shared with a Limit (counting semaphores).
	CapSemaphore
	// CapFair: AcquireRequest.Fair, with a queue in arrival order whose
	// releases name the head waiter (Notifier).
	CapFair
	// CapOvertook: AcquireResult.Overtook is reported, at little cost
	// beside the grant, and a fair acquire costs about as much as a plain
	// one. With it (and CapFair and a Notifier) the client lets a plain
	// Mutex's starving waiters join the fair queue.
	CapOvertook
	// CapLockDelay: AcquireRequest.LockDelay.
	CapLockDelay
	// CapHandoff: AcquireRequest.Handoff, a release's direct grant to the
	// fair queue's head, announced as a Handoff.
	CapHandoff
	// CapClaim: AcquireRequest.Claim, a starving plain waiter's claim on
	// the next grant, for stores where the fair queue costs too much to
	// serve a plain Mutex's starving waiters (SQL). With it, and without
	// CapOvertook, the client lets a plain Mutex's starving waiters claim.
	CapClaim
	// CapFairShared: AcquireRequest.Fair with Mode Shared (fair read-write
	// locks and semaphores), and, with CapHandoff, Handoff for them.
	CapFairShared
	// CapKeepPlace: AcquireRequest.KeepPlace, a handing release's
	// successor entry for the head's client.
	CapKeepPlace
	// CapOvertookShared: AcquireResult.Overtook, and QueueLive where the
	// backend reports it, for shared requests too (semaphore permits and
	// readers). With it, CapFair, CapFairShared, CapOvertook and
	// CapHandoff (and a Notifier) the client lets the starving waiters of a
	// plain RWMutex or Semaphore join the fair queue, as a plain Mutex's
	// do.
	CapOvertookShared
)

// String returns the capability's name.
func (c Capability) String() string {
	switch c {
	case CapShared:
		return "read-write locks"
	case CapSemaphore:
		return "semaphores"
	case CapFair:
		return "fair locks"
	case CapOvertook:
		return "overtake reports"
	case CapLockDelay:
		return "lock delay"
	case CapHandoff:
		return "direct handoff"
	case CapClaim:
		return "claims"
	case CapFairShared:
		return "fair read-write locks and semaphores"
	case CapKeepPlace:
		return "kept queue places"
	case CapOvertookShared:
		return "overtake reports of shared requests"
	}
	return "Capability(" + strconv.Itoa(int(c)) + ")"
}

// PlaceReleaser is implemented by backends with CapKeepPlace.
type PlaceReleaser interface {
	// ReleasePlace is Release of token by a client that gave the token up
	// (a clean-up), which takes the queue entry of Successor(token) out in
	// the same step, before the lock is handed on: token's client kept its
	// place in the queue, and none of its waiters will take it.
	ReleasePlace(ctx context.Context, key, token string) (ReleaseResult, error)
}

// Capabler is implemented by backends that have some of the optional parts
// of the contract. A backend that does not implement it has none of them,
// and the client refuses the lock kinds that need them with ErrInvalid.
type Capabler interface {
	// Supports reports whether the backend implements c.
	Supports(c Capability) bool
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
	//
	// When the request was refused because of shared holds, Holder and
	// HolderTTL describe the one the caller must wait for: for an Exclusive
	// request the shared hold that expires last, for a Shared request at its
	// Limit the one that expires first. When a Shared request was refused
	// because of a writer intent, they describe the waiting writer (its
	// owner, the intent's time to live) and WriterWaiting is set.
	HolderTTL time.Duration
	// Shared is the number of live shared holds when not Acquired, or 0 when
	// there are none or the store cannot tell.
	Shared int
	// WriterWaiting reports, when a Shared request was refused, that it was
	// refused because of another token's live writer intent (on a store
	// with CapOvertookShared, also a queued writer's that a Fair request
	// waits behind); and, for an
	// Exclusive request on a store with CapClaim, that another token's
	// live claim or intent kept a free lock for that token (see
	// AcquireRequest.Claim).
	WriterWaiting bool
	// Position is, for a refused Fair request with Wait, Token's place in
	// the queue after the call (1 is the head), or 0.
	Position int
	// Queued reports, for a refused request with Wait, that a queue entry or
	// a writer intent of Token is live after the call: the caller must try
	// again (with Wait) within QueueTTL/2 to keep it.
	Queued bool
	// Counter is, for a refused request with Handoff, the lock's fence
	// counter when the store answered (the fence of its latest grant): a
	// handoff announced with a fence at or below it was made before this
	// answer and has ended since (this request would have been given it),
	// so the waiter must not use it.
	Counter uint64
	// Conflict reports, for a refused Shared request, that the lock's
	// live shared holds were granted with another Limit, HeldLimit (see
	// AcquireRequest.Limit): the client refuses the request with an error
	// rather than wait. Holder, HolderTTL and Shared describe those holds
	// where the store can tell. A backend that does not check leaves it
	// false (and lets the kinds mix, as before the check).
	Conflict bool
	// HeldLimit is, with Conflict, the Limit of the live shared holds (0:
	// readers).
	HeldLimit int
	// Overtook reports, for a grant to a request without Fair,
	// that the lock's fair queue had a live entry of another token: the
	// grant went before waiters queued for the lock. The client then makes
	// its next requests for the name fair, so that an owner that locks again
	// right after releasing cannot starve them. A backend that cannot tell
	// without more work than the grant itself may leave it false, and then
	// does not claim CapOvertook; one that reports it for shared grants
	// too claims CapOvertookShared.
	Overtook bool
	// QueueLive reports, for a refusal of an exclusive request (and, with
	// CapOvertookShared, a shared one) with Wait and without Fair, that the
	// lock's fair queue had a live entry: the client then joins the queue
	// at once, as after an Overtook grant. A
	// backend whose handoffs are announced to the head's client alone sets
	// it, as the other clients no longer hear that the name has a queue;
	// one that cannot tell cheaply may leave it false. It may be true for a
	// short while after the last entry expired (redislock: up to a quarter
	// of a QueueTTL); the waiter then queues alone.
	QueueLive bool
}

// ReleaseResult is the output of Backend.Release.
type ReleaseResult struct {
	// Held reports whether token held the lock when the call arrived. When it
	// is false no hold was changed (a queue entry or writer intent of token
	// may have been removed).
	Held bool
	// Remaining is the hold count left after the release; 0 means the lock was
	// deleted.
	Remaining int
}

// Withdrawer is implemented by backends that can take a waiter out of a
// lock's fair queue, and withdraw its writer intent, without touching any
// hold. The client uses it when a wait ends with a token that may hold the
// lock at the same moment or soon (a reentrant handle, a shared owner ID),
// where Release would drop that hold; without it, such a waiter's entry
// stays until its QueueTTL runs out.
type Withdrawer interface {
	// Withdraw removes token's fair queue entry and writer intent on key,
	// if any, and notifies waiters as Release does when that lets another
	// in. It never changes a hold. A wrapper whose inner backend has no
	// Withdraw returns an error wrapping ErrUnsupported.
	Withdraw(ctx context.Context, key, token string) error
}

// RenewRequest is one lease in a BatchRenewer call.
type RenewRequest struct {
	Key   string        // the lock's key, as in Backend.Renew
	Token string        // the owner token that must hold it
	TTL   time.Duration // the new store-side time to live
	// Fence is the fence of the grant the renewal extends, or 0. A backend
	// that implements GrantRenewer renews, when it is set, only that grant
	// (see GrantRenewer.RenewGrant); others ignore it.
	Fence uint64
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

// Drifter is implemented by backends whose grants stay valid for less than
// their TTL as the client measures it, such as Redlock, which allows for the
// drift between the clocks of its nodes and the client's. The client ends
// every grant and renewal Drift(ttl) before send time + ttl, before its own
// safety margin.
type Drifter interface {
	// Drift returns how much shorter than ttl a grant of ttl is valid.
	Drift(ttl time.Duration) time.Duration
}

// GrantReleaser is implemented by backends that can tie a release to the
// grant it ends. A token that outlives one Lock call (a reentrant handle's,
// an owner ID's) can be granted the lock again while a release of its
// earlier grant is still on its way (a resend of a release that ran
// already, after its answer was lost with the connection); Release would
// drop the new grant's hold, and another could take the lock from its
// holder.
type GrantReleaser interface {
	// ReleaseGrant is Release, except that when token's exclusive hold on
	// key belongs to a grant whose fence is not fence, it changes no hold
	// and answers as for a token that held nothing (or, for a resend of a
	// release that ran already, as that run did).
	ReleaseGrant(ctx context.Context, key, token string, fence uint64) (ReleaseResult, error)
}

// ReleaseAcquirer is implemented by backends that can send a release and an
// acquire of the same key in one round trip, the release first. A Client
// uses it when one of its goroutines releases a key that another of its
// goroutines waits for: the waiter's next attempt goes out with the
// release, rather than one round trip after it.
//
// The two requests are what Release (or ReleaseGrant, when fence is not 0)
// and Acquire would send, with the same answers and errors, and either may
// fail alone: the acquire runs after the release on the store, but other
// clients' requests may run between them. A failure of the round trip
// fails both with the same error (each outcome unknown).
type ReleaseAcquirer interface {
	ReleaseAcquire(ctx context.Context, key, token string, fence uint64, next AcquireRequest) (ReleaseAcquireResult, error)
}

// ReleaseAcquireResult is the answer to ReleaseAcquirer.ReleaseAcquire:
// the release's and the acquire's answers, and the acquire's error apart
// from the release's (returned by ReleaseAcquire itself).
type ReleaseAcquireResult struct {
	Release    ReleaseResult
	Acquire    AcquireResult
	AcquireErr error
}

// GrantRenewer is implemented by backends that can tie a renewal to the
// grant it extends. A token that outlives one Lock call (an owner ID shared
// by processes) can hold a newer grant on the store than the one a Client
// renews: the Client's grant expired on the store and another process of
// the same owner ID was granted the lock since. Renew would extend that
// newer grant, and the Client would go on trusting a fence that the
// protected resource now refuses, never told that its lease was lost.
type GrantRenewer interface {
	// RenewGrant is Renew, except that when token's exclusive hold on key
	// belongs to a grant whose fence is not fence, it extends nothing and
	// reports false. A backend with GrantRenewer that is a BatchRenewer
	// honours RenewRequest.Fence the same way.
	RenewGrant(ctx context.Context, key, token string, fence uint64, ttl time.Duration) (held bool, err error)
}

// Breaker is implemented by backends that can break an exclusive hold on the
// condition that it is still one grant: the dlock command takes over, this
// way, a lock whose holder is known to be dead (a process of the same host
// that has ended), and no other holder can lose its lock by mistake.
type Breaker interface {
	// BreakIf deletes the exclusive hold of key when the fence of its grant
	// is fence and the grant has no lock-delay (which the holder asked for
	// to keep others out after a crash), and notifies waiters with next ""
	// as ForceRelease does; broken reports whether it did. Shared holds,
	// the fair queue, writer intents and the fence counter stay. Like
	// ForceRelease it waits for no replica: a failover that loses it
	// brings the broken hold back until its TTL runs out.
	BreakIf(ctx context.Context, key string, fence uint64) (broken bool, err error)
}
