package redislock

import (
	"strconv"
	"testing"
)

// written returns a request id that go-redis wrote n times.
func written(n int) *requestArg {
	r := &requestArg{id: "r"}
	for range n {
		_, _ = r.MarshalBinary()
	}
	return r
}

// A grant is known to have had each request written once only while every
// answer read of it says so: a request written again marks it until its
// release, whatever answer is read after.
func TestOnceGrantsKeepsARequestWrittenAgain(t *testing.T) {
	var g onceGrants
	g.granted("k", "a", 7, 1, written(1))
	if got := g.fence("k", "a"); got != 7 {
		t.Fatalf("a first hold written once: fence %d, want 7", got)
	}
	g.granted("k", "a", 7, 2, written(1)) // a re-entry written once
	if got := g.fence("k", "a"); got != 7 {
		t.Fatalf("after a re-entry written once: fence %d, want 7", got)
	}
	g.granted("k", "a", 7, 3, written(2)) // a re-entry resent
	if got := g.fence("k", "a"); got != 0 {
		t.Fatalf("after a re-entry written twice: fence %d, want 0", got)
	}
	// The first hold's answer read after the resent re-entry's (two
	// goroutines of one reentrant handle) leaves the mark.
	g.granted("k", "a", 7, 1, written(1))
	if got := g.fence("k", "a"); got != 0 {
		t.Fatalf("a first hold's answer after the mark: fence %d, want 0", got)
	}
	g.refenced("k", "a", 9)
	if got := g.fence("k", "a"); got != 0 {
		t.Fatalf("a marked grant refenced: fence %d, want 0", got)
	}
	// A new grant of the token (after a lost one) is known afresh.
	g.granted("k", "a", 11, 1, written(1))
	g.refenced("k", "a", 12)
	if got := g.fence("k", "a"); got != 12 {
		t.Fatalf("a new grant refenced: fence %d, want 12", got)
	}
	g.forget("k", "a")
	if got := g.fence("k", "a"); got != 0 {
		t.Fatalf("after its release: fence %d, want 0", got)
	}
	g.granted("k", "b", 13, 1, written(2))
	if got := g.fence("k", "b"); got != 0 {
		t.Fatalf("a first hold resent: fence %d, want 0", got)
	}
	g.granted("k", "c", 14, 2, written(1)) // a re-entry of a grant not known
	if got := g.fence("k", "c"); got != 0 {
		t.Fatalf("a re-entry of an unknown grant: fence %d, want 0", got)
	}
}

// Grants that end without a release leave their entries; once there are
// onceMax, those of grants written once go first, and the marks stay.
func TestOnceGrantsBounded(t *testing.T) {
	var g onceGrants
	g.granted("k", "marked", 1, 1, written(2))
	for i := range onceMax + 10 {
		g.granted("k", strconv.Itoa(i), uint64(i+2), 1, written(1))
		if len(g.m) > onceMax {
			t.Fatalf("%d entries after %d grants, want at most %d", len(g.m), i+2, onceMax)
		}
	}
	if e, ok := g.m[onceKey{"k", "marked"}]; !ok || !e.again {
		t.Fatalf("the mark of a resent grant was dropped: %+v %v", e, ok)
	}
	if got := g.fence("k", strconv.Itoa(onceMax+9)); got != onceMax+11 {
		t.Fatalf("the latest grant: fence %d, want %d", got, onceMax+11)
	}
}
