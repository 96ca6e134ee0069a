package dlock

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memlock"
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

// TestPolledQueuePace checks how often the waiters of a fair queue poll
// where releases are not announced: the head and the waiter behind it at
// pollPace (the head's grant makes the second the head, and a short hold
// leaves it the lock soon after), the others at the retry schedule's first
// pace times their place.
func TestPolledQueuePace(t *testing.T) {
	b := memlock.New()
	c := New(polledBackend{b, b})
	defer c.Close()
	m := c.Mutex("pace", Fair())
	// defaultPolledRetry's first delay, jittered down to half of it.
	const firstAtLeast = 5 * time.Millisecond / 2
	held := driver.AcquireResult{Queued: true, Holder: "a", HolderTTL: time.Minute}
	for _, tc := range []struct {
		position    int
		least, most time.Duration
	}{
		{1, claimPoll, claimPoll},
		{2, claimPoll, claimPoll},
		{3, 3 * firstAtLeast, time.Second},
		{8, 8 * firstAtLeast, time.Second},
	} {
		w := &waiter{h: &m.h}
		res := held
		res.Position = tc.position
		// A waiter that has polled long enough for its retry schedule to
		// reach its longest delay.
		if got := w.queueDelay(30, res); got < tc.least || got > tc.most {
			t.Errorf("place %d: next poll in %v, want %v to %v", tc.position, got, tc.least, tc.most)
		}
	}
}

// polledBackend is a memlock whose client sees no driver.Notifier: its
// waiters poll.
type polledBackend struct {
	driver.Backend
	driver.Capabler
}
