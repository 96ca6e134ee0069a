package redlock_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/redlock"
)

func TestNewRefusesBadInput(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	var nilClient *redis.Client
	for _, c := range []struct {
		what  string
		nodes []redis.UniversalClient
		opts  []redlock.Option
		want  string
	}{
		{"no nodes", nil, nil, "no nodes"},
		{"nil node", []redis.UniversalClient{rdb, nil}, nil, "node 1 is nil"},
		{"nil pointer node", []redis.UniversalClient{nilClient}, nil, "node 0 is nil"},
		{"brace in namespace", []redis.UniversalClient{rdb}, []redlock.Option{redlock.WithNamespace("a{b")}, "namespace"},
		{"zero node timeout", []redis.UniversalClient{rdb}, []redlock.Option{redlock.WithNodeTimeout(0)}, "node timeout"},
		{"negative drift factor", []redis.UniversalClient{rdb}, []redlock.Option{redlock.WithClockDrift(-0.1, 0)}, "clock drift"},
		{"drift factor 1", []redis.UniversalClient{rdb}, []redlock.Option{redlock.WithClockDrift(1, 0)}, "clock drift"},
		{"NaN drift factor", []redis.UniversalClient{rdb}, []redlock.Option{redlock.WithClockDrift(math.NaN(), 0)}, "clock drift"},
		{"negative drift extra", []redis.UniversalClient{rdb}, []redlock.Option{redlock.WithClockDrift(0, -time.Millisecond)}, "clock drift"},
	} {
		b, err := redlock.New(c.nodes, c.opts...)
		if b != nil || !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "redlock: ") {
			t.Errorf("%s: New = %v, %v; want an error wrapping dlock.ErrInvalid that says %q", c.what, b, err, c.want)
		}
	}
}

func TestQuorumAndDrift(t *testing.T) {
	for n, q := range map[int]int{1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 7: 4} {
		nodes := make([]redis.UniversalClient, n)
		for i := range nodes {
			nodes[i] = redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
			defer nodes[i].Close()
		}
		b, err := redlock.New(nodes)
		if err != nil {
			t.Fatal(err)
		}
		if b.Nodes() != n || b.Quorum() != q {
			t.Errorf("%d nodes: Nodes() = %d, Quorum() = %d; want %d, %d", n, b.Nodes(), b.Quorum(), n, q)
		}
		if got, want := b.Drift(10*time.Second), 102*time.Millisecond; got != want {
			t.Errorf("default Drift(10s) = %v, want 1%% + 2ms = %v", got, want)
		}
		b, _ = redlock.New(nodes, redlock.WithClockDrift(0.1, time.Second))
		if got, want := b.Drift(10*time.Second), 2*time.Second; got != want {
			t.Errorf("Drift(10s) with 10%% + 1s = %v, want %v", got, want)
		}
	}
}

func TestAcquireRenewReleaseOnEveryNode(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	b := newBackend(t, servers)
	req := request(t, "k", 10*time.Second)

	res := mustAcquire(t, b, req)
	if res.Fence != 1 || res.Holds != 1 {
		t.Errorf("first grant = %+v, want fence 1, holds 1", res)
	}
	redlock.WaitIdle(b) // the third node may answer after the quorum
	for i, f := range lockFields(t, nodes, "k") {
		if f[req.Token] != "1" || f["owner"] != req.Owner || f["fence"] != "1" {
			t.Errorf("node %d: lock hash %v, want the grant", i, f)
		}
	}
	held, err := b.Renew(t.Context(), "k", req.Token, 20*time.Second)
	if err != nil || !held {
		t.Fatalf("Renew = %v, %v; want held", held, err)
	}
	redlock.WaitIdle(b) // renew, too, returns once a quorum has renewed
	for i, n := range nodes {
		if d := n.PTTL(t.Context(), lockKey("k")).Val(); d <= 10*time.Second {
			t.Errorf("node %d: PTTL %v after renewal to 20s", i, d)
		}
	}
	if got := mustRelease(t, b, "k", req.Token); !got.Held || got.Remaining != 0 {
		t.Errorf("Release = %+v, want held with nothing remaining", got)
	}
	redlock.WaitIdle(b)
	if left := leftovers(t, nodes, "k"); len(left) > 0 {
		t.Errorf("left after release: %v", left)
	}
	if held, err := b.Renew(t.Context(), "k", req.Token, time.Second); err != nil || held {
		t.Errorf("Renew after release = %v, %v; want not held", held, err)
	}
}

func TestReleaseOfNeverGrantedLockLeavesNothing(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	b := newBackend(t, servers)
	res, err := b.Release(t.Context(), "never", newToken(t))
	if err != nil || res.Held || res.Remaining != 0 {
		t.Errorf("Release of a lock never granted = %+v, %v; want not held", res, err)
	}
	if left := leftovers(t, nodes, "never"); len(left) > 0 {
		t.Errorf("left after release: %v", left)
	}
	if c := counters(t, nodes, "never"); c[0]+c[1]+c[2] != 0 {
		t.Errorf("fence counters %v, want none", c)
	}
}

func TestHeldLockReportsHolder(t *testing.T) {
	servers := startNodes(t, 3)
	b := newBackend(t, servers)
	holder := request(t, "k", 10*time.Second)
	mustAcquire(t, b, holder)

	res, err := b.Acquire(t.Context(), request(t, "k", time.Second))
	if err != nil || res.Acquired {
		t.Fatalf("Acquire of a held lock = %+v, %v; want not acquired, nil error", res, err)
	}
	if res.Holder != holder.Owner || res.HolderTTL <= 9*time.Second || res.HolderTTL > 10*time.Second {
		t.Errorf("not acquired: holder %q for %v; want %q for about 10s", res.Holder, res.HolderTTL, holder.Owner)
	}
}

// Contenders that split the nodes between them all fail; each is told to
// come back after a short random delay, not after the others' TTL, and each
// undoes its grants without announcing them.
func TestSplitVoteRetriesSoonAndQuietly(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	b := newBackend(t, servers) // default node timeout 50ms
	holdForeign(t, nodes[0], "k", "alpha")
	holdForeign(t, nodes[1], "k", "beta")
	resetStats(t, nodes)

	req := request(t, "k", 10*time.Second)
	res, err := b.Acquire(t.Context(), req)
	if err != nil || res.Acquired {
		t.Fatalf("Acquire on split nodes = %+v, %v; want not acquired", res, err)
	}
	if res.HolderTTL <= 0 || res.HolderTTL > redlock.DefaultNodeTimeout {
		t.Errorf("HolderTTL = %v, want a short delay within the node timeout", res.HolderTTL)
	}
	redlock.WaitIdle(b)
	if f := lockFields(t, nodes, "k")[2]; len(f) > 0 {
		t.Errorf("node 2 still holds the failed attempt's grant: %v", f)
	}
	if n := commandCalls(t, nodes[2])["publish"]; n != 0 {
		t.Errorf("undoing the failed attempt published %d release(s)", n)
	}
}

// Contenders of two Clients of one process that split the nodes are two
// contenders, not one holder: their owner strings differ. When they were
// the same string, a third contender that won no node took them for a
// quorum holder and slept for their TTL after they had given up (the
// undoing of a lost attempt is not announced), and Redlock waiters stalled.
func TestSplitBetweenClientsOfOneProcess(t *testing.T) {
	// Five nodes, two of them down: the quorum of three needs every live
	// node, and the two Clients' contenders hold two and one of them.
	servers := startNodes(t, 5)
	nodes := admins(t, servers)
	// The owner strings the two Clients give their grants.
	var owners []string
	for range 2 {
		c := dlock.New(newBackend(t, servers))
		l, err := c.Mutex("owner-probe", dlock.WithTTL(time.Second)).TryLock(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		owners = append(owners, l.Owner())
		if err := l.Unlock(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	holdForeign(t, nodes[0], "k", owners[0])
	holdForeign(t, nodes[1], "k", owners[0])
	holdForeign(t, nodes[2], "k", owners[1])
	servers[3].Kill(t)
	servers[4].Kill(t)

	b := newBackend(t, servers)
	res, err := b.Acquire(t.Context(), request(t, "k", 10*time.Second))
	if err != nil || res.Acquired {
		t.Fatalf("Acquire on nodes split between two Clients = %+v, %v; want not acquired", res, err)
	}
	if res.HolderTTL <= 0 || res.HolderTTL > redlock.DefaultNodeTimeout {
		t.Errorf("HolderTTL = %v (holders %q), want a short delay within the node timeout", res.HolderTTL, owners)
	}
}

// With one node dead and the live nodes split between two contenders, an
// acquire is refused as contention (come back soon), not failed with a
// QuorumError, which would end a waiting Lock.
func TestSplitVoteWithDeadNodeIsContention(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	b := newBackend(t, servers)
	holdForeign(t, nodes[0], "k", "alpha")
	servers[2].Kill(t)

	res, err := b.Acquire(t.Context(), request(t, "k", 10*time.Second))
	if err != nil || res.Acquired {
		t.Fatalf("Acquire with one node held by another and one dead = %+v, %v; want not acquired, nil error", res, err)
	}
	if res.HolderTTL <= 0 || res.HolderTTL > redlock.DefaultNodeTimeout {
		t.Errorf("HolderTTL = %v, want a short delay within the node timeout", res.HolderTTL)
	}
	redlock.WaitIdle(b)
	if f := lockFields(t, nodes[:2], "k")[1]; len(f) > 0 {
		t.Errorf("node 1 still holds the failed attempt's grant: %v", f)
	}

	// With a majority dead it is an outage: a QuorumError.
	servers[1].Kill(t)
	_, err = b.Acquire(t.Context(), request(t, "k", 10*time.Second))
	var qe *redlock.QuorumError
	if !errors.As(err, &qe) {
		t.Fatalf("Acquire with two of three nodes dead = %v, want a *QuorumError", err)
	}
}

// With an even number of nodes, an owner holding half of them blocks every
// quorum but holds none: it is a contender, so the answer is a short retry,
// not a wait for its TTL.
func TestEvenSplitIsContention(t *testing.T) {
	servers := startNodes(t, 4)
	nodes := admins(t, servers)
	b := newBackend(t, servers)
	holdForeign(t, nodes[0], "k", "alpha")
	holdForeign(t, nodes[1], "k", "alpha")
	res, err := b.Acquire(t.Context(), request(t, "k", 10*time.Second))
	if err != nil || res.Acquired {
		t.Fatalf("Acquire with half the nodes held = %+v, %v; want not acquired", res, err)
	}
	if res.HolderTTL <= 0 || res.HolderTTL > redlock.DefaultNodeTimeout {
		t.Errorf("HolderTTL = %v, want a short delay within the node timeout", res.HolderTTL)
	}
}

func TestAcquireWithOneNodeDownIsNotDelayed(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	servers[2].Kill(t)
	const timeout = time.Second
	b := newBackend(t, servers, redlock.WithNodeTimeout(timeout))
	req := request(t, "k", time.Minute)

	start := time.Now()
	mustAcquire(t, b, req)
	if took := time.Since(start); took >= timeout {
		t.Errorf("Acquire with a dead node took %v, as long as the node timeout %v", took, timeout)
	}
	for i, f := range lockFields(t, nodes[:2], "k") {
		if f[req.Token] != "1" {
			t.Errorf("node %d: lock hash %v, want the grant", i, f)
		}
	}
	if held, err := b.Renew(t.Context(), "k", req.Token, time.Minute); err != nil || !held {
		t.Errorf("Renew with a dead node = %v, %v; want held", held, err)
	}
	if res, err := b.Release(t.Context(), "k", req.Token); err != nil || !res.Held {
		t.Errorf("Release with a dead node = %+v, %v; want held, nil error", res, err)
	}
}

// A node that accepts connections and never answers must not slow down an
// acquire or a renewal that a quorum of other nodes decides.
func TestSilentNodeDoesNotDelayDecisions(t *testing.T) {
	servers := startNodes(t, 2)
	nodes := admins(t, servers)
	const timeout = time.Second
	b := backendOn(t, []redis.UniversalClient{servers[0].Client(t), clientFor(t, silentNode(t), timeout), servers[1].Client(t)},
		redlock.WithNodeTimeout(timeout))
	req := request(t, "k", time.Minute)

	start := time.Now()
	mustAcquire(t, b, req)
	if took := time.Since(start); took >= timeout {
		t.Errorf("Acquire with a silent node took %v, as long as the node timeout %v", took, timeout)
	}
	start = time.Now()
	if held, err := b.Renew(t.Context(), "k", req.Token, time.Minute); err != nil || !held {
		t.Errorf("Renew = %v, %v; want held", held, err)
	}
	if took := time.Since(start); took >= timeout {
		t.Errorf("Renew with a silent node took %v, as long as the node timeout %v", took, timeout)
	}
	start = time.Now()
	if res, err := b.Acquire(t.Context(), request(t, "k", time.Minute)); err != nil || res.Acquired || res.Holder != req.Owner {
		t.Errorf("Acquire of the held lock = %+v, %v; want refused, naming the holder", res, err)
	}
	if took := time.Since(start); took >= timeout {
		t.Errorf("refused Acquire with a silent node took %v, as long as the node timeout %v", took, timeout)
	}
	// Release succeeds on the quorum that answered, without waiting for the
	// silent node's timeout.
	start = time.Now()
	if res, err := b.Release(t.Context(), "k", req.Token); err != nil || !res.Held {
		t.Errorf("Release = %+v, %v; want held, nil error", res, err)
	}
	if took := time.Since(start); took >= timeout {
		t.Errorf("Release with a silent node took %v, as long as the node timeout %v", took, timeout)
	}
	redlock.WaitIdle(b)
	if left := leftovers(t, nodes, "k"); len(left) > 0 {
		t.Errorf("left after release: %v", left)
	}
}

func TestMajorityDownIsQuorumError(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	servers[1].Kill(t)
	servers[2].Kill(t)
	b := newBackend(t, servers)
	req := request(t, "k", 10*time.Second)

	_, err := b.Acquire(t.Context(), req)
	var qe *redlock.QuorumError
	if !errors.As(err, &qe) {
		t.Fatalf("Acquire with 2 of 3 nodes down = %v, want a *QuorumError", err)
	}
	if qe.Op != "acquire" || qe.Key != "k" || qe.Nodes != 3 || qe.Quorum != 2 || qe.OK != 1 || len(qe.Errs) != 2 {
		t.Errorf("QuorumError = %+v, want acquire of k, 1 of 3 nodes agreed, 2 failed", qe)
	}
	for i, e := range qe.Unwrap() {
		var ne *redlock.NodeError
		if !errors.As(e, &ne) || ne.Node != i+1 || ne.Addr != servers[i+1].Addr() || ne.Err == nil {
			t.Errorf("Errs[%d] = %v, want a *NodeError for node %d at %s", i, e, i+1, servers[i+1].Addr())
		}
	}
	var ne *redlock.NodeError
	if !errors.As(err, &ne) {
		t.Errorf("errors.As(err, *NodeError) found nothing in %v", err)
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "redlock: 1 of 3 nodes agreed, quorum is 2: ") || strings.Contains(msg, `"k"`) {
		t.Errorf("message %q does not begin with the quorum, or names the key the caller names", msg)
	}
	for _, want := range []string{servers[1].Addr(), servers[2].Addr()} {
		if n := strings.Count(msg, want); n != 1 {
			t.Errorf("message %q says %q %d times, want once", msg, want, n)
		}
	}
	redlock.WaitIdle(b)
	if left := leftovers(t, nodes[:1], "k"); len(left) > 0 {
		t.Errorf("the failed acquire left %v on the live node", left)
	}

	if _, err := b.Renew(t.Context(), "k", req.Token, time.Second); !errors.As(err, &qe) || qe.Op != "renew" {
		t.Errorf("Renew = %v, want a *QuorumError for renew", err)
	}
	if _, err := b.Release(t.Context(), "k", req.Token); !errors.As(err, &qe) || qe.Op != "release" || qe.OK != 1 {
		t.Errorf("Release = %v, want a *QuorumError for release with 1 answer", err)
	}
	if _, _, err := b.Inspect(t.Context(), "k"); !errors.As(err, &qe) || qe.Op != "inspect" {
		t.Errorf("Inspect = %v, want a *QuorumError for inspect", err)
	}
}

func TestValidityElapsedGrantsNothing(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	// A drift allowance longer than the TTL leaves no validity at all.
	b := newBackend(t, servers, redlock.WithClockDrift(0.5, time.Hour))
	_, err := b.Acquire(t.Context(), request(t, "k", 10*time.Second))
	if !errors.Is(err, redlock.ErrValidityElapsed) || !strings.HasPrefix(err.Error(), "quorum won after ") ||
		strings.Count(err.Error(), "redlock: ") != 1 {
		t.Fatalf("Acquire = %v, want ErrValidityElapsed wrapped", err)
	}
	redlock.WaitIdle(b)
	if left := leftovers(t, nodes, "k"); len(left) > 0 {
		t.Errorf("nothing was granted, but the nodes still hold %v", left)
	}
}

func TestCancelledAcquireReturnsAtOnceAndLeavesNothing(t *testing.T) {
	servers := startNodes(t, 1)
	nodes := admins(t, servers)
	// Two silent nodes: the quorum can only be decided by their timeouts.
	const timeout = 2 * time.Second
	b := backendOn(t, []redis.UniversalClient{clientFor(t, silentNode(t), timeout), servers[0].Client(t), clientFor(t, silentNode(t), timeout)},
		redlock.WithNodeTimeout(timeout))
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := b.Acquire(ctx, request(t, "k", time.Minute))
		errc <- err
	}()
	eventually(t, "the live node has granted", func() bool { return len(leftovers(t, nodes, "k")) == 1 })
	cancelled := time.Now()
	cancel()
	err := <-errc
	if took := time.Since(cancelled); took >= timeout {
		t.Errorf("Acquire returned %v after its context was cancelled", took)
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Acquire = %v, want context.Canceled", err)
	}
	redlock.WaitIdle(b)
	if left := leftovers(t, nodes, "k"); len(left) > 0 {
		t.Errorf("the cancelled acquire left %v", left)
	}
}

func TestWithNamespace(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	b := newBackend(t, servers, redlock.WithNamespace("billing"))
	req := request(t, "k", time.Minute)
	mustAcquire(t, b, req)
	redlock.WaitIdle(b)
	for i, n := range nodes {
		if n.Exists(t.Context(), "billing:{k}").Val() != 1 || n.Exists(t.Context(), "dlock:{k}").Val() != 0 {
			t.Errorf("node %d: the lock is not under the namespace billing", i)
		}
	}
	// A refused attempt undoes its grants in the namespace too.
	holdForeign(t, nodes[0], "j", "x")
	nodes[0].Rename(t.Context(), lockKey("j"), "billing:{j}")
	holdForeign(t, nodes[1], "j", "y")
	nodes[1].Rename(t.Context(), lockKey("j"), "billing:{j}")
	if res, err := b.Acquire(t.Context(), request(t, "j", time.Minute)); err != nil || res.Acquired {
		t.Fatalf("Acquire on split nodes = %+v, %v", res, err)
	}
	redlock.WaitIdle(b)
	if n := nodes[2].Exists(t.Context(), "billing:{j}").Val(); n != 0 {
		t.Error("the refused attempt's grant on node 2 was not undone")
	}
}

func TestPing(t *testing.T) {
	servers := startNodes(t, 3)
	b := newBackend(t, servers)
	if err := b.Ping(t.Context()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	servers[2].Kill(t)
	if err := b.Ping(t.Context()); err != nil {
		t.Errorf("Ping with one node down: %v", err)
	}
	servers[1].Kill(t)
	err := b.Ping(t.Context())
	var qe *redlock.QuorumError
	if !errors.As(err, &qe) || qe.Op != "ping" || qe.OK != 1 || len(qe.Errs) != 2 || !strings.HasPrefix(err.Error(), "redlock: ping: 1 of 3 nodes agreed") {
		t.Errorf("Ping with two nodes down = %v, want a *QuorumError", err)
	}
}

// nodeClients returns a client per address (nodeClient), with the dialers
// and timeout hooks it gave them.
func nodeClients(t *testing.T, addrs []string, dialDelays []time.Duration) ([]redis.UniversalClient, []*countingDialer, []*timeoutHook) {
	t.Helper()
	clients := make([]redis.UniversalClient, len(addrs))
	dialers := make([]*countingDialer, len(addrs))
	hooks := make([]*timeoutHook, len(addrs))
	for i, addr := range addrs {
		dialers[i], hooks[i] = &countingDialer{delay: dialDelays[i]}, &timeoutHook{}
		clients[i] = nodeClient(t, addr, dialers[i], hooks[i])
	}
	return clients, dialers, hooks
}

// A node that answers after the node timeout, but within the limit of its
// calls (four node timeouts), is left out of the decisions and keeps its
// connection: its late answer is read, decides the follow-up (the late
// grants are undone), and the next call reuses the connection rather than
// dial first. Cut short at the node timeout, every call to it dropped its
// connection, and the next one dialed again within its own node timeout.
func TestLateAnswerKeepsItsConnection(t *testing.T) {
	const nodeTimeout = 100 * time.Millisecond
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	px := testserver.StartProxy(t, servers[0].Addr())
	clients, dialers, _ := nodeClients(t, []string{px.Addr(), servers[1].Addr(), servers[2].Addr()}, make([]time.Duration, 3))
	b := backendOn(t, clients, redlock.WithNodeTimeout(nodeTimeout))
	c := dlock.New(b)
	t.Cleanup(func() { _ = c.Close() })
	m := c.Mutex("late", dlock.WithTTL(10*time.Second), dlock.WithWait(5*time.Second))
	// Connections open and scripts loaded on every node.
	if err := b.Ping(t.Context()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	if l, err := m.Lock(t.Context()); err != nil {
		t.Fatalf("Lock: %v", err)
	} else if err := l.Unlock(t.Context()); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	redlock.WaitIdle(b)

	const late = 2 * nodeTimeout // past the node timeout, well within four
	px.RequestLatency(t, late, 0)
	dialed := dialers[0].dials.Load()
	const rounds = 8
	for i := range rounds {
		l, err := m.Lock(t.Context())
		if err != nil {
			t.Fatalf("round %d: Lock with node 0 answering %v late: %v", i, late, err)
		}
		if err := l.Unlock(t.Context()); err != nil {
			t.Fatalf("round %d: Unlock: %v", i, err)
		}
		redlock.WaitIdle(b) // node 0's late answers and follow-ups are in
	}
	if n := dialers[0].dials.Load() - dialed; n > 2 {
		t.Errorf("node 0, answering %v late, was dialed %d times in %d rounds: its calls' connections were dropped", late, n, rounds)
	}
	if left := leftovers(t, nodes, "late"); len(left) > 0 {
		t.Errorf("late grants left on the nodes: %v", left)
	}
}

// A writer intent that a node records after the attempt was decided (its
// answer came late) is withdrawn there: the result did not report it, so
// the waiter would not withdraw it when its wait ends, and it would keep
// new readers out of that node until its QueueTTL.
func TestLateWriterIntentIsWithdrawn(t *testing.T) {
	const nodeTimeout = 100 * time.Millisecond
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	px := testserver.StartProxy(t, servers[0].Addr())
	clients, _, _ := nodeClients(t, []string{px.Addr(), servers[1].Addr(), servers[2].Addr()}, make([]time.Duration, 3))
	b := backendOn(t, clients, redlock.WithNodeTimeout(nodeTimeout))
	if err := b.Ping(t.Context()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	// The withdrawal's script loaded on every node: loading it through the
	// slow proxy would take a second round trip.
	if err := redislock.New(nodes[0]).Withdraw(t.Context(), "other", newToken(t)); err != nil {
		t.Fatalf("Withdraw: %v", err)
	}
	// Node 0 has a reader, which makes a writer record its intent there;
	// the others an exclusive holder, which refuses it with none.
	reader := driver.AcquireRequest{Key: "k", Token: newToken(t), Owner: "reader", TTL: time.Minute, Mode: driver.Shared}
	if res, err := redislock.New(nodes[0]).Acquire(t.Context(), reader); err != nil || !res.Acquired {
		t.Fatalf("reader on node 0: %+v, %v", res, err)
	}
	holdForeign(t, nodes[1], "k", "alpha")
	holdForeign(t, nodes[2], "k", "alpha")

	px.RequestLatency(t, 2*nodeTimeout, 0) // past the node timeout, well within four
	req := request(t, "k", 10*time.Second)
	req.Wait, req.QueueTTL = true, time.Minute
	res, err := b.Acquire(t.Context(), req)
	if err != nil || res.Acquired || res.Queued {
		t.Fatalf("writer refused by two holders = %+v, %v; want refused, with no intent reported", res, err)
	}
	redlock.WaitIdle(b) // node 0's late answer and its follow-up are in
	if n, err := nodes[0].Exists(t.Context(), lockKey("k")+":w").Result(); err != nil || n != 0 {
		t.Errorf("node 0 keeps the late writer intent the result did not report (EXISTS = %d, %v)", n, err)
	}
	if res, err := redislock.New(nodes[0]).Acquire(t.Context(), driver.AcquireRequest{Key: "k", Token: newToken(t), Owner: "reader 2", TTL: time.Minute, Mode: driver.Shared}); err != nil || !res.Acquired {
		t.Errorf("a new reader on node 0 after the writer left: %+v, %v", res, err)
	}
}

// With one node late past the node timeout, and the other two slow to
// connect (a dial longer than the node timeout, as on a loaded machine or
// over a long link), the two go on granting every Lock: a call may take
// four node timeouts to connect and answer, so a slow dial costs at most
// the first attempt, and no call to the two times out. When every call had
// to connect within the node timeout, calls to the two were cut short
// while dialing, and each next call had to dial again.
func TestSlowNodeDoesNotMakeOthersMiss(t *testing.T) {
	const nodeTimeout = 200 * time.Millisecond
	const slowDial = 3 * nodeTimeout / 2
	servers := startNodes(t, 3)
	px := testserver.StartProxy(t, servers[0].Addr())
	px.RequestLatency(t, 2*nodeTimeout, 0)
	clients, dialers, hooks := nodeClients(t, []string{px.Addr(), servers[1].Addr(), servers[2].Addr()},
		[]time.Duration{0, slowDial, slowDial})
	b := backendOn(t, clients, redlock.WithNodeTimeout(nodeTimeout))
	c := dlock.New(b)
	t.Cleanup(func() { _ = c.Close() })
	m := c.Mutex("slow", dlock.WithTTL(10*time.Second), dlock.WithWait(5*time.Second))

	// The first Lock connects to the nodes: its first attempt may miss.
	l, err := m.Lock(t.Context())
	if err != nil {
		t.Fatalf("Lock with node 0 late and dials of %v: %v", slowDial, err)
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	const rounds = 10
	for i := range rounds {
		l, err := m.Lock(t.Context())
		if err != nil {
			t.Fatalf("round %d: Lock with node 0 late: %v", i, err)
		}
		if err := l.Unlock(t.Context()); err != nil {
			t.Fatalf("round %d: Unlock: %v", i, err)
		}
	}
	for i := 1; i < 3; i++ {
		if n := hooks[i].timeouts.Load(); n > 0 {
			t.Errorf("node %d (no latency, dials of %v): %d calls timed out", i, slowDial, n)
		}
		if n := dialers[i].dials.Load(); n > 4 {
			t.Errorf("node %d was dialed %d times in %d rounds: its connections were dropped", i, n, rounds+1)
		}
	}
}

// TestContendedAcquireAsksTheLeaderFirst checks that an exclusive attempt
// on a key that refused the Backend a moment ago asks one node first, and
// stops there when another owner holds it: contenders that all asked every
// node at once would split the nodes between them.
func TestContendedAcquireAsksTheLeaderFirst(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	// A node slower than the node timeout would turn the order off (see
	// the next test): a long one keeps a loaded machine from doing so.
	slow := redlock.WithNodeTimeout(time.Second)
	b := newBackend(t, servers, slow)
	for _, n := range nodes {
		holdForeign(t, n, "k", "alpha")
	}
	runs := func() []int {
		redlock.WaitIdle(b)
		var out []int
		for _, n := range nodes {
			out = append(out, scriptRuns(t, n))
		}
		return out
	}

	// Not contended yet: every node at once.
	resetStats(t, nodes)
	if res, err := b.Acquire(t.Context(), request(t, "k", 10*time.Second)); err != nil || res.Acquired || res.Holder != "alpha" {
		t.Fatalf("first Acquire of a held key = %+v, %v; want refused by alpha", res, err)
	}
	if got := runs(); !slices.Equal(got, []int{1, 1, 1}) {
		t.Fatalf("the first attempt ran %v scripts on the nodes, want one on each", got)
	}

	resetStats(t, nodes)
	res, err := b.Acquire(t.Context(), request(t, "k", 10*time.Second))
	if err != nil || res.Acquired || res.Holder != "alpha" || res.HolderTTL <= time.Second {
		t.Fatalf("contended Acquire = %+v, %v; want refused by alpha, with its TTL", res, err)
	}
	got := runs()
	leader := slices.Index(got, 1)
	if leader < 0 || slices.Max(got) != 1 || sum(got) != 1 {
		t.Fatalf("the contended attempt ran %v scripts on the nodes, want one on one node", got)
	}

	// The holder lets go: the next attempt asks the leader, then the rest.
	for _, n := range nodes {
		if err := n.Del(t.Context(), lockKey("k")).Err(); err != nil {
			t.Fatal(err)
		}
	}
	req := request(t, "k", 10*time.Second)
	if res := mustAcquire(t, b, req); !res.Acquired {
		t.Fatalf("Acquire of the released key = %+v, want granted", res)
	}
	redlock.WaitIdle(b)
	for i, f := range lockFields(t, nodes, "k") {
		if f[req.Token] != "1" {
			t.Errorf("node %d (leader %d) does not hold the grant: %v", i, leader, f)
		}
	}

	// The same key takes the same leader in another Backend.
	other := newBackend(t, servers, slow)
	for _, n := range nodes {
		holdForeign(t, n, "k", "alpha")
	}
	if _, err := other.Acquire(t.Context(), request(t, "k", 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	redlock.WaitIdle(other) // the first attempt's last node may answer after the refusal
	resetStats(t, nodes)
	if _, err := other.Acquire(t.Context(), request(t, "k", 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	redlock.WaitIdle(other)
	if got := runs(); got[leader] != 1 || sum(got) != 1 {
		t.Errorf("another Backend's contended attempt ran %v scripts on the nodes, want one on node %d", got, leader)
	}
}

// TestContendedAcquireAsksEveryNodeWhileOneFails checks that a node that
// failed turns the leader's order off: the next attempts ask every node at
// once, so an outage is seen as one, and a slow leader delays nobody.
func TestContendedAcquireAsksEveryNodeWhileOneFails(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	leader := keyLeader(t, servers, nodes, "k") // leaves alpha holding k
	dead := (leader + 1) % 3
	servers[dead].Kill(t)

	// A long node timeout: only the dead node, not a call slowed by a
	// loaded machine, turns the leader's order off.
	b := newBackend(t, servers, redlock.WithNodeTimeout(time.Second))
	if res, err := b.Acquire(t.Context(), request(t, "k", 10*time.Second)); err != nil || res.Acquired || res.Holder != "alpha" {
		t.Fatalf("Acquire with alpha on both live nodes = %+v, %v; want refused by alpha", res, err)
	}
	redlock.WaitIdle(b)
	resetStats(t, []*redis.Client{nodes[leader], nodes[3-leader-dead]})
	if res, err := b.Acquire(t.Context(), request(t, "k", 10*time.Second)); err != nil || res.Acquired {
		t.Fatalf("contended Acquire = %+v, %v; want refused", res, err)
	}
	redlock.WaitIdle(b)
	for _, i := range []int{leader, 3 - leader - dead} {
		if n := scriptRuns(t, nodes[i]); n != 1 {
			t.Errorf("live node %d (leader %d, dead %d) ran %d scripts, want 1: every node asked at once", i, leader, dead, n)
		}
	}
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

// keyLeader returns the index of key's leader node: the node that a
// contended exclusive attempt asks alone. It leaves key held by alpha on
// every node. The probe's node timeout is long, so that a call slowed by
// a loaded machine does not turn the leader's order off (see
// Backend.Acquire) and show every node.
func keyLeader(t *testing.T, servers []*testserver.Redis, nodes []*redis.Client, key string) int {
	t.Helper()
	for _, n := range nodes {
		holdForeign(t, n, key, "alpha")
	}
	probe := newBackend(t, servers, redlock.WithNodeTimeout(time.Second))
	if _, err := probe.Acquire(t.Context(), request(t, key, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	redlock.WaitIdle(probe)
	resetStats(t, nodes)
	if _, err := probe.Acquire(t.Context(), request(t, key, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	redlock.WaitIdle(probe)
	leader, asked := -1, 0
	for i, n := range nodes {
		if runs := scriptRuns(t, n); runs > 0 {
			leader, asked = i, asked+runs
		}
	}
	if asked != 1 {
		t.Fatalf("the contended probe ran %d scripts on the nodes, want one on its leader", asked)
	}
	return leader
}

// contendedOnAlpha starts three nodes, on which alpha holds "k" (see
// keyLeader), and returns them, the key's leader and a Backend (node timeout
// 1s) that alpha refused on every node: the key is contended for it.
func contendedOnAlpha(t *testing.T) ([]*testserver.Redis, []*redis.Client, int, *redlock.Backend) {
	t.Helper()
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	leader := keyLeader(t, servers, nodes, "k")
	b := newBackend(t, servers, redlock.WithNodeTimeout(time.Second))
	if res, err := b.Acquire(t.Context(), request(t, "k", 10*time.Second)); err != nil || res.Acquired || res.Holder != "alpha" {
		t.Fatalf("Acquire of a held key = %+v, %v; want refused by alpha", res, err)
	}
	return servers, nodes, leader, b
}

// TestContendedAcquireIsHeldUpBrieflyByAHoldOnTheLeaderAlone checks that a hold
// left on the key's leader node alone, as by a holder's release that did
// not reach it, keeps a contended key from its waiters at most about
// contendedFor (1s): a quorum of the nodes is free, and attempts that keep
// stopping at the leader must not keep the key contended.
func TestContendedAcquireIsHeldUpBrieflyByAHoldOnTheLeaderAlone(t *testing.T) {
	_, nodes, leader, b := contendedOnAlpha(t)
	// alpha's release reaches every node but the leader.
	for i, n := range nodes {
		if i != leader {
			if err := n.Del(t.Context(), lockKey("k")).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A waiter polls every 50ms.
	start := time.Now()
	for {
		res, err := b.Acquire(t.Context(), request(t, "k", 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if res.Acquired {
			t.Logf("granted after %v", time.Since(start).Round(time.Millisecond))
			return
		}
		if time.Since(start) > 2500*time.Millisecond {
			t.Fatalf("still refused after %v with a quorum of the nodes free: %+v (alpha's hold is on leader %d alone)",
				time.Since(start).Round(time.Millisecond), res, leader)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestContendedAcquireReportsAnOutageSoon checks that attempts that stop
// at the leader, refused there by a holder, do not hide for long that the
// other nodes are down: the outage is a QuorumError within about
// contendedFor (1s), as it is at once for an attempt that asks every node.
func TestContendedAcquireReportsAnOutageSoon(t *testing.T) {
	servers, _, leader, b := contendedOnAlpha(t)
	redlock.WaitIdle(b) // no call of b is out when the nodes die
	for i, srv := range servers {
		if i != leader {
			srv.Kill(t)
		}
	}
	start := time.Now()
	for {
		res, err := b.Acquire(t.Context(), request(t, "k", 10*time.Second))
		var qe *redlock.QuorumError
		if errors.As(err, &qe) {
			t.Logf("outage reported after %v: %v", time.Since(start).Round(time.Millisecond), err)
			return
		}
		if err != nil {
			t.Fatalf("Acquire with two of three nodes dead = %v, want a *QuorumError", err)
		}
		if time.Since(start) > 3500*time.Millisecond { // a call to a dead node runs its node timeout (1s)
			t.Fatalf("two of three nodes dead for %v, and Acquire still answers %+v, nil",
				time.Since(start).Round(time.Millisecond), res)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestContendedAcquireWaitsForASilentLeaderOnce checks that a leader that
// has not answered within the node timeout turns the leader's order off at
// once: the next attempt asks every node at once instead of waiting for
// the silent leader again, for as long as its call is still out.
func TestContendedAcquireWaitsForASilentLeaderOnce(t *testing.T) {
	const timeout = 300 * time.Millisecond // calls to a silent node run 1s
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	leader := keyLeader(t, servers, nodes, "k")
	b := newBackend(t, servers, redlock.WithNodeTimeout(timeout))
	if res, err := b.Acquire(t.Context(), request(t, "k", 10*time.Second)); err != nil || res.Acquired || res.Holder != "alpha" {
		t.Fatalf("Acquire of a held key = %+v, %v; want refused by alpha", res, err)
	}
	servers[leader].Pause(t)
	begin := time.Now()
	if res, err := b.Acquire(t.Context(), request(t, "k", 10*time.Second)); err != nil || res.Acquired || res.Holder != "alpha" {
		t.Fatalf("Acquire with the leader silent = %+v, %v; want refused by alpha on the others", res, err)
	}
	if took := time.Since(begin); took < timeout {
		t.Fatalf("the first attempt with the leader silent took %v, want at least the node timeout %v: it did not ask the leader first", took, timeout)
	}
	begin = time.Now()
	if res, err := b.Acquire(t.Context(), request(t, "k", 10*time.Second)); err != nil || res.Acquired || res.Holder != "alpha" {
		t.Fatalf("second Acquire with the leader silent = %+v, %v; want refused by alpha on the others", res, err)
	}
	if took := time.Since(begin); took >= timeout {
		t.Errorf("the next attempt took %v: it waited the node timeout %v for the silent leader again", took, timeout)
	}
	servers[leader].Resume(t)
}
