package redislock

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
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
	if once, lost := g.ids("k", "a"); once != "r3 r1" || lost != "r4 r7" {
		t.Fatalf("ids %q and lost %q, want %q and %q", once, lost, "r3 r1", "r4 r7")
	}
	if once, lost := g.ids("k", "b"); once != "" || lost != "" {
		t.Fatalf("ids of a token with no request: %q, %q, want none", once, lost)
	}
	g.forget("k", "a", "r1 r3", "r4 r7")
	if once, lost := g.ids("k", "a"); once != "" || lost != "" {
		t.Fatalf("after its release: %q, %q, want none", once, lost)
	}
	for i := range onceIDs + 5 {
		g.granted("k", "a", written("r"+strconv.Itoa(i), 1))
	}
	once, _ := g.ids("k", "a")
	ids := strings.Fields(once)
	if len(ids) != onceIDs || ids[onceIDs-1] != "r5" || ids[0] != "r"+strconv.Itoa(onceIDs+4) {
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

// A full map forgets the ids of grants, not those of requests of which a
// copy may still land: no release would record them any more.
func TestOnceGrantsBoundKeepsRequestsThatMayLand(t *testing.T) {
	var g onceGrants
	g.mayLand("k", "lost", written("l1", 1), false)
	for i := range onceMax + 10 {
		g.granted("k", strconv.Itoa(i), written("r", 1))
	}
	if _, lost := g.ids("k", "lost"); lost != "l1" {
		t.Fatalf("after %d grants: lost %q, want %q", onceMax+10, lost, "l1")
	}
}

// A request of a token whose answer is lost while a release of the token
// is on its way (another goroutine of a reentrant handle, or another handle
// with the same owner ID) is not one the release named: it stays known, and
// the token's next release records it, so that its copy, landing after
// that release, grants nothing.
func TestReleaseKeepsRequestsLostWhileItWasOnItsWay(t *testing.T) {
	srv := testserver.StartRedis(t)
	rdb := srv.Client(t)
	b := New(rdb)
	ctx := t.Context()
	const key, token = "once/race", "tok"
	req := driver.AcquireRequest{Key: key, Token: token, Owner: "o", TTL: 10 * time.Second, Reentrant: true, Mode: driver.Exclusive}
	first, err := b.Acquire(ctx, req)
	if err != nil || !first.Acquired {
		t.Fatalf("first acquire: %+v, %v", first, err)
	}
	relArgs := b.releaseCall(key, token, b.publishArg, fenceArg(first.Fence))
	// The re-entry: written once, its answer lost; it has not landed yet.
	lateArgs, rid, err := b.acquireCall(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = rid.MarshalBinary()
	b.onces.mayLand(key, token, rid, false)
	if res, err := b.releaseAnswer(ctx, key, token, relArgs, runEvalSha(ctx, rdb, releaseScript, relArgs)); err != nil || !res.Held || res.Remaining != 0 {
		t.Fatalf("release of the first grant: %+v, %v", res, err)
	}
	// The re-entry tried again as a new request, granted, and released.
	again, err := b.Acquire(ctx, req)
	if err != nil || !again.Acquired {
		t.Fatalf("acquire tried again: %+v, %v", again, err)
	}
	if res, err := b.ReleaseGrant(ctx, key, token, again.Fence); err != nil || !res.Held || res.Remaining != 0 {
		t.Fatalf("last release: %+v, %v", res, err)
	}
	// The lost re-entry lands.
	if err := runEvalSha(ctx, rdb, acquireScript, lateArgs).Err(); err != nil {
		t.Fatal(err)
	}
	if n, _ := rdb.Exists(ctx, b.lockKey(key)).Result(); n != 0 {
		t.Errorf("the re-entry whose answer was lost during a release was granted after the last release: held by nobody")
	}
}

// A refused request that go-redis wrote twice is recorded at once, and is
// then not kept for a release of its token: a TryLock's token has none.
func TestRefusedResentRequestRecordedAndNotKept(t *testing.T) {
	srv := testserver.StartRedis(t)
	rdb := srv.Client(t)
	b := New(rdb)
	ctx := t.Context()
	const key = "once/refused"
	if res, err := b.Acquire(ctx, driver.AcquireRequest{Key: key, Token: "holder", Owner: "h", TTL: 10 * time.Second}); err != nil || !res.Acquired {
		t.Fatalf("holder: %+v, %v", res, err)
	}
	req := driver.AcquireRequest{Key: key, Token: "tok", Owner: "o", TTL: 10 * time.Second}
	args, rid, err := b.acquireCall(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = rid.MarshalBinary() // a first copy, still on its way
	res, err := b.acquireAnswer(ctx, req, rid, runEvalSha(ctx, rdb, acquireScript, args))
	if err != nil || res.Acquired {
		t.Fatalf("the resend: %+v, %v, want a refusal", res, err)
	}
	if _, err := rdb.ZScore(ctx, b.lockKey(key)+lateSuffix, "r"+rid.id).Result(); err != nil {
		t.Errorf("the refused, resent request is not in the late-request record: %v", err)
	}
	if once, lost := b.onces.ids(key, "tok"); once != "" || lost != "" {
		t.Errorf("kept for a release of its token: %q, %q, want nothing", once, lost)
	}
}

// A reentrant grant all of whose requests were sent once is named as the
// grant keeps them, newest first: release.lua then drops them all without
// parsing them.
func TestOnceNamesGrantsRequestsInTheGrantsOrder(t *testing.T) {
	srv := testserver.StartRedis(t)
	rdb := srv.Client(t)
	b := New(rdb)
	ctx := t.Context()
	const key, token = "once/order", "tok"
	req := driver.AcquireRequest{Key: key, Token: token, Owner: "o", TTL: 10 * time.Second, Reentrant: true, Mode: driver.Exclusive}
	for range 3 {
		if res, err := b.Acquire(ctx, req); err != nil || !res.Acquired {
			t.Fatalf("acquire: %+v, %v", res, err)
		}
	}
	rids, err := rdb.HGet(ctx, b.lockKey(key), "rid").Result()
	if err != nil {
		t.Fatal(err)
	}
	if once, _ := b.onces.ids(key, token); once != rids {
		t.Errorf("named %q, the grant keeps %q", once, rids)
	}
}
