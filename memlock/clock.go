package memlock

import (
	"sync"
	"time"
)

// ManualClock is a Clock that moves only when told to, so that tests of
// expiry need no sleeping. Advancing it wakes the waiters of every Backend
// that uses it, as the expiry of a lock on a real store would.
type ManualClock struct {
	mu       sync.Mutex
	now      time.Time
	backends []*Backend
}

// NewManualClock returns a clock that reads start.
func NewManualClock(start time.Time) *ManualClock { return &ManualClock{now: start} }

// Now returns the clock's time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock on by d and wakes waiters.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	bs := append([]*Backend(nil), c.backends...)
	c.mu.Unlock()
	for _, b := range bs {
		b.mu.Lock()
		fns := b.subscribers("")
		b.mu.Unlock()
		for _, fn := range fns {
			fn("", "")
		}
	}
}

func (c *ManualClock) onAdvance(b *Backend) {
	c.mu.Lock()
	c.backends = append(c.backends, b)
	c.mu.Unlock()
}
