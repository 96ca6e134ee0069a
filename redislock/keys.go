package redislock

import "strings"

// The key layout, in one place. For a lock key K and namespace NS:
//
//	NS:{K}        hash: token → hold count, "owner", "fence", "at"
//	              (acquired, ms, by the server's clock), and with a
//	              lock-delay "exp" (lease expiry, ms) and "delay" (ms);
//	              carries the TTL (plus the delay)
//	NS:{K}:fence  the fence counter; never expires, survives release
//	NS:{K}:rel    release channel (a channel name, not a key)
//
// The braces are a Cluster hash tag: all of one lock's keys hash to one slot,
// so a script may touch them together.

// lockKey returns the name of the lock hash for key.
func (b *Backend) lockKey(key string) string { return b.ns + ":{" + key + "}" }

// fenceKey returns the name of the fence counter for key.
func (b *Backend) fenceKey(key string) string { return b.lockKey(key) + ":fence" }

// channel returns the release channel for key.
func (b *Backend) channel(key string) string { return b.lockKey(key) + ":rel" }

// keyOfLock returns K for a lock hash name NS:{K}, and false for any other
// name in the namespace (fence counters and future per-lock keys end in
// ":suffix", never in "}").
func (b *Backend) keyOfLock(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, b.ns+":{")
	if !ok || !strings.HasSuffix(rest, "}") {
		return "", false
	}
	return strings.TrimSuffix(rest, "}"), true
}

// globEscape quotes the characters that are special in a Redis MATCH pattern.
func globEscape(s string) string {
	var b strings.Builder
	for i := range len(s) {
		switch s[i] {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
