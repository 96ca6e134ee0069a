package redlock

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// TestLeaderRefusalByTheSameClientGoesOn checks that a leader's refusal by
// a hold of the requester's own Client, made in another second or with
// other metadata (an owner description of its own), does not end the
// attempt: it may be a losing attempt's grant that is undone without an
// announcement. Another Client's hold, in this process or elsewhere, does.
func TestLeaderRefusalByTheSameClientGoesOn(t *testing.T) {
	id := driver.ProcessIdentity()
	mine := id + " client 3|2026-11-30T10:00:01Z|job"
	for _, c := range []struct {
		holder string
		stops  bool
	}{
		{id + " client 3|2026-11-30T10:00:00Z|job", false},
		{id + " client 3|2026-11-30T10:00:01Z|other", false},
		{mine, false},
		{id + " client 4|2026-11-30T10:00:01Z|job", true},
		{id + "|2026-11-30T10:00:01Z|job", true},
		{"elsewhere|pid 7 client 3|2026-11-30T10:00:01Z|job", true},
		{"alpha", true},
	} {
		a := &attempt{req: driver.AcquireRequest{Owner: mine}}
		res := driver.AcquireResult{Holder: c.holder, HolderTTL: time.Second}
		if got := a.stopsAt(res); got != c.stops {
			t.Errorf("refused by %q: stopsAt = %v, want %v", c.holder, got, c.stops)
		}
	}
	// A requester whose owner no Client of this process made: owners compare whole.
	a := &attempt{req: driver.AcquireRequest{Owner: "beta"}}
	if !a.stopsAt(driver.AcquireResult{Holder: "alpha", HolderTTL: time.Second}) || a.stopsAt(driver.AcquireResult{Holder: "beta", HolderTTL: time.Second}) {
		t.Error("owners of no Client of this process are not compared whole")
	}
}
