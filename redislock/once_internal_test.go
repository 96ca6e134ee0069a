package redislock

import (
	"strconv"
	"strings"
	"testing"
)

// written returns the request id id that go-redis wrote n times.
func written(id string, n int) *requestArg {
	r := &requestArg{id: id}
	for range n {
		_, _ = r.MarshalBinary()
	}
	return r
}

// The ids a release names as sent once are those of the requests written
// once whose grants were read, the latest onceIDs of them; a request
// written again is never named so, whatever is read after it. A request
// of which a copy may land (written and not answered, or written twice) is
// named as such; one never written, or written once and answered, is not.
func TestOnceGrantsNamesRequestsWrittenOnce(t *testing.T) {
	var g onceGrants
	g.granted("k", "a", written("r1", 1))
	g.granted("k", "a", written("r2", 2)) // a re-entry resent
	g.granted("k", "a", written("r3", 1))
	g.mayLand("k", "a", written("r4", 1), false) // its answer lost
	g.mayLand("k", "a", written("r5", 0), false) // failed before its write
	g.mayLand("k", "a", written("r6", 1), true)  // answered
	g.mayLand("k", "a", written("r7", 2), true)  // answered, resent
	if once, lost := g.ids("k", "a"); once != "r1 r3" || lost != "r4 r7" {
		t.Fatalf("ids %q and lost %q, want %q and %q", once, lost, "r1 r3", "r4 r7")
	}
	if once, lost := g.ids("k", "b"); once != "" || lost != "" {
		t.Fatalf("ids of a token with no request: %q, %q, want none", once, lost)
	}
	g.forget("k", "a")
	if once, lost := g.ids("k", "a"); once != "" || lost != "" {
		t.Fatalf("after its release: %q, %q, want none", once, lost)
	}
	for i := range onceIDs + 5 {
		g.granted("k", "a", written("r"+strconv.Itoa(i), 1))
	}
	once, _ := g.ids("k", "a")
	ids := strings.Fields(once)
	if len(ids) != onceIDs || ids[0] != "r5" || ids[onceIDs-1] != "r"+strconv.Itoa(onceIDs+4) {
		t.Fatalf("ids %v, want the latest %d", ids, onceIDs)
	}
}

// Grants that end without a release leave their entries; once there are
// onceMax, the map starts afresh.
func TestOnceGrantsBounded(t *testing.T) {
	var g onceGrants
	for i := range onceMax + 10 {
		g.granted("k", strconv.Itoa(i), written("r", 1))
		if len(g.m) > onceMax {
			t.Fatalf("%d entries after %d grants, want at most %d", len(g.m), i+1, onceMax)
		}
	}
	if once, _ := g.ids("k", strconv.Itoa(onceMax+9)); once != "r" {
		t.Fatalf("the latest grant: ids %q, want %q", once, "r")
	}
}
