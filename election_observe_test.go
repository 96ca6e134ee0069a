package dlock_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// recvUntil receives from seen until want accepts a LeaderInfo, and fails
// t when none does within limit. It returns the accepted one.
func recvUntil(t *testing.T, seen <-chan dlock.LeaderInfo, limit time.Duration, what string, want func(dlock.LeaderInfo) bool) dlock.LeaderInfo {
	t.Helper()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		select {
		case got, ok := <-seen:
			if !ok {
				t.Fatalf("Observe's channel closed while waiting for %s", what)
			}
			if want(got) {
				return got
			}
		case <-timer.C:
			t.Fatalf("Observe gave no %s within %s", what, limit)
			return dlock.LeaderInfo{}
		}
	}
}

// A leader whose store lost its fence counter (an eviction, a failover
// that lost writes) may come back with the fence of the one before: a new
// Owner is a new leader all the same, and Observe sends it.
func TestElectionObserveNewOwnerWithRepeatedFence(t *testing.T) {
	srv := testserver.StartRedis(t)
	rdb := srv.Client(t)
	watcher := dlock.New(redislock.New(rdb))
	defer watcher.Close()
	a := dlock.New(redislock.New(rdb), dlock.WithTTL(10*time.Second))
	defer a.Close()
	b := dlock.New(redislock.New(rdb), dlock.WithTTL(10*time.Second))
	defer b.Close()

	ldA, err := a.Election("e").Campaign(t.Context(), "a")
	if err != nil {
		t.Fatal(err)
	}
	seen, err := watcher.Election("e").Observe(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	recvUntil(t, seen, 5*time.Second, "leader a", func(i dlock.LeaderInfo) bool { return i.Value == "a" })

	if err := rdb.FlushAll(t.Context()).Err(); err != nil { // the store forgets a and its fence
		t.Fatal(err)
	}
	ldB, err := b.Election("e").Campaign(t.Context(), "b")
	if err != nil {
		t.Fatal(err)
	}
	if ldB.Fence() != ldA.Fence() {
		t.Fatalf("fences %d and %d; the test needs a repeated fence", ldA.Fence(), ldB.Fence())
	}
	// A "no leader" read between the two may come first; b must follow.
	recvUntil(t, seen, 10*time.Second, "leader b", func(i dlock.LeaderInfo) bool { return i.Value == "b" })
}

// An observer cut off from the store says that its view may be stale (a
// LeaderInfo with Err), rather than keep the old leader in silence while
// the leadership changes; once it reads again it sends the new leader.
func TestElectionObserveSignalsStaleView(t *testing.T) {
	srv := testserver.StartRedis(t)
	proxy := testserver.StartProxy(t, srv.Addr())
	cut := redis.NewClient(&redis.Options{Addr: proxy.Addr(), ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond, MaxRetries: -1})
	defer cut.Close()
	watcher := dlock.New(redislock.New(cut))
	defer watcher.Close()
	rdb := srv.Client(t)
	a := dlock.New(redislock.New(rdb), dlock.WithTTL(10*time.Second))
	defer a.Close()

	ld, err := a.Election("e").Campaign(t.Context(), "a")
	if err != nil {
		t.Fatal(err)
	}
	seen, err := watcher.Election("e").Observe(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	recvUntil(t, seen, 5*time.Second, "leader a", func(i dlock.LeaderInfo) bool { return i.Value == "a" })

	proxy.Partition(t)
	if err := ld.Resign(t.Context()); err != nil {
		t.Fatal(err)
	}
	ldB, err := a.Election("e").Campaign(t.Context(), "b")
	if err != nil {
		t.Fatal(err)
	}
	stale := recvUntil(t, seen, 15*time.Second, "stale view", func(i dlock.LeaderInfo) bool { return true })
	if stale.Err == nil || stale.Fence != 0 || stale.Value != "" {
		t.Fatalf("while cut off Observe sent %+v; want a LeaderInfo with Err and no leader", stale)
	}
	proxy.Heal(t)
	got := recvUntil(t, seen, 15*time.Second, "leader b", func(i dlock.LeaderInfo) bool { return i.Err == nil })
	if got.Value != "b" || got.Fence != ldB.Fence() {
		t.Fatalf("after the heal Observe sent %+v; want leader b, fence %d", got, ldB.Fence())
	}
}
