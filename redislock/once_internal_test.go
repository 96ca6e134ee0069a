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

// The ids a release names are those of the requests written once whose
// grants were read, the latest onceIDs of them; a request written again
// is never named, whatever is read after it.
func TestOnceGrantsNamesRequestsWrittenOnce(t *testing.T) {
	var g onceGrants
	g.granted("k", "a", written("r1", 1))
	g.granted("k", "a", written("r2", 2)) // a re-entry resent
	g.granted("k", "a", written("r3", 1))
	if got := g.ids("k", "a"); got != "r1 r3" {
		t.Fatalf("ids %q, want %q", got, "r1 r3")
	}
	if got := g.ids("k", "b"); got != "" {
		t.Fatalf("ids of a token with no grant read: %q, want none", got)
	}
	g.forget("k", "a")
	if got := g.ids("k", "a"); got != "" {
		t.Fatalf("after its release: ids %q, want none", got)
	}
	for i := range onceIDs + 5 {
		g.granted("k", "a", written("r"+strconv.Itoa(i), 1))
	}
	ids := strings.Fields(g.ids("k", "a"))
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
	if got := g.ids("k", strconv.Itoa(onceMax+9)); got != "r" {
		t.Fatalf("the latest grant: ids %q, want %q", got, "r")
	}
}
