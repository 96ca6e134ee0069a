package etcdlock

import (
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Every key of one lock lives under the lock's directory, namespace + name +
// NUL: names never hold a control character, so the directory of "a" never
// holds the keys of "a/b", and one prefix read or watch covers one lock.
//
//	<dir>e            the exclusive holder: token, hold count, owner
//	<dir>s\x00<token> a shared hold (reader, semaphore permit): limit, owner
//	<dir>w\x00<token> a writer intent: owner
//	<dir>q\x00<token> a fair waiter's queue entry: owner (its place is its create revision)
//	<dir>r\x00<token> a token released while it held nothing (expires by itself)
//	<dir>x\x00<token> a token that withdrew from the queue (expires by itself)
//
// There is no fence counter: a grant's fence is the create revision of the
// key that holds it, which etcd's Raft log makes strictly increasing across
// the whole cluster (see the package documentation).
const (
	sep            = "\x00"
	exclSuffix     = "e"
	sharedInfix    = "s" + sep
	intentInfix    = "w" + sep
	releasedInfix  = "r" + sep
	queueInfix     = "q" + sep
	withdrawnInfix = "x" + sep
)

func (b *Backend) dir(key string) string          { return b.ns + key + sep }
func (b *Backend) exclKey(key string) string      { return b.dir(key) + exclSuffix }
func (b *Backend) sharedPrefix(key string) string { return b.dir(key) + sharedInfix }
func (b *Backend) intentPrefix(key string) string { return b.dir(key) + intentInfix }
func (b *Backend) sharedKey(key, token string) string {
	return b.sharedPrefix(key) + token
}
func (b *Backend) queuePrefix(key string) string { return b.dir(key) + queueInfix }
func (b *Backend) queueKey(key, token string) string {
	return b.queuePrefix(key) + token
}
func (b *Backend) releasedKey(key, token string) string {
	return b.dir(key) + releasedInfix + token
}
func (b *Backend) withdrawnKey(key, token string) string {
	return b.dir(key) + withdrawnInfix + token
}
func (b *Backend) intentKey(key, token string) string {
	return b.intentPrefix(key) + token
}

// parseKey splits an etcd key of the namespace into the lock's key, the
// kind of entry ("e", "s" or "w") and the token of a shared hold or intent.
func (b *Backend) parseKey(k string) (key, kind, token string, ok bool) {
	rest, ok := strings.CutPrefix(k, b.ns)
	if !ok {
		return "", "", "", false
	}
	key, entry, ok := strings.Cut(rest, sep)
	if !ok || entry == "" {
		return "", "", "", false
	}
	kind, token, _ = strings.Cut(entry, sep)
	return key, kind, token, true
}

// exclusive is the value of an exclusive holder's key: token, hold count,
// the longest TTL its holders asked for (in ms), owner.
type exclusive struct {
	token string
	holds int
	ttl   time.Duration
	owner string
}

func (e exclusive) encode() string {
	return e.token + "\n" + strconv.Itoa(e.holds) + "\n" + strconv.FormatInt(e.ttl.Milliseconds(), 10) + "\n" + e.owner
}

func decodeExclusive(v []byte) exclusive {
	f := strings.SplitN(string(v), "\n", 4)
	for len(f) < 4 {
		f = append(f, "")
	}
	holds, err := strconv.Atoi(f[1])
	if err != nil || holds < 1 {
		holds = 1
	}
	ms, _ := strconv.ParseInt(f[2], 10, 64)
	return exclusive{token: f[0], holds: holds, ttl: time.Duration(ms) * time.Millisecond, owner: f[3]}
}

// sharedValue is the value of a shared hold's key: the request's limit,
// its TTL in ms and the owner.
func sharedValue(limit int, ttl time.Duration, owner string) string {
	return strconv.Itoa(limit) + "\n" + strconv.FormatInt(ttl.Milliseconds(), 10) + "\n" + owner
}

func decodeShared(v []byte) (limit int, ttl time.Duration, owner string) {
	f := strings.SplitN(string(v), "\n", 3)
	for len(f) < 3 {
		f = append(f, "")
	}
	limit, _ = strconv.Atoi(f[0])
	ms, _ := strconv.ParseInt(f[1], 10, 64)
	return limit, time.Duration(ms) * time.Millisecond, f[2]
}

// prefixEnd is the end of the range of keys that start with prefix.
func prefixEnd(prefix string) string { return clientv3.GetPrefixRangeEnd(prefix) }
