package dlock

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// newToken returns a random 128-bit owner token as 32 hex characters.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:])
}

// ownerString describes an owner for other waiters and for dlock ls:
// "host|pid 4242|2026-11-21T10:00:03Z", then "|metadata" when there is some.
func ownerString(at time.Time, metadata string) string {
	var b strings.Builder
	b.Grow(len(driver.ProcessIdentity()) + 22 + len(metadata))
	b.WriteString(driver.ProcessIdentity())
	b.WriteByte('|')
	b.WriteString(at.UTC().Format(time.RFC3339))
	if metadata != "" {
		b.WriteByte('|')
		b.WriteString(metadata)
	}
	return b.String()
}
