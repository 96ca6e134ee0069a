// Package redlock is a dlock backend on N independent Redis nodes that
// grants a lock only when a majority of them grant it: the Redlock
// algorithm, with fencing tokens that increase across grants, lock-delay and
// release notifications.
//
//	nodes := []redis.UniversalClient{
//		redis.NewClient(&redis.Options{Addr: "redis-a:6379"}),
//		redis.NewClient(&redis.Options{Addr: "redis-b:6379"}),
//		redis.NewClient(&redis.Options{Addr: "redis-c:6379"}),
//	}
//	backend, err := redlock.New(nodes)
//	if err != nil { ... }
//	client := dlock.New(backend)
//
// Each node is used through a redislock.Backend, so every node stores a lock
// exactly as a single-node redislock does (see that package for the keys);
// a quorum of Q = N/2+1 nodes must agree on every acquire and renewal.
//
// # When to use it
//
// One Redis node (redislock) is simpler and faster, and is enough when a
// lost lock only costs duplicate work. Sentinel adds failover, but
// replication is asynchronous: a replica promoted after a crash may not have
// the latest grants, so two holders can meet. Redlock keeps working, and
// keeps its locks, while a minority of its nodes is down, slow or
// partitioned away, without failover. Use three or five nodes that fail
// independently (separate machines, not replicas of each other). For locks
// whose safety must not depend on time at all, use a consensus store such as
// etcd, and in every case check fences at the protected resource.
//
// # Timeouts and drift
//
// Every call goes to all nodes at once, one goroutine per node, and Acquire
// and Renew decide as soon as the quorum is won or lost: a slow or dead
// minority never delays them. An acquire or renewal waits for each node's
// answer min(node timeout, TTL/10) (WithNodeTimeout; 50ms by default).
// The call to a late node is not cut short there: every call to a node may
// run min(4 × node timeout, 1s), at least one node timeout, so that a late
// answer is still read (its connection is kept, and its outcome decides
// the clean-up) and a call that must first connect has time to. go-redis
// drops a connection whose read was cut short by a deadline, so cutting
// calls at the node timeout made the next call to a late node dial first,
// within its own node timeout. Release and inspection wait for each node as
// long as the call may run. Give the nodes' clients ContextTimeoutEnabled,
// so that the calls' deadlines bound their reads (without it go-redis waits
// for ReadTimeout, 5s by default, which keeps a goroutine busy that long on
// a node that hangs). A client's first call also connects and can miss a
// short node timeout: Backend.Ping at startup opens the connections.
//
// The nodes' clocks decide when a lease expires there. A grant is valid for
// TTL − elapsed − drift, where elapsed is how long winning the quorum took
// and drift = TTL × 0.01 + 2ms by default (WithClockDrift) allows for the
// nodes' clocks running at slightly different rates than the client's.
// Acquire grants nothing when that is not positive (ErrValidityElapsed); the
// dlock client ends every lease drift before send time + TTL (Backend.Drift)
// and then its own safety margin.
//
// # Fences
//
// Each node keeps a fence counter per lock and draws a new fence with INCR
// when it grants. The nodes' counters drift apart (a node that was down
// misses grants), so a grant takes the highest fence F among the Q nodes
// that won it, and the winning nodes that drew less are given F by a second
// script (redislock's raise_fence.lua), which also raises their counter to at
// least F; unless Q nodes end up with a counter of at least F, nothing is
// granted. When the counters agree, as they do while all nodes are up, this
// costs no second round trip.
//
// Why fences increase: after a grant with fence F1, a quorum S1 of nodes has
// a counter of at least F1. A later grant is won on a quorum W2 of nodes,
// and any two quorums share a node. On a shared node the later grant's INCR
// comes after the earlier grant's raise there (the raise needs the earlier
// grant to hold that node, and the later one can take the node only once
// that hold is gone), so it draws more than F1, and the later fence, the
// highest in W2, is more than F1 too. This needs three things: counters never
// go back (persistence: a node restarted without its data forgets them), a
// node's hold does not vanish before its TTL (no clock jumps), and a grant
// is not used after its validity (bounded drift and pauses, which is what the
// validity check and the client's deadline are for). A re-entry keeps the
// fence of the grant it joins, and counts only when a quorum of nodes
// re-entered that grant alike (see Backend.Acquire).
//
// # Read-write locks
//
// Readers (dlock's RWMutex.RLock) are shared holds, granted like a lock on a
// quorum of nodes, each with its own token, TTL and fence; a writer needs a
// quorum without readers. Any two quorums share a node, where a reader and
// a writer exclude each other, so they never both hold a quorum. A waiting
// writer's intent is kept per node and keeps new readers off the nodes
// where readers refused it. Readers whose acquires overlap in time can get
// the same fence; every other pair of grants is ordered. Semaphores and
// fair locks are not offered (Backend.Supports): a limit counted per node
// does not bound the total over different majorities, and the nodes'
// queues do not agree on an order. See docs/REDLOCK.md.
//
// When the timing assumptions fail (a process paused past its lease, a
// clock stepped on a node), two holders can hold the lock at once, as with
// any lease; fences then tell the resource which one is newer, and
// dlock.WithLockDelay keeps an expired lock out of reach for a while on each
// node. See docs/REDLOCK.md for the whole argument and its limits.
package redlock
