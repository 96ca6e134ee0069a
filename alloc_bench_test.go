package dlock_test

// Allocation and memory figures of the client itself, without the network:
//
//	go test -run XXX -bench 'Cycle|Held' -benchmem -count 6 .
//	go test -run 'HeldLease' -v -count=1 .
//
// BenchmarkCycleMemlock is one uncontended Lock+Unlock on memlock, so that
// the library's allocations are visible without a socket. The held-lease
// figures hold many auto-renewed leases on one Client and divide the heap
// growth (after runtime.GC) by their number: once on a stub backend that
// keeps nothing (the client's own cost per lease, the figure that matters
// when the store is another process) and once on memlock (client + store).

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memlock"
)

func BenchmarkCycleMemlock(b *testing.B) {
	c := dlock.New(memlock.New())
	defer c.Close()
	ctx := context.Background()
	m := c.Mutex("bench/cycle")
	b.ReportAllocs()
	for b.Loop() {
		l, err := m.Lock(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkTryCycleMemlock(b *testing.B) {
	c := dlock.New(memlock.New())
	defer c.Close()
	ctx := context.Background()
	m := c.Mutex("bench/trycycle")
	b.ReportAllocs()
	for b.Loop() {
		l, err := m.TryLock(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// nullStore grants every acquire, renews and releases everything, and keeps
// nothing, so that a heap measurement sees only the client.
type nullStore struct{ fence atomic.Uint64 }

func (s *nullStore) Acquire(context.Context, driver.AcquireRequest) (driver.AcquireResult, error) {
	return driver.AcquireResult{Acquired: true, Fence: s.fence.Add(1), Holds: 1}, nil
}

func (s *nullStore) Renew(context.Context, string, string, time.Duration) (bool, error) {
	return true, nil
}

func (s *nullStore) Release(context.Context, string, string) (driver.ReleaseResult, error) {
	return driver.ReleaseResult{Held: true}, nil
}

func (s *nullStore) RenewBatch(_ context.Context, reqs []driver.RenewRequest) []driver.RenewResult {
	res := make([]driver.RenewResult, len(reqs))
	for i := range res {
		res[i].Held = true
	}
	return res
}

// heldLeaseBytes holds n auto-renewed leases (TTL 30s, so no renewal falls
// in the measurement) on distinct names of one Client on backend and
// returns the heap growth per lease, measured after runtime.GC with the
// leases still referenced. The names are made before the first reading: they
// are the caller's, not the library's.
func heldLeaseBytes(tb testing.TB, backend driver.Backend, n int) float64 {
	tb.Helper()
	ctx := context.Background()
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("held/%06d", i)
	}
	leases := make([]*dlock.Lease, n)
	c := dlock.New(backend, dlock.WithTTL(30*time.Second))
	defer c.Close()
	// Warm up: start the renewer and grow nothing that depends on n.
	warm, err := c.Mutex("held/warm-up").TryLock(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i, name := range names {
		l, err := c.Mutex(name).TryLock(ctx)
		if err != nil {
			tb.Fatal(err)
		}
		leases[i] = l
	}
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
	for _, l := range leases {
		if err := l.Err(); err != nil {
			tb.Fatalf("lease lost: %v", err)
		}
	}
	runtime.KeepAlive(leases)
	runtime.KeepAlive(names)
	_ = warm.Unlock(ctx)
	return per
}

const heldLeases = 10_000

// TestHeldLeaseMemory checks that a held, auto-renewed lease costs the
// client well under 1 KiB (grant, Lease, heap entry, owner string, token).
func TestHeldLeaseMemory(t *testing.T) {
	client := heldLeaseBytes(t, &nullStore{}, heldLeases)
	total := heldLeaseBytes(t, memlock.New(), heldLeases)
	t.Logf("per held lease: client %.0f B; client + memlock store %.0f B", client, total)
	if client > 1024 {
		t.Errorf("a held lease costs the client %.0f bytes, want at most 1024", client)
	}
}

func BenchmarkHeldLeaseMemory(b *testing.B) {
	for b.Loop() {
		client := heldLeaseBytes(b, &nullStore{}, heldLeases)
		total := heldLeaseBytes(b, memlock.New(), heldLeases)
		b.ReportMetric(client, "client-B/lease")
		b.ReportMetric(total, "memlock-B/lease")
	}
}
