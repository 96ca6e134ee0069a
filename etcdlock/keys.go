package etcdlock

import (
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
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
//	<dir>r\x00<token> a token released while it held nothing, or whose clean-up
//	                  release dropped a grant handed to it (expires by itself)
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

// exclusive is the value of an exclusive holder's key: token, hold count
// (with '#' and the sequence number of the last proclaim applied to the
// grant, when there was one; see Proclaim), the longest TTL its holders
// asked for (in ms), with the grant's fence when it is not the key's
// create revision, owner.
//
// A grant made by a direct handoff overwrites the key that its releaser
// held (etcd refuses a transaction that deletes and puts one key), so the
// key's create revision is its releaser's fence: its own fence is the
// revision of the handoff's write, which the handoff cannot know when it
// sends the value. The value then says so (fence fencePending: the key's
// mod revision), and every later write of the key writes the fence itself
// (see fenceOf).
type exclusive struct {
	token string
	holds int
	ttl   time.Duration
	owner string
	// fence is 0 when the grant's fence is the key's create revision,
	// fencePending when it is the key's mod revision (a handoff's write
	// that nothing rewrote since), or the fence.
	fence int64
	seq   uint64 // the last proclaim applied to the grant, or 0
}

// fencePending marks a grant whose fence is its key's mod revision.
const fencePending = -1

func (e exclusive) encode() string {
	ttl := strconv.FormatInt(e.ttl.Milliseconds(), 10)
	switch {
	case e.fence == fencePending:
		ttl += "@h"
	case e.fence > 0:
		ttl += "@" + strconv.FormatInt(e.fence, 10)
	}
	holds := strconv.Itoa(e.holds)
	if e.seq > 0 {
		holds += "#" + strconv.FormatUint(e.seq, 10)
	}
	return e.token + "\n" + holds + "\n" + ttl + "\n" + e.owner
}

func decodeExclusive(v []byte) exclusive {
	f := strings.SplitN(string(v), "\n", 4)
	for len(f) < 4 {
		f = append(f, "")
	}
	hs, ss, _ := strings.Cut(f[1], "#")
	holds, err := strconv.Atoi(hs)
	if err != nil || holds < 1 {
		holds = 1
	}
	seq, _ := strconv.ParseUint(ss, 10, 64)
	msf, fs, _ := strings.Cut(f[2], "@")
	ms, _ := strconv.ParseInt(msf, 10, 64)
	var fence int64
	if fs == "h" {
		fence = fencePending
	} else if fs != "" {
		fence, _ = strconv.ParseInt(fs, 10, 64)
	}
	return exclusive{token: f[0], holds: holds, ttl: time.Duration(ms) * time.Millisecond, owner: f[3], fence: fence, seq: seq}
}

// fenceOf returns the fence of the exclusive grant kv (see exclusive).
func fenceOf(kv *mvccpb.KeyValue) int64 {
	switch f := decodeExclusive(kv.Value).fence; {
	case f == fencePending:
		return kv.ModRevision
	case f > 0:
		return f
	}
	return kv.CreateRevision
}

// rewritten returns e, read from kv, for a write of kv's key: a pending
// fence is written out, as the write changes the key's mod revision.
func (e exclusive) rewritten(kv *mvccpb.KeyValue) exclusive {
	if e.fence == fencePending {
		e.fence = kv.ModRevision
	}
	return e
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
