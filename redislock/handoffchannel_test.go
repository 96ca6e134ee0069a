package redislock_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/redislock"
)

// heard collects what a Listener of a Backend hears.
type heard struct {
	mu   sync.Mutex
	msgs []string
}

func (h *heard) fn(key, next string) {
	h.mu.Lock()
	h.msgs = append(h.msgs, key+" "+next)
	h.mu.Unlock()
}

func (h *heard) all() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.msgs...)
}

func listenTo(t *testing.T, b *redislock.Backend, key string) *heard {
	t.Helper()
	h := &heard{}
	l, err := b.Listen(t.Context(), h.fn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	if err := l.Subscribe(t.Context(), key); err != nil {
		t.Fatal(err)
	}
	return h
}

// A release that hands the lock to a queue's head announces it to the
// head's Backend alone (its handoff channel): the other waiting clients
// have nothing to do, as the lock is not free, and used to be woken by
// every handoff (seven of eight deliveries wasted on a hot key with eight
// clients). A release that leaves the lock free is still heard by all.
func TestHandoffAnnouncedToHeadsBackendAlone(t *testing.T) {
	holder, rdb, srv := setup(t)
	head := redislock.New(srv.Client(t))
	other := redislock.New(srv.Client(t))
	headHeard, otherHeard := listenTo(t, head, "k"), listenTo(t, other, "k")

	holderTok, headTok := newToken(t), newToken(t)
	mustAcquire(t, holder, driver.AcquireRequest{Key: "k", Token: holderTok, Owner: "holder", TTL: 10 * time.Second, Fair: true})
	res := acquire(t, head, driver.AcquireRequest{Key: "k", Token: headTok, Owner: "head", TTL: 10 * time.Second,
		Fair: true, Wait: true, QueueTTL: 5 * time.Second, Handoff: true})
	if res.Acquired || !res.Queued {
		t.Fatalf("the head's request: %+v; want queued", res)
	}
	if _, err := holder.Release(t.Context(), "k", holderTok); err != nil {
		t.Fatal(err)
	}
	if got, _ := rdb.HGet(t.Context(), "dlock:{k}", "owner").Result(); got != "head" {
		t.Fatalf("owner after the release: %q; want handed to the head", got)
	}
	waitHeard(t, headHeard, "k "+headTok+"\x00")
	time.Sleep(100 * time.Millisecond) // anything for other would have come by now
	if msgs := otherHeard.all(); len(msgs) != 0 {
		t.Errorf("another Backend heard %q of a handoff to the head", msgs)
	}

	// The head releases with nobody queued: everyone hears that.
	if _, err := head.Release(t.Context(), "k", headTok); err != nil {
		t.Fatal(err)
	}
	waitHeard(t, otherHeard, "k ")
}

// waitHeard waits up to 2s for h to hear a message that starts with
// prefix.
func waitHeard(t *testing.T, h *heard, prefix string) {
	t.Helper()
	if !h.within(2*time.Second, func(m string) bool { return strings.HasPrefix(m, prefix) }) {
		t.Fatalf("heard %q; want a message starting %q", h.all(), prefix)
	}
}

// within reports whether h hears a message that match accepts within d.
func (h *heard) within(d time.Duration, match func(string) bool) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if slices.ContainsFunc(h.all(), match) {
			return true
		}
	}
	return false
}

// A queue entry written by a client before the handoff channel (no id in
// its request) is handed the lock on the release channel, which that
// client listens to; the entry's owner is all the queue keeps for it.
func TestHandoffToEntryWithoutChannelOnReleaseChannel(t *testing.T) {
	holder, rdb, srv := setup(t)
	other := redislock.New(srv.Client(t))
	otherHeard := listenTo(t, other, "k")
	holderTok, headTok := newToken(t), newToken(t)
	mustAcquire(t, holder, driver.AcquireRequest{Key: "k", Token: holderTok, Owner: "holder", TTL: 10 * time.Second, Fair: true})
	// The acquire script as an earlier client calls it: twelve arguments.
	if err := redislock.AcquireWithoutHandoffID(t.Context(), rdb, "k", headTok, "old head", 10*time.Second, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if n, _ := rdb.HLen(t.Context(), "dlock:{k}:qo").Result(); n != 1 {
		t.Fatalf("the old client's entry keeps %d fields in :qo; want its owner alone", n)
	}
	if _, err := holder.Release(t.Context(), "k", holderTok); err != nil {
		t.Fatal(err)
	}
	waitHeard(t, otherHeard, "k "+headTok+"\x00")
}

// A waiting plain request refused while the lock has a live fair queue is
// told so (QueueLive), as a plain waiter no longer hears the handoffs that
// used to tell it; a fair one, or one with no queue, is not.
func TestRefusalReportsLiveQueue(t *testing.T) {
	b, _, _ := setup(t)
	holderTok := newToken(t)
	mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: holderTok, Owner: "holder", TTL: 10 * time.Second})
	plain := driver.AcquireRequest{Key: "k", Token: newToken(t), Owner: "plain", TTL: 10 * time.Second, Wait: true, QueueTTL: 3 * time.Second}
	if res := acquire(t, b, plain); res.Acquired || res.QueueLive {
		t.Fatalf("plain waiter, no queue: %+v; want refused, QueueLive false", res)
	}
	fair := driver.AcquireRequest{Key: "k", Token: newToken(t), Owner: "fair", TTL: 10 * time.Second,
		Fair: true, Wait: true, QueueTTL: 3 * time.Second, Handoff: true}
	if res := acquire(t, b, fair); res.Acquired || !res.Queued || res.QueueLive {
		t.Fatalf("fair waiter: %+v; want queued, QueueLive false", res)
	}
	if res := acquire(t, b, plain); res.Acquired || !res.QueueLive {
		t.Fatalf("plain waiter behind a queue: %+v; want refused with QueueLive", res)
	}
	plain.Wait = false
	if res := acquire(t, b, plain); res.Acquired || res.QueueLive {
		t.Fatalf("plain TryLock behind a queue: %+v; want refused, QueueLive false (only waiters queue)", res)
	}
}

// A plain Mutex of a Client that has heard nothing of a name joins its live
// queue at its first refusal (QueueLive): the handoffs between the other
// clients go to their own channels, so it would otherwise sleep its first
// retry delay (100 ms) while they take turns, then queue behind them. Two
// Clients take a Fair lock in turns; a third Client's plain Lock must be
// granted after a few of their grants, not after a hundred.
func TestPlainWaiterJoinsLiveQueueAtOnce(t *testing.T) {
	_, _, srv := setup(t)
	var grants atomic.Int64
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for range 2 {
		c := dlock.New(redislock.New(srv.Client(t)))
		defer c.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := c.Mutex("k", dlock.Fair())
			for ctx.Err() == nil {
				l, err := m.Lock(ctx)
				if err != nil {
					continue
				}
				grants.Add(1)
				time.Sleep(time.Millisecond)
				_ = l.Unlock(context.Background())
			}
		}()
	}
	defer func() { stop(); wg.Wait() }()
	for grants.Load() < 50 {
		time.Sleep(5 * time.Millisecond)
	}
	c := dlock.New(redislock.New(srv.Client(t)))
	defer c.Close()
	before := grants.Load()
	lctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	l, err := c.Mutex("k").Lock(lctx)
	if err != nil {
		t.Fatal(err)
	}
	others := grants.Load() - before
	_ = l.Unlock(context.Background())
	t.Logf("the plain Lock was granted after %d grants of the others", others)
	if others > 8 {
		t.Errorf("the plain Lock waited %d grants of the two fair clients; want a few (it joins the queue at its first refusal)", others)
	}
}
