// Package dlock provides distributed locks over the stores teams already run:
// Redis on one node, Sentinel or Cluster (redislock), several independent
// Redis nodes with the Redlock quorum (redlock), MySQL/MariaDB, PostgreSQL
// and SQLite (sqllock), etcd (etcdlock), and, for tests and single
// processes, memory (memlock).
//
// A lock is held as a lease: a hold with a time to live on the store, renewed
// automatically while the holder works, and told to the holder the moment it
// can no longer be trusted.
//
//	c := dlock.New(redislock.New(rdb))
//	defer c.Close()
//
//	lease, err := c.Mutex("orders:42", dlock.WithTTL(10*time.Second)).Lock(ctx)
//	if err != nil {
//		return err // errors.Is(err, dlock.ErrNotObtained) when the wait ended first
//	}
//	defer lease.Unlock(ctx)
//	return updateOrder(lease.Context(), lease.Fence())
//
// # What makes it safe
//
// Owner tokens: every hold carries a random token, and the store compares it
// before it renews or releases, so a process can never extend or release a
// lock it does not hold.
//
// The loss signal: a lease has Done, Err and Context, like a
// context.Context. Context is cancelled as soon as the store says the lease is
// gone (renewal refused, key deleted), and in any case at Deadline minus a
// safety margin when renewals have failed or had no answer — measured on this
// process's monotonic clock from the moment the acquire or the last good
// renewal was sent, so it fires before the store can have let the lock go,
// whatever the store is doing. Run the protected work under lease.Context().
//
// Fencing: a lease can still outlive its welcome. A process can pause (garbage
// collection, a stopped VM, swapping) after it checked its lease and before its
// write lands. So every grant carries a fence, Lease.Fence, strictly greater
// than every earlier grant of that lock on that store. Give the fence to the
// resource you protect and let it refuse a write whose fence is lower than one
// it has already seen:
//
//	UPDATE stock SET qty = ?, fence = ? WHERE item = ? AND fence <= ?
//
// and treat "no row updated" as "someone newer holds the lock". For resources
// kept in Redis, redislock.FencedSet does the same in one script.
//
// The store's clock decides expiry (Redis PX), never a comparison of the wall
// clocks of two machines.
//
// # Waiting
//
// Lock waits without polling where the store can notify: the waiter
// subscribes to the lock's release channel before each attempt, so a release
// is never missed, and it also tries again when the holder's TTL runs out and,
// as a safety net, on a capped backoff (WithRetry). Goroutines of one Client
// waiting on one name queue locally: only one of them queries the store at a
// time, and only that one holds a place in a fair queue. A plain Mutex's wait
// that has lasted a millisecond joins the store's fair queue where the store
// has one (redislock, etcdlock, memlock), and so do the Client's other Lock
// calls on that name while the queue lives, so that an owner that unlocks
// and locks again cannot starve the others (as in Go's sync.Mutex); on
// redislock a plain RWMutex's and Semaphore's waits do the same. WithWait
// bounds a wait independently of the TTL; a cancelled wait returns promptly with
// errors.Join(*NotObtainedError, ctx.Err()), having removed what it left on
// the store (a queue entry, a writer intent) unless the store took longer
// than a quarter second to answer, when that goes on in the background.
//
// # Renewal
//
// With auto-renewal (the default) each lease is renewed every TTL/3 by one
// goroutine per Client, which keeps every lease in a timer heap and sends the
// renewals that fall due together in one batch (one pipelined round trip on
// Redis). Unlock stops a lease's renewal before it sends the release, and
// waits for a renewal already in flight, so no renewal reaches the store after
// Unlock has returned.
//
// # Reentrancy
//
// A *Mutex is an owner. With Reentrant, a handle that holds the lock may Lock
// it again; the hold count is kept on the store, every lease must be
// unlocked, and the last Unlock releases. Without it, a second Lock on the same
// handle waits like any other owner.
//
// # Lock kinds
//
// Besides the plain Mutex: Fair makes a Mutex serve waiters in arrival order
// and wake only the head of the queue; Client.RWMutex gives many readers or
// one writer, each reader a lease of its own, with waiting writers keeping
// new readers out; Client.Semaphore gives at most n holders, each permit a
// lease of its own. A name is one lock whatever the kind: a Mutex of a name is
// the write side of its RWMutex. Readers and permits do not mix, nor do
// semaphores of different sizes: while one holds a name, the other is
// refused with a *ConflictError (ErrConflict). Redlock has Mutex and
// RWMutex, not Fair or Semaphore. On Redis, Fair makes an RWMutex or a
// Semaphore fair too: writers, readers and permits queue together, and a
// release hands a freed permit, or the lock to the readers queued at the
// head, over itself.
//
// # Several names at once
//
// Client.Multi takes the locks of several names all or nothing, in the
// order of their keys, so that callers asking for overlapping sets in
// different orders cannot deadlock; a failed attempt releases what it
// took. The MultiLease has one lease and one fence per name, and its
// Context ends when any name is lost, which releases the others. See
// ExampleMulti.
//
// # Leader election
//
// Client.Election builds leader election on the Mutex of a name:
// Election.Campaign waits until the caller leads and returns a Leadership,
// a lease whose metadata is the leader's value; Election.Leader reads the
// current leader's value and fence, and Election.Observe gives a channel of
// changes, woken by the store's release notifications where it has them.
// Do the leader's work under Leadership.Context, which ends when the
// leadership is lost, and fence the leader's writes with Leadership.Fence:
// the context stops a leader that runs, only the fence stops one that was
// paused. See ExampleElection.
//
// There is no sync.Locker view of a Mutex, such as etcd's NewLocker
// gives: sync.Locker's Lock and Unlock take no context and return no
// error, and a lease can be lost while held, which its user could not
// notice, nor fence its writes. Client.Do has the same shape with the loss
// signal and the fence; docs/LOCK-KINDS.md says more.
//
// # Errors
//
// Branch with errors.Is: ErrNotObtained (with *NotObtainedError naming the
// holder), ErrNotHeld, ErrReleased, ErrLost (with *LostError and its
// LostReason), ErrNoLeader (Election.Leader), ErrConflict (with
// *ConflictError) for a reader or permit of another kind
// than the name's holds, ErrInvalid for bad arguments and ErrClosed. Store failures are
// wrapped with the operation and the lock's name.
package dlock

// Inside the package. A Client owns three components: the renewer
// (renew.go: one goroutine, a heap of grants), the wait hub (hub.go,
// stream.go, starve.go: waiter groups, the notification stream, the
// starvation policy) and its lifecycle (client.go). A handle (handle.go)
// backs Mutex, RWMutex and Semaphore; its Lock starts in lockturn.go and
// waits in lockwait.go. A grant (grant.go) is one hold on the store, and
// only grant.go changes its state; a Lease (lease.go) is one holder's view
// of a grant. See docs/ARCHITECTURE.md.
//
// Mutex order: a goroutine that holds several of the package's mutexes took
// them in this order, and takes none of them while it holds a later one:
//
//	handle.mu → grant.mu → renewer.mu
//	               grant.mu → Lease.mu
//	waitGroup.smu → waitHub.lmu → waitHub.mu
//
// Client.mu, renewer.mu, Lease.mu, waitHub.mu, reentryLock.mu and
// MultiLease.mu are leaves: nothing else is taken while one is held
// (waitHub.mu only signals channels without blocking). No mutex is held across a store call, except waitGroup.smu
// around a Subscribe (which serialises one group's subscribing) and
// waitHub.lmu around Listen.
