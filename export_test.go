package dlock

import "time"

// SetSubscriptionLinger sets how long a key's subscription outlives its
// last waiter, for tests, and returns the function that restores it. Set it
// before the Clients of the test are made and restore it after they closed.
func SetSubscriptionLinger(d time.Duration) (restore func()) {
	old := subscriptionLinger
	subscriptionLinger = d
	return func() { subscriptionLinger = old }
}

// SetSubscribeWait sets how long a waiter waits for its subscription to be
// confirmed, for tests, and returns the function that restores it.
func SetSubscribeWait(d time.Duration) (restore func()) {
	old := subscribeWait
	subscribeWait = d
	return func() { subscribeWait = old }
}

// PassSafeDeadline moves l's deadline into the past without telling the
// renewal goroutine, as when the process was paused past the deadline and
// has resumed before that goroutine runs again.
func PassSafeDeadline(l *Lease) {
	g := l.g
	g.mu.Lock()
	defer g.mu.Unlock()
	g.deadline = time.Now().Add(-time.Second)
}

// WaitersOn returns how many Locks of c wait on key (its waiter group's
// members), for tests.
func WaitersOn(c *Client, key string) int {
	c.hub.mu.Lock()
	defer c.hub.mu.Unlock()
	if g := c.hub.groups[key]; g != nil {
		return g.refs
	}
	return 0
}

// ParkedOn reports whether an attempt of c is parked on key for its
// release to carry (see rides), for tests.
func ParkedOn(c *Client, key string) bool {
	if c.rides == nil {
		return false
	}
	c.rides.mu.Lock()
	defer c.rides.mu.Unlock()
	return c.rides.parked[key] != nil
}
