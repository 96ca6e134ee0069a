package redlock_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redlock"
)

// recorder counts the keys a listener reports, and keeps the waiter each
// report named.
type recorder struct {
	mu    sync.Mutex
	seen  map[string]int
	nexts map[string][]string
}

func (r *recorder) fn(key, next string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen[key]++
	r.nexts[key] = append(r.nexts[key], next)
}

// named returns the waiters that the reports of key named, in order.
func (r *recorder) named(key string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.nexts[key])
}

func (r *recorder) count(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[key]
}

func listen(t *testing.T, b *redlock.Backend) (driver.Listener, *recorder) {
	t.Helper()
	r := &recorder{seen: make(map[string]int), nexts: make(map[string][]string)}
	l, err := b.Listen(t.Context(), r.fn)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l, r
}

// subscribers returns the number of subscribers of key's release channel on
// each node.
func subscribers(t *testing.T, nodes []*redis.Client, key string) []int64 {
	t.Helper()
	out := make([]int64, len(nodes))
	for i, n := range nodes {
		m, err := n.PubSubNumSub(t.Context(), lockKey(key)+":rel").Result()
		if err == nil {
			out[i] = m[lockKey(key)+":rel"]
		}
	}
	return out
}

func TestReleaseOnAnyNodeWakes(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	b := newBackend(t, servers)
	l, r := listen(t, b)
	if err := l.Subscribe(t.Context(), "k"); err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	// Subscribe returns once a quorum of the nodes confirmed: node 1 may
	// confirm later.
	eventually(t, "node 1 confirms the subscription", func() bool { return redlock.Confirmed(l, "k")[1] })
	// A release announced on one node only.
	if err := nodes[1].Publish(t.Context(), lockKey("k")+":rel", lockKey("k")).Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the release on node 1 is reported", func() bool { return r.count("k") == 1 })

	// A real release, announced by every node.
	req := request(t, "k", time.Minute)
	mustAcquire(t, b, req)
	mustRelease(t, b, "k", req.Token)
	eventually(t, "the release is reported", func() bool { return r.count("k") >= 2 })

	if err := l.Unsubscribe(t.Context(), "k"); err != nil {
		t.Fatalf("Unsubscribe: %v", err)
	}
	eventually(t, "every node has dropped the subscription", func() bool {
		s := subscribers(t, nodes, "k")
		return s[0]+s[1]+s[2] == 0
	})
	if err := l.Unsubscribe(t.Context(), "k"); err == nil {
		t.Error("a second Unsubscribe succeeded")
	}
}

// The copies of one release that the nodes announce are reported once.
func TestOneReleaseIsReportedOnce(t *testing.T) {
	servers := startNodes(t, 3)
	// A long node timeout makes the coalescing window (a tenth of it) wide
	// enough for a slow machine.
	b := newBackend(t, servers, redlock.WithNodeTimeout(3*time.Second))
	l, r := listen(t, b)
	if err := l.Subscribe(t.Context(), "k"); err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	req := request(t, "k", time.Minute)
	mustAcquire(t, b, req)
	redlock.WaitIdle(b)
	mustRelease(t, b, "k", req.Token)
	eventually(t, "the release is reported", func() bool { return r.count("k") > 0 })
	if err := l.Close(); err != nil { // waits for anything still pending
		t.Fatal(err)
	}
	if n := r.count("k"); n != 1 {
		t.Errorf("one release on three nodes reported %d times, want once", n)
	}
}

func TestSubscribeWithANodeDown(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	servers[2].Kill(t)
	b := newBackend(t, servers)
	l, r := listen(t, b)
	if err := l.Subscribe(t.Context(), "k"); err != nil {
		t.Fatalf("Subscribe with one node down: %v", err)
	}
	// The node comes back; the subscription is made there in the background.
	// Until the listener has it confirmed, the server's count can be 1 for
	// a subscription that is being undone (go-redis's resubscription, on
	// reconnecting, of a channel whose SUBSCRIBE failed while the node was
	// down), and a release published then is not reported: wait for the
	// listener's confirmation, with room for a loaded machine.
	servers[2].Start(t)
	eventuallyWithin(t, time.Minute, "the listener has the subscription on the restarted node", func() bool { return redlock.Confirmed(l, "k")[2] })
	eventually(t, "the restarted node has the subscription", func() bool { return subscribers(t, nodes, "k")[2] == 1 })
	if err := nodes[2].Publish(t.Context(), lockKey("k")+":rel", lockKey("k")).Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the release on the restarted node is reported", func() bool { return r.count("k") > 0 })
	if err := l.Unsubscribe(t.Context(), "k"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "every node has dropped the subscription", func() bool {
		s := subscribers(t, nodes, "k")
		return s[0]+s[1]+s[2] == 0
	})
}

// A node whose answers come later than the call limit (200ms at the
// default node timeout), as on a loaded machine or a long link, still gets
// the subscription in the background, and keeps it: the attempts after the
// first wait for the node's confirmation. When each attempt gave up at the
// call limit, the node's subscription, made meanwhile, was left without a
// holder during the backoff and undone when its confirmation came in, again
// and again, and a release published on that node went unreported.
func TestSubscribeKeepsALateNode(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	px := testserver.StartProxy(t, servers[2].Addr())
	late := redis.NewClient(&redis.Options{Addr: px.Addr()})
	t.Cleanup(func() { _ = late.Close() })
	b := backendOn(t, []redis.UniversalClient{servers[0].Client(t), servers[1].Client(t), late})
	l, r := listen(t, b)
	// Each round trip to node 2 takes 900ms: an attempt bounded by the call
	// limit, rejoining the subscription left by the one before after its
	// backoff, gave up before the confirmation came, at every backoff of
	// the sequence (25ms to 1s).
	px.RequestLatency(t, 900*time.Millisecond, 0)
	t.Cleanup(func() { px.RequestLatency(t, 0, 0) }) // before the listener closes
	if err := l.Subscribe(t.Context(), "k"); err != nil {
		t.Fatalf("Subscribe with one node late: %v", err)
	}
	// Connecting and subscribing take a few of its round trips.
	eventuallyWithin(t, time.Minute, "the late node has confirmed the subscription", func() bool { return redlock.Confirmed(l, "k")[2] })
	eventually(t, "the late node has the subscription", func() bool { return subscribers(t, nodes, "k")[2] == 1 })
	if err := nodes[2].Publish(t.Context(), lockKey("k")+":rel", lockKey("k")).Err(); err != nil {
		t.Fatal(err)
	}
	eventuallyWithin(t, time.Minute, "the release on the late node is reported", func() bool { return r.count("k") > 0 })
}

func TestSubscribeWithoutQuorumFails(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	servers[1].Kill(t)
	servers[2].Kill(t)
	b := newBackend(t, servers)
	l, _ := listen(t, b)
	err := l.Subscribe(t.Context(), "k")
	var qe *redlock.QuorumError
	if !errors.As(err, &qe) || qe.Op != "subscribe" || qe.OK > 1 {
		t.Fatalf("Subscribe with 2 of 3 nodes down = %v, want a *QuorumError", err)
	}
	eventually(t, "the live node's subscription is undone", func() bool { return subscribers(t, nodes[:1], "k")[0] == 0 })

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := l.Subscribe(ctx, "k"); !errors.Is(err, context.Canceled) {
		t.Errorf("Subscribe with a cancelled context = %v, want context.Canceled", err)
	}
}

func TestListenerClose(t *testing.T) {
	servers := startNodes(t, 3)
	b := newBackend(t, servers)
	l, r := listen(t, b)
	if err := l.Subscribe(t.Context(), "k"); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := l.Subscribe(t.Context(), "k"); !errors.Is(err, redis.ErrClosed) {
		t.Errorf("Subscribe after Close = %v, want redis.ErrClosed", err)
	}
	if err := l.Unsubscribe(t.Context(), "k"); err != nil {
		t.Errorf("Unsubscribe after Close = %v, want nil", err)
	}
	req := request(t, "k", time.Minute)
	mustAcquire(t, b, req)
	mustRelease(t, b, "k", req.Token)
	if n := r.count("k"); n != 0 {
		t.Errorf("fn called %d times after Close", n)
	}
	if _, err := b.Listen(t.Context(), nil); err == nil {
		t.Error("Listen with a nil callback succeeded")
	}
}

// Releases of shared holds and removed writer intents wake waiters (next
// ""); a waiter that the nodes' announcements name is passed on when they
// agree, and "" when they do not.
func TestListenSharedReleasesAndNext(t *testing.T) {
	servers := startNodes(t, 3)
	nodes := admins(t, servers)
	// A wide coalescing window (see TestOneReleaseIsReportedOnce).
	b := newBackend(t, servers, redlock.WithNodeTimeout(3*time.Second))
	l, rec := listen(t, b)
	for _, key := range []string{"rw", "fair", "mixed"} {
		if err := l.Subscribe(t.Context(), key); err != nil {
			t.Fatal(err)
		}
	}

	r := reader(t, "rw", "reader", time.Minute)
	mustAcquire(t, b, r)
	redlock.WaitIdle(b)
	w := writer(t, "rw", "writer", time.Minute)
	mustRefuse(t, b, w)
	mustRelease(t, b, "rw", w.Token) // the writer gives up: its intent goes
	eventually(t, "the intent's removal is reported", func() bool { return rec.count("rw") == 1 })
	mustRelease(t, b, "rw", r.Token)
	eventually(t, "the reader's release is reported", func() bool { return rec.count("rw") == 2 })
	if got := rec.named("rw"); !slices.Equal(got, []string{"", ""}) {
		t.Errorf("reports of rw named %q, want anyone", got)
	}

	// Fair queues are made on the nodes directly: Redlock keeps none, but
	// a node's announcement that names a waiter is passed on.
	for key, heads := range map[string][]string{"fair": {"head", "head", "head"}, "mixed": {"head", "head", "other"}} {
		for i, n := range nodeBackends(nodes) {
			holder := driver.AcquireRequest{Key: key, Token: "holder", Owner: "holder", TTL: time.Minute}
			if res, err := n.Acquire(t.Context(), holder); err != nil || !res.Acquired {
				t.Fatalf("node %d: acquire = %+v, %v", i, res, err)
			}
			waiter := driver.AcquireRequest{Key: key, Token: heads[i], Owner: heads[i], TTL: time.Minute, Fair: true, Wait: true, QueueTTL: time.Minute}
			if res, err := n.Acquire(t.Context(), waiter); err != nil || res.Acquired || !res.Queued {
				t.Fatalf("node %d: fair acquire = %+v, %v; want queued", i, res, err)
			}
		}
		mustRelease(t, b, key, "holder")
		eventually(t, "the release of "+key+" is reported", func() bool { return rec.count(key) == 1 })
		want := "head"
		if key == "mixed" {
			want = ""
		}
		if got := rec.named(key); len(got) != 1 || got[0] != want {
			t.Errorf("the release of %s named %q, want %q", key, got, want)
		}
		for _, head := range heads {
			mustRelease(t, b, key, head)
		}
		checkClean(t, b, nodes, key)
	}
	checkClean(t, b, nodes, "rw")
}
