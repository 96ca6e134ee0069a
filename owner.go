package dlock

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"strconv"
	"strings"
	"time"
)

// newToken returns a random 128-bit owner token as 32 hex characters.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:])
}

// processIdentity is "host|pid N", computed once.
var processIdentity = func() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return host + "|pid " + strconv.Itoa(os.Getpid())
}()

// ownerString describes an owner for other waiters and for dlock ls:
// "host|pid 4242|2026-11-21T10:00:03Z", then "|metadata" when there is some.
func ownerString(at time.Time, metadata string) string {
	var b strings.Builder
	b.Grow(len(processIdentity) + 22 + len(metadata))
	b.WriteString(processIdentity)
	b.WriteByte('|')
	b.WriteString(at.UTC().Format(time.RFC3339))
	if metadata != "" {
		b.WriteByte('|')
		b.WriteString(metadata)
	}
	return b.String()
}
