package sqllock

import (
	"strconv"
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// TestPollersScanAtMostOncePerSweep checks that a Backend with more than
// pollersMax live fair waiters does not scan them all at every answer
// (measured on a loaded two-core machine: ~170 µs an answer, under the
// lock, at 5,000 waiters, against ~0.4 µs below pollersMax), and that
// waiters idle for pollersIdle are still forgotten, once per pollersSweep.
func TestPollersScanAtMostOncePerSweep(t *testing.T) {
	var p pollers
	queued := driver.AcquireResult{Queued: true, Position: 2}
	ask := func(key string) {
		p.answered(driver.AcquireRequest{Key: key, Token: "t"}, queued, nil)
	}
	for i := range pollersMax + 100 {
		ask("live" + strconv.Itoa(i))
	}
	// Waiters that vanished a while ago: the sweep after the first answer
	// past pollersMax is under pollersSweep old, so the next answers leave
	// them.
	stale := time.Now().Add(-2 * pollersIdle)
	for i := range 100 {
		p.m[pollerKey{"gone" + strconv.Itoa(i), "t"}] = stale
	}
	ask("live0")
	if !p.waiting("gone0", "t") {
		t.Fatal("an answer within pollersSweep of the last sweep scanned the waiters again")
	}
	p.swept = p.swept.Add(-pollersSweep)
	ask("live1")
	for i := range 100 {
		if p.waiting("gone"+strconv.Itoa(i), "t") {
			t.Fatalf("a waiter idle for %v is still remembered after a sweep", 2*pollersIdle)
		}
	}
	if !p.waiting("live2", "t") {
		t.Fatal("a live waiter was forgotten by the sweep")
	}
}
