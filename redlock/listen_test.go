package redlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/redlock"
)

// recorder counts the keys a listener reports.
type recorder struct {
	mu   sync.Mutex
	seen map[string]int
}

func (r *recorder) fn(key, _ string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen[key]++
}

func (r *recorder) count(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[key]
}

func listen(t *testing.T, b *redlock.Backend) (driver.Listener, *recorder) {
	t.Helper()
	r := &recorder{seen: make(map[string]int)}
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
	servers[2].Start(t)
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
