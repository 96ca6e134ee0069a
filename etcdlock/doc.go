// Package etcdlock is a dlock backend on etcd (go.etcd.io/etcd/client/v3),
// for locks that must survive the loss of a store node: etcd replicates
// every write through Raft to a majority of its members before it answers,
// so a grant that was answered survives the crash of any minority of the
// cluster, leader included, and no failover can grant a lock twice.
//
//	cfg := clientv3.Config{Endpoints: []string{"h1:2379", "h2:2379", "h3:2379"}}
//	etcdlock.Configure(&cfg) // keep-alives: see Configure
//	cli, err := clientv3.New(cfg)
//	...
//	c := dlock.New(etcdlock.New(cli))
//	defer c.Close()
//
// # Keys and transactions
//
// A lock named N lives under the directory "dlock/" + N + NUL (see
// WithNamespace): key "e" holds the exclusive holder (token, hold count,
// TTL, owner), "s\x00TOKEN" a shared hold (reader or semaphore permit),
// "w\x00TOKEN" a writer intent, "q\x00TOKEN" a fair waiter's queue entry
// (its place is its create revision). Acquire is one transaction that puts the
// holder's key if the lock is free (etcd compares a whole key range, so
// "no shared hold" is one compare); a refusal reads the holder in the same
// round trip. Release is one transaction when the backend made or renewed
// the grant and nobody changed it since, two otherwise. A semaphore permit
// costs a read and a transaction (etcd cannot count keys in a compare), and
// so does a queued fair waiter's attempt (the queue's order is its create
// revisions).
//
// # Fences
//
// A grant's fence is the create revision of the key that holds it: the
// revision of the transaction that made the grant (for a grant made by a
// direct handoff, which overwrites the releaser's key, the revision of the
// handoff's transaction, which the key's value records). etcd's revision is one
// counter for the whole key space, raised by every write and replicated
// through the Raft log, so a later grant always has a larger revision: a
// new leader continues from the log that a majority acknowledged, and a
// restarted member replays its log and snapshot, so the counter never goes
// back across leader changes, member crashes or a restart of the whole
// cluster (TestFencesAcrossFailover kills the leader, then every member,
// and checks it). Fences of one lock are therefore strictly increasing but
// not consecutive. What breaks it: restoring the cluster from an older
// snapshot (etcdctl snapshot restore), which takes the revision back; do
// that only with the protected resources restored to the same point.
//
// # Leases and renewal
//
// A grant's key is attached to an etcd lease, so the cluster's own clock
// (the leader's) expires it. The grants of one Backend share leases, one
// per TTL rounded up to whole seconds (etcd's unit), and a lease lives half
// its TTL longer than the rounded TTL (at least a second): a store-side
// lock may outlive its TTL by that much when its holder dies. Renewal
// reads the grant (one transaction for up to 64 grants) and sends one
// LeaseKeepAlive per lease only when the lease would not cover the new
// TTL, so the keep-alive traffic does not grow with the number of locks.
// A lease must not keep alive a lock that its holder stopped renewing: when
// one of its grants is past the time its holder asked to keep it, the lease
// is retired and its live grants move to a fresh lease at their next
// renewal (one compare-and-put each, the fence unchanged). A grant of
// unknown outcome (the answer lost) counts the same: recorded on the lease
// before it is sent, it retires the lease when nobody takes it up within
// its TTL. A Backend never keeps alive another Backend's lease: a grant
// shared through an owner ID that sits on another process's lease moves to
// this Backend's at re-entry or renewal.
//
// # Waiting
//
// Waiters are woken by watches: a Listener watches, for a token of its
// Backend's queued behind another entry, that entry alone (etcd's own
// recipe), and otherwise the directory of the lock, on one gRPC stream. A
// release (or an expiry, a forced release) wakes the fair queue's head
// alone when the lock has a queue, and every waiter otherwise; a released
// shared hold or a writer intent gone wakes everyone. A queued waiter
// keeps its entry by keeping its lease alive, not by writing it, so that
// its refreshes wake nobody. The watches require a leader, so a member cut
// off from the majority ends them and waiters retry.
//
// # Not supported
//
// Claims and lock-delay are not implemented: the client refuses
// dlock.WithLockDelay with ErrInvalid on this backend. A plain grant
// reports whether it overtook the fair queue, so a plain Mutex's starving
// waiters join the queue, as on Redis. A Fair Mutex waits with direct
// handoffs (driver.CapHandoff): a release grants the lock to the queue's
// head in its own transaction, and the head's Lock completes from its
// watch event (see docs/ETCD.md, "Waiting"). Versions of etcdlock without
// the handoff misread a handed grant's fence: while any shares the
// namespace, run with WithHandoff(false) (see docs/ETCD.md, "Upgrading to
// the handoff").
// HeldFor in Inspect is 0: etcd keeps no time with a key.
package etcdlock
