// Package redislock is a dlock backend on Redis: one node, Sentinel or
// Cluster, through a go-redis UniversalClient.
//
//	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
//	client := dlock.New(redislock.New(rdb))
//
// # What it stores
//
// For a lock key K in namespace NS (WithNamespace, "dlock" by default):
//
//	NS:{K}        a hash: owner token → hold count, "owner" → the holder's
//	              description, "fence" → the fence of the current grant,
//	              "at" → when it was granted; with a lock-delay also
//	              "delay". It carries the lease's TTL plus the delay (the
//	              lease has expired once its PTTL is down to the delay)
//	              and is deleted on release.
//	NS:{K}:fence  the fence counter (INCR). It never expires.
//	NS:{K}:s      the shared holds (readers of an RWMutex, permits of a
//	              Semaphore): a sorted set of tokens scored by expiry,
//	NS:{K}:si     and a hash of each one's fence, Limit and owner.
//	NS:{K}:w      a writer's intent: a hash of its token and owner, with
//	              the waiter's QueueTTL.
//	NS:{K}:q      the queue of a fair Mutex: a sorted set of tokens in
//	NS:{K}:qe     arrival order, one of their expiries, and a hash of the
//	NS:{K}:qo     owners of the entries that accept a direct handoff (and,
//	              under NUL + token, the id of their Backend's handoff
//	              channel).
//	NS:{K}:r      the ids of the latest releases, for 15s (resent requests).
//	NS:{K}:late   the requests that must not take effect if they land late
//	              (released or withdrawn), for 5s after the last write.
//	NS:{K}:rel    the pub/sub channel on which a release is announced.
//	NS:{K}:ho:ID:rel  a Backend's handoff channel: a release that hands
//	              the lock to that Backend's queue entry announces it
//	              there, to its Client alone, and on NS:{K}:ho:rel, which
//	              election observers hear.
//
// Expiries are the server's clock in milliseconds (TIME): the scripts drop
// the shared holds and queue entries that have expired, and each of the
// groups :s/:si and :q/:qe/:qo expires with its latest entry (:q/:qe/:qo up to
// a quarter of a QueueTTL after it), so nothing but the fence counter is left
// once every holder and waiter has gone and :r and :late have expired.
//
// The braces are a Cluster hash tag, so one lock's keys share a slot and a
// single script can touch them together. Acquire, renew and release are each
// one Lua script (EVALSHA, with EVAL when the server has lost its script
// cache), so each is one round trip and atomic; RenewBatch renews any number
// of leases in one pipeline. The scripts declare every key they may touch;
// while a lock's slot migrates between Cluster nodes, the node that imports
// it answers them with TRYAGAIN (go-redis retries a few times) until the
// migration is done, rather than act on half a lock.
//
// The fence counter stays after release on purpose: one small key for every
// name ever locked is the price of fences that never go back, even when a
// name is released and locked again. Deleting it would restart the name's
// fences at 1 and let a stale writer pass a fencing check. Names that are
// made up per request (an order ID, say) therefore leave one counter each;
// expire or delete NS:{K}:fence yourself only for names that will never be
// locked again. FencedSet and FencedGet are the matching check for
// resources kept in Redis.
//
// # Time and failure
//
// Redis's clock decides when a lease expires (PEXPIRE); the dlock client
// measures on its own monotonic clock how long it may trust a lease, and
// never compares the clocks of two machines.
//
// One Redis node is a single point of failure: if it is lost, so are its
// locks, and an asynchronously replicated replica promoted by Sentinel may
// not have seen the latest grants; WithReplicaAck makes every grant and
// renewal wait for replicas (WAIT), so that a failover keeps the lock.
// Without persistence (appendonly with fsync) a restarted node has forgotten
// its fence counters too. Locks that must survive the loss of a node without
// replicas need a quorum of independent nodes (package redlock) or a
// consensus store such as etcd.
//
// Waiters are woken by pub/sub on one shared connection per dlock client:
// see Backend.Listen. On one node and Sentinel, release publishes with
// PUBLISH; on a Cluster it uses sharded pub/sub (SPUBLISH, heard with
// SSUBSCRIBE on the primary of the lock's slot, one connection per primary),
// so a release is not broadcast to every node. Sharded pub/sub needs Redis
// 7.0 or later; so does a ClusterClient of any kind here, including one made
// by NewFailoverClusterClient.
//
// WithLockDelay of package dlock is kept in the lock's hash: an expired lease
// keeps the key, and others out, for the delay.
package redislock
