// Formatting durations, and working out how long a lock has been held.

package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/proclive"
)

// fmtDuration formats d for people: 850ms, 4.2s, 3m05s, 2h03m, 3d04h.
func fmtDuration(d time.Duration) string {
	d = max(d, 0)
	switch {
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Truncate(100*time.Millisecond).Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	}
	return fmt.Sprintf("%dd%02dh", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
}

// ownerAcquired reads the acquisition time from an owner string written by
// dlock (see splitOwner). ok is false for other owner strings.
func ownerAcquired(owner string) (at time.Time, ok bool) {
	o, ok := splitOwner(owner)
	if !ok {
		return time.Time{}, false
	}
	at, err := time.Parse(time.RFC3339, o.at)
	return at, err == nil
}

// ownerParts is an owner string that dlock wrote, in its parts.
type ownerParts struct {
	host, pid string // pid: "4242" or "4242 client 2"
	tag       string // the process tag (internal/proclive), or ""
	at        string // the acquisition time, RFC 3339
	metadata  *string
}

// splitOwner splits an owner string that dlock wrote,
// "host|pid N[ client K][|proc:MACHINE:START]|2026-11-21T10:00:03Z[|metadata]"
// (the metadata, last, may hold '|'); ok is false for other strings.
func splitOwner(owner string) (o ownerParts, ok bool) {
	parts := strings.SplitN(owner, "|", 3)
	if len(parts) < 3 {
		return o, false
	}
	o.host, ok = parts[0], true
	if o.pid, ok = strings.CutPrefix(parts[1], "pid "); !ok {
		return o, false
	}
	rest := parts[2]
	if strings.HasPrefix(rest, "proc:") {
		tag, after, found := strings.Cut(rest, "|")
		if !found || !proclive.IsTag(tag) {
			return o, false
		}
		o.tag, rest = tag, after
	}
	at, meta, hasMeta := strings.Cut(rest, "|")
	if _, err := time.Parse(time.RFC3339, at); err != nil {
		return o, false
	}
	o.at = at
	if hasMeta {
		o.metadata = &meta
	}
	return o, true
}

// heldFor returns how long the lock of info has been held: the store's own
// measure when it has one, else an estimate from the acquisition time in the
// owner string (by the holder's clock, to the second). ok is false when
// neither is known.
func heldFor(info driver.LockInfo, now time.Time) (d time.Duration, ok bool) {
	if info.HeldFor > 0 {
		return info.HeldFor, true
	}
	if at, ok := ownerAcquired(info.Owner); ok {
		return max(now.Sub(at), 0), true
	}
	return 0, false
}
