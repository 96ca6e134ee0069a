package dlock

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// TestPollPaceFollowsAMovingQueue checks the pace of a polling waiter in a
// fair queue: every claimPoll while the holder or its place changes, slower
// as nothing changes, never slower than the retry schedule's first pace.
func TestPollPaceFollowsAMovingQueue(t *testing.T) {
	const first = 5 * time.Millisecond
	var w waiter
	t0 := time.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	held := driver.AcquireResult{Queued: true, Position: 1, Holder: "a"}
	for _, step := range []struct {
		what string
		at   time.Duration
		res  driver.AcquireResult
		want time.Duration
	}{
		{"first answer", 0, held, claimPoll},
		{"the same holder 4ms later", 4 * time.Millisecond, held, claimPoll},
		{"the same holder 24ms later", 24 * time.Millisecond, held, 3 * time.Millisecond},
		{"the same holder 1s later", time.Second, held, first},
		{"another holder", time.Second + time.Millisecond, driver.AcquireResult{Queued: true, Position: 1, Holder: "b"}, claimPoll},
		{"free, still behind the head", time.Second + 30*time.Millisecond, driver.AcquireResult{Queued: true, Position: 2}, claimPoll},
		{"moved up", time.Second + 60*time.Millisecond, driver.AcquireResult{Queued: true, Position: 1}, claimPoll},
		{"nothing changed for 16ms", time.Second + 76*time.Millisecond, driver.AcquireResult{Queued: true, Position: 1}, 2 * time.Millisecond},
	} {
		if got := w.pollPace(at(step.at), step.res, first); got != step.want {
			t.Errorf("%s: pace %v, want %v", step.what, got, step.want)
		}
	}
}
