// Owner tokens and the owner strings stored with a lock
// ("host|pid N|proc:MACHINE:START|time|metadata").

package dlock

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/proclive"
)

// newToken returns a random 128-bit owner token as 32 hex characters.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:])
}

// clients numbers the Clients of this process.
var clients atomic.Int64

// clientIdentity returns the identity of the Client numbered n:
// driver.ProcessIdentity() for the first, and with " client n" after it for
// the others ("host|pid 4242 client 2"). Contenders are told apart by their
// owner strings (redlock tells a real holder from nodes split between
// contenders that way), so two Clients of one process must not share one.
func clientIdentity(n int64) string {
	if n <= 1 {
		return driver.ProcessIdentity()
	}
	return driver.ProcessIdentity() + " client " + strconv.FormatInt(n, 10)
}

// ownerString describes an owner for other waiters and for dlock ls:
// "host|pid 4242|proc:3fa2c1d0:8812345|2026-11-21T10:00:03Z", then
// "|metadata" when there is some; identity is the Client's (see
// clientIdentity). The process tag (internal/proclive), where the system
// gives one, lets a process of the same host tell whether the owner's
// process has ended; it is left out elsewhere.
func ownerString(identity string, at time.Time, metadata string) string {
	var buf [128]byte
	b := append(buf[:0], identity...)
	b = append(b, '|')
	if tag := proclive.Tag(); tag != "" {
		b = append(b, tag...)
		b = append(b, '|')
	}
	b = at.UTC().AppendFormat(b, time.RFC3339)
	if metadata != "" {
		b = append(b, '|')
		b = append(b, metadata...)
	}
	return string(b)
}

// ownerCache keeps the last owner string a Client made. The string names
// the acquire's second only, so every acquire of one second with the same
// metadata can share it: no allocation per Lock, and one string for the
// many leases taken in that second.
type ownerCache struct {
	identity string // the Client's, set by New
	last     atomic.Pointer[ownerStamp]
}

type ownerStamp struct {
	sec      int64 // at.Unix(): ownerString depends on nothing finer
	metadata string
	s        string
}

// get returns ownerString(at, metadata), from the cache when it was made
// for the same second and metadata.
func (oc *ownerCache) get(at time.Time, metadata string) string {
	sec := at.Unix()
	if p := oc.last.Load(); p != nil && p.sec == sec && p.metadata == metadata {
		return p.s
	}
	s := ownerString(oc.identity, at, metadata)
	oc.last.Store(&ownerStamp{sec: sec, metadata: metadata, s: s})
	return s
}
