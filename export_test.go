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
