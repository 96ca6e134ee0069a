// The key layout of a lock (its hash, fence counter, shared holds, queue,
// writer intent, recent releases, release channel) and the key names' helpers.

package redislock

import (
	"strings"
	"time"
)

// The key layout, in one place. For a lock key K and namespace NS:
//
//	NS:{K}        hash: token → hold count, "owner", "fence", "at"
//	              (acquired, ms, by the server's clock), and with a
//	              lock-delay "delay" (ms); carries the TTL plus the delay,
//	              so the lease has expired once its PTTL is down to the
//	              delay. The exclusive holder.
//	NS:{K}:fence  the fence counter; never expires, survives release
//	NS:{K}:s      zset: shared token → expiry (ms, server clock); one
//	              member per live reader or semaphore permit
//	NS:{K}:si     hash: shared token → "fence limit owner" (the hold's
//	              fence, the Limit of its request, its owner description)
//	NS:{K}:w      hash: the writer intent, "t" → token, "o" → owner;
//	              carries the intent's TTL (QueueTTL)
//	NS:{K}:q      zset: fair queue, token → arrival number (1 + the
//	              largest in the queue, so no counter is kept)
//	NS:{K}:qe     zset: fair queue, token → entry expiry (ms, server clock)
//	NS:{K}:qo     hash: fair queue, token → owner, for the entries whose
//	              request accepts a direct handoff (driver.Handoff)
//	NS:{K}:r      string: the ids of the latest releases that deleted the
//	              hash or a shared hold, newest first, at least 448 bytes
//	              of them (16 ids); lives 15s after the last. A resent
//	              release finds its id and changes nothing.
//	NS:{K}:late   zset: the late-request record (see late.lua), member →
//	              until (ms, server clock): "r" + the id of an acquire
//	              request whose grant was released, "t" + a token that a
//	              clean-up released while it held nothing, "w" + a token
//	              withdrawn from the queue; at most 4096 live entries,
//	              lives lateTTL (5s) after its last write. A request that
//	              lands late finds itself there and is refused.
//	NS:{K}:rel    release channel (a channel name, not a key)
//
// :s and :si, and :q, :qe and :qo, are written together and carry the expiry of
// their latest entry (PEXPIREAT), so they vanish with it (:q, :qe and :qo
// up to a quarter of a QueueTTL later: a join does not move their expiry
// every time; see acquire.lua's stretchQueue); scripts prune
// expired entries by the server's clock and delete a structure that has
// become empty. After every holder and waiter has gone, only the fence
// counter is left, :r for 15s and :late for lateTTL.
//
// The braces are a Cluster hash tag: all of one lock's keys hash to one slot,
// so a script may touch them together.

// lockKey returns the name of the lock hash for key.
func (b *Backend) lockKey(key string) string { return b.ns + ":{" + key + "}" }

// fenceKey returns the name of the fence counter for key.
func (b *Backend) fenceKey(key string) string { return b.lockKey(key) + ":fence" }

// channel returns the release channel for key.
func (b *Backend) channel(key string) string { return b.lockKey(key) + ":rel" }

// handoffChannel is NS:{K}:ho:ID:rel, ID the Backend's handoff id: a
// release that hands the lock to a queue entry of this Backend announces
// it there (see acquire.lua's ARGV[13]), so that the other waiting clients
// are not woken for a lock that is not free. It has the key's hash tag, so
// on a Cluster it lives on the key's slot, and it ends in ":rel" like the
// release channel, so that an ACL channel rule written for release
// channels (&NS*:rel) covers it too.
func (b *Backend) handoffChannel(key string) string { return b.lockKey(key) + ":ho:" + b.hid + ":rel" }

// watchChannel is NS:{K}:ho:rel: a release that hands the lock to a queue
// entry on its handoff channel announces it here too, for the clients that
// observe the lock (driver.HandoffWatcher).
func (b *Backend) watchChannel(key string) string { return b.lockKey(key) + ":ho:rel" }

// sharedSuffix ends the name of a lock's set of shared holds.
const sharedSuffix = ":s"

// recentSuffix ends the name of the key that keeps the ids of a lock's
// recent releases for 15s, so that a release that was resent is answered
// as it was the first time (see release.lua).
const recentSuffix = ":r"

// lateSuffix ends the name of a lock's late-request record.
const lateSuffix = ":late"

// lateTTL is how long the late-request record refuses a request that lands
// late (late.lua's lateTTL): longer than a copy of a request can be on its
// way after its caller cleaned up or its grant was released, which takes
// go-redis's write and read timeouts and retries (3s + 3s, up to 3 retries,
// by default) to notice and give up on.
const lateTTL = 5 * time.Second

// The KEYS of the scripts, as suffixes of the lock hash's name.
var (
	// acquire.lua: the lock hash, the fence counter, the shared holds and
	// their details, the writer intent, the fair queue, its expiries and
	// its owners, the late-request record.
	acquireSuffixes = [...]string{"", ":fence", sharedSuffix, ":si", ":w", ":q", ":qe", ":qo", lateSuffix}
	// describe.lua: acquire's without the fence counter and the owners.
	stateSuffixes = []string{"", sharedSuffix, ":si", ":w", ":q", ":qe"}
	// release.lua and withdraw.lua: stateSuffixes, the recent releases,
	// the queue's owners, the fence counter (for a direct handoff), the
	// late-request record, then the release channel (an argument, not a
	// key), so that one string holds all the names of a release.
	releaseSuffixes = [...]string{"", sharedSuffix, ":si", ":w", ":q", ":qe", recentSuffix, ":qo", ":fence", lateSuffix, ":rel"}
	// renew.lua: the lock hash, the shared holds and their details.
	renewSuffixes = [...]string{"", sharedSuffix, ":si"}
	// raise_fence.lua: the lock hash, the fence counter, the shared holds
	// and their details.
	raiseSuffixes = []string{"", ":fence", sharedSuffix, ":si"}
)

// acquireKeys, stateKeys, renewKeys and raiseKeys return the KEYS of the
// scripts for key.
func (b *Backend) acquireKeys(key string) []string { return b.keysOf(key, acquireSuffixes[:]) }
func (b *Backend) stateKeys(key string) []string   { return b.keysOf(key, stateSuffixes) }
func (b *Backend) renewKeys(key string) []string   { return b.keysOf(key, renewSuffixes[:]) }
func (b *Backend) raiseKeys(key string) []string   { return b.keysOf(key, raiseSuffixes) }

// keysOf returns the lock hash's name of key followed by each suffix, cut
// from one string so that the hot path allocates twice, not once a key.
func (b *Backend) keysOf(key string, suffixes []string) []string {
	keys := make([]string, len(suffixes))
	b.keysInto(keys, key, suffixes)
	return keys
}

// keysInto sets dst[i] to the lock hash's name of key followed by
// suffixes[i], all cut from one string: one allocation.
func (b *Backend) keysInto(dst []string, key string, suffixes []string) {
	var sb strings.Builder
	sb.Grow(b.keysLen(key, suffixes))
	b.writeKeys(&sb, key, suffixes)
	b.cutKeys(dst, sb.String(), key, suffixes)
}

// keysLen is the length of what writeKeys writes.
func (b *Backend) keysLen(key string, suffixes []string) int {
	n := len(suffixes) * (len(b.ns) + len(":{}") + len(key))
	for _, s := range suffixes {
		n += len(s)
	}
	return n
}

// writeKeys writes the lock hash's name of key followed by each suffix, one
// after the other, without separators; cutKeys cuts them apart.
func (b *Backend) writeKeys(sb *strings.Builder, key string, suffixes []string) {
	for _, s := range suffixes {
		sb.WriteString(b.ns)
		sb.WriteString(":{")
		sb.WriteString(key)
		sb.WriteByte('}')
		sb.WriteString(s)
	}
}

// cutKeys sets dst[i] to the i-th name that writeKeys wrote for key and
// suffixes at the start of all, and returns the rest of all.
func (b *Backend) cutKeys(dst []string, all, key string, suffixes []string) string {
	l := len(b.ns) + len(":{}") + len(key)
	for i, s := range suffixes {
		end := l + len(s)
		dst[i], all = all[:end], all[end:]
	}
	return all
}

// keyOfLock returns K for the name of a lock hash NS:{K} or of a set of
// shared holds NS:{K}:s, and false for any other name in the namespace
// (fence counters and the other per-lock keys end in ":suffix", never in
// "}", and only shared sets end in "}:s").
func (b *Backend) keyOfLock(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, b.ns+":{")
	if !ok {
		return "", false
	}
	if k, ok := strings.CutSuffix(rest, "}"); ok {
		return k, true
	}
	if k, ok := strings.CutSuffix(rest, "}"+sharedSuffix); ok {
		return k, true
	}
	return "", false
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
