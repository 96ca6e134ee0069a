package dlock

import (
	"log/slog"
	"testing"
	"time"

	"github.com/dlock-go/dlock/memlock"
)

// An uncontended Lock+Unlock must not wake the renew loop each time. After
// an idle turn (the loop's timer fired with nothing held and went an hour
// away), the first lease wakes the loop; a second lease, taken after the
// first was released and before the loop ran (an uncontended cycle is that
// quick), falls due later than the timer that wake-up set, and must not wake
// it again. Before, wakeAt stayed an hour away until the loop happened to
// run while a lease was held, so every lock woke it.
func TestRenewerWakesOnceAfterAnIdleTurn(t *testing.T) {
	r := newRenewer(memlock.New(), slog.New(slog.DiscardHandler), nil)
	defer r.cancel()
	r.once.Do(func() {}) // no loop: the test looks at what push asks of it
	now := time.Now()
	r.wakeAt = now.Add(time.Hour)
	lease := func(at time.Time) *grant {
		return &grant{index: -1, ttl: 30 * time.Second, deadline: at.Add(30 * time.Second), renewAt: at.Add(10 * time.Second), autoRenew: true}
	}

	first := lease(now)
	if !r.push(first) {
		t.Fatal("the first lease after an idle turn did not wake the loop")
	}
	r.remove(first) // released before the loop ran
	second := lease(now.Add(time.Millisecond))
	if r.push(second) {
		t.Errorf("a lease that falls due after the first woke the loop again")
	}
	if !r.wakeAt.Equal(first.at) {
		t.Errorf("wakeAt = %v, want the first lease's time %v", r.wakeAt, first.at)
	}
	// A lease that falls due sooner still wakes it.
	if !r.push(lease(now.Add(-time.Second))) {
		t.Errorf("a lease that falls due before the timer did not wake the loop")
	}
}
