package redlock

// WaitIdle waits until none of b's background goroutines (late answers,
// clean-ups, fence raises) is running.
func WaitIdle(b *Backend) { b.waitIdle() }
