package redlock

import "github.com/dlock-go/dlock/driver"

// WaitIdle waits until none of b's background goroutines (late answers,
// clean-ups, fence raises) is running.
func WaitIdle(b *Backend) { b.waitIdle() }

// Confirmed reports, for each node, whether the listener l (from
// Backend.Listen) holds a confirmed subscription to key there: the node's
// own listener has confirmed the Subscribe that l's background attempts
// made, so that a release published on that node is reported.
func Confirmed(l driver.Listener, key string) []bool {
	ll := l.(*listener)
	ll.mu.Lock()
	list := ll.subs[key]
	ll.mu.Unlock()
	out := make([]bool, len(ll.nodes))
	for _, s := range list {
		s.mu.Lock()
		for i, ok := range s.confirmed {
			out[i] = out[i] || ok
		}
		s.mu.Unlock()
	}
	return out
}
