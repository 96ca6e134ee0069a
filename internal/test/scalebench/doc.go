// Package scalebench measures what one dlock Client costs while it holds
// many auto-renewed leases at once, on a real redis-server through
// redislock. It has only tests:
//
//	go test -race -count=1 ./internal/test/scalebench/                      # N=5000, CI
//	go test -count=1 -run TestHeldLeases ./internal/test/scalebench/ -scale.leases 100000 -v
//	go test -run XXX -bench HeldLeases -benchtime 1x ./internal/test/scalebench/ -scale.leases 100000
//
// One Client (TTL 3s, auto-renew on, so a renewal every 1s) over one go-redis
// client takes N leases on distinct names with 64 goroutines and keeps every
// *Lease. A go-redis hook counts round trips (each ProcessHook and each
// ProcessPipelineHook call is one) and commands. Once all N are held, the
// window of three renewal intervals is watched; nothing but the renewer talks
// to Redis then, so everything counted in it is renewal traffic. Checked
// (counts, never speed):
//
//	round trips   renewal round trips in the window <= 3*ceil(N/100)
//	goroutines    runtime.NumGoroutine after acquiring <= before + a small
//	              constant: no goroutine per lease
//	heap          MemStats.HeapAlloc after runtime.GC, after minus before,
//	              <= 1024 bytes per lease (the smallest of several samples
//	              in the window, so that a renewal batch in flight is not
//	              counted as the cost of holding)
//	no loss       at the end of the window every lease's Done is open, Err
//	              is nil, and every lock key is in Redis with PTTL > 0
//	close         Client.Close leaves no lock key behind (the fence
//	              counters stay by design; see package redislock)
//
// TestWaiters (-scale.waiters, default 1000; 10000 for the figures in
// docs/PERFORMANCE.md) makes N goroutines of one Client wait on one lock
// held by another Client, plain and Fair, at TTL 10s and 1s, and checks that
// the waiting Client's round trips in 5s (<= 60), the lock's fair queue
// (<= 1 entry), its goroutines (N + 8) and heap (<= 4 KiB a waiter) do not
// grow with N:
//
//	go test -count=1 -run TestWaiters -v ./internal/test/scalebench/ -scale.waiters 10000
//
// BenchmarkHeldLeases reports the same figures with b.ReportMetric:
// rt-per-100-leases-per-interval, bytes-per-lease, goroutines,
// renewals/interval and lost.
package scalebench
