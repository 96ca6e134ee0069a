package memlock

import "fmt"

// Leftovers describes what b still keeps for key besides its fence
// counter: live holds, queue entries and writer intents.
func Leftovers(b *Backend, key string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clock.Now()
	st := b.state(key, now)
	if st == nil {
		return nil
	}
	var left []string
	if st.excl != nil {
		left = append(left, fmt.Sprintf("exclusive hold of %q", st.excl.owner))
	}
	for token := range st.shared {
		left = append(left, "shared hold of token "+token)
	}
	for _, w := range st.queue {
		left = append(left, "queue entry of token "+w.token)
	}
	if st.intent != nil {
		left = append(left, "writer intent of token "+st.intent.token)
	}
	return left
}

// States returns how many keys have a state in memory, lapsed or not.
func States(b *Backend) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.locks)
}
