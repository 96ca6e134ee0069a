package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/locktest"
	"github.com/dlock-go/dlock/redislock"
)

// clusterSize is the number of primaries of the test clusters.
const clusterSize = 3

// TestClusterConformance runs the locktest suite on a 3-primary Redis
// Cluster, each Client on a ClusterClient of its own. A cluster takes over
// 2s to form (Redis does not let a new primary serve before that), so the
// cases share one cluster, emptied with FLUSHALL on every node after each
// case; after StoreKilled, which kills every node, the nodes are started
// again (empty, as nothing is persisted) before the next case.
func TestClusterConformance(t *testing.T) {
	c := testserver.StartCluster(t, clusterSize)
	admin := c.Client(t)
	locktest.Run(t, func(t *testing.T) *locktest.Store {
		killed := false
		t.Cleanup(func() {
			if killed {
				for i := range c.Len() {
					c.Node(i).Start(t)
				}
				c.WaitReady(t)
			}
			for i := range c.Len() {
				if err := c.Node(i).Client(t).FlushAll(context.Background()).Err(); err != nil {
					t.Errorf("FLUSHALL on node %d: %v", i, err)
				}
			}
		})
		return &locktest.Store{
			NewBackend: func(t *testing.T) driver.Backend { return redislock.New(c.Client(t)) },
			Delete: func(t *testing.T, key string) {
				if n, err := admin.Del(t.Context(), holdKeys(key)...).Result(); err != nil || n < 1 {
					t.Fatalf("DEL lock %q = %d, %v", key, n, err)
				}
			},
			Leftovers: func(t *testing.T, key string) []string {
				// One lock's keys share a slot, so they are all on its master.
				node, err := admin.MasterForKey(t.Context(), lockKey(key))
				if err != nil {
					t.Fatalf("master of %q: %v", key, err)
				}
				keys, err := node.Keys(t.Context(), lockKey(key)+"*").Result()
				if err != nil {
					t.Fatalf("KEYS: %v", err)
				}
				var left []string
				for _, k := range keys {
					if !strings.HasSuffix(k, ":fence") && !strings.HasSuffix(k, ":r") && !strings.HasSuffix(k, ":late") { // kept on purpose: the fence counter; recent releases (15s); the late-request record (5s)
						left = append(left, k)
					}
				}
				return left
			},
			Kill: func(t *testing.T) {
				killed = true
				for i := range c.Len() {
					c.Node(i).Kill(t)
				}
			},
		}
	})
}

// lockKey is the name of the lock hash of key in the default namespace.
func lockKey(key string) string { return "dlock:{" + key + "}" }

// keysPerNode returns n keys for each node of c: keys[i] are served by node i.
func keysPerNode(t *testing.T, c *testserver.Cluster, n int) [][]string {
	t.Helper()
	keys := make([][]string, c.Len())
	for i := 0; ; i++ {
		key := fmt.Sprintf("k%d", i)
		node := c.NodeOf(t, lockKey(key))
		if len(keys[node]) < n {
			keys[node] = append(keys[node], key)
		}
		if !slices.ContainsFunc(keys, func(k []string) bool { return len(k) < n }) {
			return keys
		}
		if i > 1000 {
			t.Fatalf("1000 keys did not reach every node: %v", keys)
		}
	}
}

// shardNumSub returns the number of subscribers of key's release channel on
// the master of its slot.
func shardNumSub(t *testing.T, c *testserver.Cluster, key string) int64 {
	t.Helper()
	ch := lockKey(key) + ":rel"
	m, err := c.Node(c.NodeOf(t, ch)).Client(t).PubSubShardNumSub(t.Context(), ch).Result()
	if err != nil {
		t.Fatalf("PUBSUB SHARDNUMSUB %s: %v", ch, err)
	}
	return m[ch]
}

// setupCluster starts a cluster for a test that runs in parallel with the
// other cluster tests (each waits over 2s for its cluster to form), and
// returns a Backend on it.
func setupCluster(t *testing.T) (*redislock.Backend, *testserver.Cluster) {
	t.Helper()
	t.Parallel()
	c := testserver.StartCluster(t, clusterSize)
	return redislock.New(c.Client(t)), c
}

func TestClusterLocksSpreadOverNodes(t *testing.T) {
	b, c := setupCluster(t)
	ctx := t.Context()
	perNode := make([]int, c.Len())
	for i := range 30 {
		key := fmt.Sprintf("orders:%d", i)
		mustAcquire(t, b, driver.AcquireRequest{Key: key, Token: newToken(t), Owner: "o", TTL: time.Minute})
		node := c.NodeOf(t, lockKey(key))
		perNode[node]++
		// The hash and its fence counter are on the master of the slot.
		n, err := c.Node(node).Client(t).Exists(ctx, lockKey(key), lockKey(key)+":fence").Result()
		if err != nil || n != 2 {
			t.Errorf("EXISTS lock and fence of %q on node %d = %d, %v; want 2", key, node, n, err)
		}
	}
	for i, n := range perNode {
		if n == 0 {
			t.Errorf("no lock on node %d of %d (per node: %v)", i, c.Len(), perNode)
		}
	}
}

func TestClusterListenerReportsReleasesOnEveryNode(t *testing.T) {
	b, c := setupCluster(t)
	other := redislock.New(c.Client(t))
	l, n := listen(t, b)
	keys := keysPerNode(t, c, 2)
	for _, k := range slices.Concat(keys...) {
		subscribe(t, l, k)
		// No polling: once Subscribe returned, the master has it.
		if got := shardNumSub(t, c, k); got != 1 {
			t.Errorf("PUBSUB SHARDNUMSUB of %q = %d, want 1", k, got)
		}
	}
	for _, k := range slices.Concat(keys...) {
		lockAndRelease(t, other, k)
		n.expect(t, k)
	}
	lockAndRelease(t, other, "unsubscribed")
	n.expectNone(t, "unsubscribed")

	// A force release is announced too.
	k := keys[1][0]
	mustAcquire(t, other, driver.AcquireRequest{Key: k, Token: newToken(t), Owner: "o", TTL: time.Minute})
	if _, ok, err := other.ForceRelease(t.Context(), k); err != nil || !ok {
		t.Fatalf("ForceRelease(%q): ok=%v err=%v", k, ok, err)
	}
	n.expect(t, k)
}

func TestClusterListenerCountsSubscriptions(t *testing.T) {
	b, c := setupCluster(t)
	l, n := listen(t, b)
	ctx := t.Context()
	keys := keysPerNode(t, c, 1)
	k, same := keys[0][0], keysPerNode(t, c, 2)[0][1] // two keys on node 0

	subscribe(t, l, k)
	subscribe(t, l, k)
	subscribe(t, l, same)
	if err := l.Unsubscribe(ctx, k); err != nil {
		t.Fatal(err)
	}
	lockAndRelease(t, b, k)
	n.expect(t, k) // one subscription left

	if err := l.Unsubscribe(ctx, k); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the last Unsubscribe reaches the master", func() bool { return shardNumSub(t, c, k) == 0 })
	lockAndRelease(t, b, k)
	n.expectNone(t, k)
	// The node's connection still carries the other key.
	lockAndRelease(t, b, same)
	n.expect(t, same)

	if err := l.Unsubscribe(ctx, k); err == nil {
		t.Error("Unsubscribe without a Subscribe returned nil")
	}
	subscribe(t, l, k)
	lockAndRelease(t, b, k)
	n.expect(t, k)
}

func TestClusterSubscribeWaitsForConfirmation(t *testing.T) {
	b, c := setupCluster(t)
	l, n := listen(t, b)
	keys := keysPerNode(t, c, 3)
	subscribe(t, l, keys[0][0]) // node 0's connection is up
	node := c.Node(0).Client(t)
	ctx := t.Context()

	// While the master is paused it reads the SSUBSCRIBE but does not run
	// it, so no confirmation can come back.
	const pause = 500 * time.Millisecond
	start := time.Now()
	if err := node.ClientPause(ctx, pause).Err(); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	gaveUp, k := keys[0][1], keys[0][2]
	if err := l.Subscribe(short, gaveUp); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Subscribe during a pause with a 100ms context: %v, want DeadlineExceeded", err)
	}
	subscribe(t, l, k)
	if waited := time.Since(start); waited < pause-100*time.Millisecond {
		t.Errorf("Subscribe returned after %v, before the master could have confirmed (pause %v)", waited, pause)
	}
	if got := shardNumSub(t, c, k); got != 1 {
		t.Errorf("PUBSUB SHARDNUMSUB after Subscribe = %d, want 1", got)
	}
	lockAndRelease(t, redislock.New(c.Client(t)), k)
	n.expect(t, k)
	eventually(t, "the abandoned subscription is dropped", func() bool { return shardNumSub(t, c, gaveUp) == 0 })
}

func TestClusterListenerFollowsMovedSlot(t *testing.T) {
	b, c := setupCluster(t)
	other := redislock.New(c.Client(t))
	l, n := listen(t, b)
	keys := keysPerNode(t, c, 2)
	moving, staying := keys[0][0], keys[0][1]
	subscribe(t, l, moving)
	subscribe(t, l, staying)

	// Redis tells the subscriber that the slot went away; the listener
	// subscribes on the new master and then reports the key, for a release
	// may have come in between.
	c.MoveSlot(t, c.Slot(t, lockKey(moving)), 1)
	n.expect(t, moving)
	if got := shardNumSub(t, c, moving); got != 1 {
		t.Errorf("PUBSUB SHARDNUMSUB on the new master = %d, want 1", got)
	}
	lockAndRelease(t, other, moving)
	n.expect(t, moving)
	lockAndRelease(t, other, staying)
	n.expect(t, staying)
}

func TestClusterSubscribeAfterSlotMovedBehindTheClient(t *testing.T) {
	b, c := setupCluster(t)
	l, n := listen(t, b)
	keys := keysPerNode(t, c, 2)
	// "K}x" hashes like K: the lock key "dlock:{K}x}" has the hash tag K.
	warm, moved := keys[0][0], keys[0][1]+"}x"
	subscribe(t, l, warm) // the listener's client has loaded the slot map

	// The slot moves while the listener's client is not looking; its
	// SSUBSCRIBE goes to the old master, which answers MOVED.
	c.MoveSlot(t, c.Slot(t, lockKey(moved)), 2)
	subscribe(t, l, moved)
	if got := shardNumSub(t, c, moved); got != 1 {
		t.Errorf("PUBSUB SHARDNUMSUB on the new master = %d, want 1", got)
	}
	other := redislock.New(c.Client(t))
	lockAndRelease(t, other, moved)
	n.expect(t, moved)
	lockAndRelease(t, other, warm)
	n.expect(t, warm)
}

// TestClusterSubscribesRaceAStaleSlot subscribes many keys of one slot at
// once after the slot moved behind the listener's client: the MOVED answer
// to the first SSUBSCRIBE fails the old master's connection while the
// others are queued on it, or being written. Each of those is the homing
// goroutine's to subscribe again; none may fail its Subscribe.
func TestClusterSubscribesRaceAStaleSlot(t *testing.T) {
	b, c := setupCluster(t)
	l, n := listen(t, b)
	keys := keysPerNode(t, c, 2)
	warm, tag := keys[0][0], keys[0][1]
	subscribe(t, l, warm)
	c.MoveSlot(t, c.Slot(t, lockKey(tag)), 2)

	const waiters = 32
	moved := make([]string, waiters)
	errs := make(chan error, waiters)
	for i := range moved {
		moved[i] = fmt.Sprintf("%s}x%d", tag, i) // the slot of tag
		go func() { errs <- l.Subscribe(t.Context(), moved[i]) }()
	}
	for range waiters {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	other := redislock.New(c.Client(t))
	for _, k := range moved {
		if got := shardNumSub(t, c, k); got != 1 {
			t.Errorf("PUBSUB SHARDNUMSUB of %q on the new master = %d, want 1", k, got)
		}
		lockAndRelease(t, other, k)
		n.expect(t, k)
	}
}

func TestClusterListenerSurvivesNodeRestart(t *testing.T) {
	b, c := setupCluster(t)
	l, n := listen(t, b)
	keys := keysPerNode(t, c, 1)
	for _, k := range keys {
		subscribe(t, l, k[0])
	}
	const victim = 2
	c.Node(victim).Kill(t)
	n.expect(t, "") // the connection failed: releases may be missed
	c.Node(victim).Start(t)
	c.WaitReady(t)
	n.expect(t, keys[victim][0]) // subscribed again

	other := redislock.New(c.Client(t))
	for _, k := range keys {
		lockAndRelease(t, other, k[0])
		n.expect(t, k[0])
	}
}

func TestClusterListenerClose(t *testing.T) {
	// Not in parallel: goleak would see the other tests' goroutines.
	c := testserver.StartCluster(t, clusterSize)
	b := redislock.New(c.Client(t))
	pauser := c.Node(1).Client(t)
	keys := keysPerNode(t, c, 2)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	n := newNotifications(t)
	l, err := b.Listen(t.Context(), n.fn)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		subscribe(t, l, k[0])
	}
	// A Subscribe still waiting when Close is called returns.
	if err := pauser.ClientPause(t.Context(), 2*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	unconfirmed := keys[1][1]
	blocked := make(chan error, 1)
	go func() { blocked <- l.Subscribe(context.Background(), unconfirmed) }()

	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	n.closed.Store(true)
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := <-blocked; !errors.Is(err, redis.ErrClosed) {
		t.Errorf("Subscribe interrupted by Close: %v, want redis.ErrClosed", err)
	}
	lockAndRelease(t, b, keys[0][0])
	n.expectNone(t, keys[0][0])
	if err := l.Subscribe(t.Context(), keys[0][0]); !errors.Is(err, redis.ErrClosed) {
		t.Errorf("Subscribe after Close: %v, want redis.ErrClosed", err)
	}
	if err := l.Unsubscribe(t.Context(), keys[0][0]); err != nil {
		t.Errorf("Unsubscribe after Close: %v, want nil", err)
	}
}

// TestClusterWaiterWokenOnEveryNode checks through the dlock API that a
// waiter whose retry timer would not fire for an hour is woken by the
// release of a lock on each master.
func TestClusterWaiterWokenOnEveryNode(t *testing.T) {
	_, c := setupCluster(t)
	holder := dlock.New(redislock.New(c.Client(t)))
	waiter := dlock.New(redislock.New(c.Client(t)))
	t.Cleanup(func() {
		_ = waiter.Close()
		_ = holder.Close()
	})
	ctx := t.Context()
	for node, k := range keysPerNode(t, c, 1) {
		key := k[0]
		held, err := holder.Mutex(key, dlock.WithTTL(time.Minute)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var (
			wg     sync.WaitGroup
			got    *dlock.Lease
			gotErr error
		)
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := waiter.Mutex(key, dlock.WithRetry(dlock.ExponentialBackoff(time.Hour, time.Hour)), dlock.WithWait(time.Minute))
			got, gotErr = m.Lock(ctx)
		}()
		eventually(t, "the waiter subscribes", func() bool { return shardNumSub(t, c, key) == 1 })
		if err := held.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("waiter for %q on node %d not woken 10s after the release", key, node)
		}
		if gotErr != nil {
			t.Fatalf("waiter on node %d: %v", node, gotErr)
		}
		if err := got.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func TestClusterInspectListForceRelease(t *testing.T) {
	b, c := setupCluster(t)
	ctx := t.Context()
	keys := slices.Concat(keysPerNode(t, c, 2)...)
	slices.Sort(keys)
	fences := make(map[string]uint64)
	for _, k := range keys {
		res := mustAcquire(t, b, driver.AcquireRequest{Key: k, Token: newToken(t), Owner: "owner of " + k, TTL: time.Minute})
		fences[k] = res.Fence
	}
	for _, k := range keys {
		info, ok, err := b.Inspect(ctx, k)
		if err != nil || !ok || info.Owner != "owner of "+k || info.Fence != fences[k] {
			t.Errorf("Inspect(%q) = %+v, %v, %v", k, info, ok, err)
		}
	}
	infos, err := b.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, info := range infos {
		listed = append(listed, info.Key)
	}
	if !slices.Equal(listed, keys) {
		t.Errorf("List = %v, want the locks of every node %v", listed, keys)
	}
	for _, k := range keys {
		info, ok, err := b.ForceRelease(ctx, k)
		if err != nil || !ok || info.Owner != "owner of "+k {
			t.Errorf("ForceRelease(%q) = %+v, %v, %v", k, info, ok, err)
		}
		if _, ok, err := b.Inspect(ctx, k); err != nil || ok {
			t.Errorf("Inspect(%q) after ForceRelease: ok=%v err=%v, want not held", k, ok, err)
		}
	}
	if infos, err := b.List(ctx, ""); err != nil || len(infos) != 0 {
		t.Errorf("List after ForceRelease = %v, %v; want none", infos, err)
	}
}

// TestClusterHungMasterDoesNotStallOtherShards stops one master (SIGSTOP)
// while the listener dials it for a Subscribe: its TCP handshake completes
// in the kernel and the dial then hangs in HELLO. Only that master's
// channels may wait; a release on another master still wakes its
// subscriber, and Subscribe and Unsubscribe on the others go through.
func TestClusterHungMasterDoesNotStallOtherShards(t *testing.T) {
	t.Parallel()
	// A node timeout far above the test's length, so that the others do
	// not declare the stopped master failed and the cluster down.
	c := testserver.StartCluster(t, clusterSize, "--cluster-node-timeout", "60000")
	keys := keysPerNode(t, c, 2)
	stopped := c.Node(0)
	var (
		armed  atomic.Bool
		dialed = make(chan struct{}, 1)
	)
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: c.Addrs(),
		// The dial to the stopped master hangs until it is resumed, far
		// longer than the test waits for anything else.
		ReadTimeout: time.Minute,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err == nil && addr == stopped.Addr() && armed.Load() {
				select {
				case dialed <- struct{}{}:
				default:
				}
			}
			return conn, err
		},
	})
	t.Cleanup(func() { _ = cc.Close() })
	l, n := listen(t, redislock.New(cc))
	other := redislock.New(c.Client(t))
	subscribe(t, l, keys[1][0]) // node 1's connection is up

	info, err := stopped.Client(t).Info(t.Context(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			pid, _ = strconv.Atoi(v)
		}
	}
	if pid <= 0 {
		t.Fatalf("no process_id in INFO server of %s", stopped.Addr())
	}
	armed.Store(true)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(resume)

	hung := make(chan error, 1)
	go func() { hung <- l.Subscribe(context.Background(), keys[0][0]) }()
	select {
	case <-dialed:
	case <-time.After(10 * time.Second):
		t.Fatal("the listener did not dial the stopped master within 10s")
	}

	lockAndRelease(t, other, keys[1][0])
	n.expect(t, keys[1][0])
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := l.Subscribe(ctx, keys[2][0]); err != nil { // a dial of its own
		t.Fatalf("Subscribe on node 2 while node 0 hangs: %v", err)
	}
	if err := l.Subscribe(ctx, keys[1][1]); err != nil {
		t.Fatalf("Subscribe on node 1 while node 0 hangs: %v", err)
	}
	if err := l.Unsubscribe(ctx, keys[1][1]); err != nil {
		t.Fatalf("Unsubscribe on node 1 while node 0 hangs: %v", err)
	}
	lockAndRelease(t, other, keys[2][0])
	n.expect(t, keys[2][0])
	select {
	case err := <-hung:
		t.Fatalf("Subscribe on the stopped master returned %v before it was resumed", err)
	default:
	}

	resume()
	select {
	case err := <-hung:
		if err != nil {
			t.Fatalf("Subscribe on the resumed master: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Subscribe on the resumed master did not return within 20s")
	}
	lockAndRelease(t, other, keys[0][0])
	n.expect(t, keys[0][0])
}

// TestClusterHalfOpenShardConnectionIsReplaced checks the health check of
// the Cluster listener: an SSUBSCRIBE connection that goes half-open while
// the command connections work is found by its PING and replaced, the
// waiters are told that releases may have been missed, and the key is
// heard again on a new connection.
func TestClusterHalfOpenShardConnectionIsReplaced(t *testing.T) {
	t.Parallel()
	c := testserver.StartCluster(t, clusterSize)
	h := &halfOpen{}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), Dialer: h.dial})
	t.Cleanup(func() { _ = rdb.Close() })
	l, n := listen(t, redislock.New(rdb))
	checkHalfOpenReplaced(t, l, n, h, redislock.New(c.Client(t)), "k")
}

// TestClusterMultiAtOnceNeedsOneHashTag checks that on a Cluster an
// all-at-once multi-lock over names of several hash slots is refused with
// ErrInvalid naming the fix, before anything is sent, and that names
// with one hash tag are taken together, on one node.
func TestClusterMultiAtOnceNeedsOneHashTag(t *testing.T) {
	b, c := setupCluster(t)
	cl := dlock.New(b)
	t.Cleanup(func() { _ = cl.Close() })
	// Spread over the nodes without a tag (TestClusterLocksSpreadOverNodes).
	var names []string
	for i := range 30 {
		names = append(names, fmt.Sprintf("orders:%d", i))
	}
	_, err := cl.MultiAtOnce(names).TryLock(t.Context())
	if !errors.Is(err, dlock.ErrInvalid) || !strings.Contains(err.Error(), "hash tag") {
		t.Fatalf("MultiAtOnce over several slots = %v, want ErrInvalid naming the hash-tag fix", err)
	}
	for i := range names {
		names[i] = "{order42}:" + names[i]
	}
	ml, err := cl.MultiAtOnce(names).TryLock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	node := c.NodeOf(t, lockKey(names[0]))
	for _, name := range names {
		if n := c.NodeOf(t, lockKey(name)); n != node {
			t.Errorf("%q on node %d, want %d with the others", name, n, node)
		}
	}
	if err := ml.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
}
