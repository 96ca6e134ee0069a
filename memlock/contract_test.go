package memlock_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memlock"
)

// These tests check the driver contract for shared holds, fair queues and
// writer intents at the driver level, one rule of the spec each, with a
// ManualClock so that every expiry is exact.

const (
	key      = "k"
	leaseTTL = 10 * time.Second
	queueTTL = 5 * time.Second
)

type fixture struct {
	t     *testing.T
	clock *memlock.ManualClock
	b     *memlock.Backend

	mu    sync.Mutex
	notes []note // notifications for key, in order
}

type note struct{ key, next string }

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{t: t, clock: memlock.NewManualClock(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))}
	f.b = memlock.New(memlock.WithClock(f.clock))
	l, err := f.b.Listen(t.Context(), func(k, next string) {
		f.mu.Lock()
		f.notes = append(f.notes, note{k, next})
		f.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	if err := l.Subscribe(t.Context(), key); err != nil {
		t.Fatal(err)
	}
	return f
}

// takeNotes returns the notifications since the last call, leaving out the
// ("", "") that ManualClock.Advance sends.
func (f *fixture) takeNotes() []note {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []note
	for _, n := range f.notes {
		if n.key != "" {
			out = append(out, n)
		}
	}
	f.notes = nil
	return out
}

func (f *fixture) acquire(req driver.AcquireRequest) driver.AcquireResult {
	f.t.Helper()
	if req.Key == "" {
		req.Key = key
	}
	if req.Owner == "" {
		req.Owner = "owner of " + req.Token
	}
	if req.TTL == 0 {
		req.TTL = leaseTTL
	}
	if req.Wait && req.QueueTTL == 0 {
		req.QueueTTL = queueTTL
	}
	res, err := f.b.Acquire(f.t.Context(), req)
	if err != nil {
		f.t.Fatalf("Acquire(%+v): %v", req, err)
	}
	return res
}

func (f *fixture) mustGet(req driver.AcquireRequest) driver.AcquireResult {
	f.t.Helper()
	res := f.acquire(req)
	if !res.Acquired {
		f.t.Fatalf("Acquire(%s %q) refused: %+v", req.Mode, req.Token, res)
	}
	return res
}

func (f *fixture) mustRefuse(req driver.AcquireRequest) driver.AcquireResult {
	f.t.Helper()
	res := f.acquire(req)
	if res.Acquired {
		f.t.Fatalf("Acquire(%s %q) granted, want refused", req.Mode, req.Token)
	}
	return res
}

func (f *fixture) release(token string) driver.ReleaseResult {
	f.t.Helper()
	res, err := f.b.Release(f.t.Context(), key, token)
	if err != nil {
		f.t.Fatalf("Release(%q): %v", token, err)
	}
	return res
}

func (f *fixture) inspect() (driver.LockInfo, bool) {
	f.t.Helper()
	info, ok, err := f.b.Inspect(f.t.Context(), key)
	if err != nil {
		f.t.Fatal(err)
	}
	return info, ok
}

func (f *fixture) noLeftovers() {
	f.t.Helper()
	if left := memlock.Leftovers(f.b, key); len(left) > 0 {
		f.t.Errorf("left on the store: %v", left)
	}
}

func excl(token string) driver.AcquireRequest { return driver.AcquireRequest{Token: token} }
func waitExcl(token string) driver.AcquireRequest {
	return driver.AcquireRequest{Token: token, Wait: true}
}
func fair(token string) driver.AcquireRequest {
	return driver.AcquireRequest{Token: token, Fair: true, Wait: true}
}
func reader(token string) driver.AcquireRequest {
	return driver.AcquireRequest{Token: token, Mode: driver.Shared}
}
func permit(token string, limit int) driver.AcquireRequest {
	return driver.AcquireRequest{Token: token, Mode: driver.Shared, Limit: limit}
}

func TestSupports(t *testing.T) {
	b := memlock.New()
	for _, c := range []driver.Capability{driver.CapShared, driver.CapSemaphore, driver.CapFair} {
		if !b.Supports(c) {
			t.Errorf("Supports(%v) = false", c)
		}
	}
	if b.Supports(driver.Capability(99)) {
		t.Error("Supports(unknown capability) = true")
	}
}

// Rule 1: an exclusive grant needs no live shared hold; expired ones are
// ignored.
func TestExclusiveBlockedBySharedHolds(t *testing.T) {
	f := newFixture(t)
	r1 := f.mustGet(driver.AcquireRequest{Token: "r1", Mode: driver.Shared, TTL: 2 * time.Second})
	f.mustGet(driver.AcquireRequest{Token: "r2", Mode: driver.Shared, TTL: 3 * time.Second})
	res := f.mustRefuse(excl("w"))
	if res.Holder != "owner of r2" || res.HolderTTL != 3*time.Second || res.Shared != 2 {
		t.Errorf("refusal = %+v, want the hold expiring last (r2, 3s) and Shared 2", res)
	}
	if res.Queued || res.Position != 0 {
		t.Errorf("refusal without Wait recorded something: %+v", res)
	}
	if info, _ := f.inspect(); info.WriterWaiting || info.Queued != 0 {
		t.Errorf("TryLock left an intent or entry: %+v", info)
	}
	f.clock.Advance(3 * time.Second)
	w := f.mustGet(excl("w"))
	if w.Fence <= r1.Fence {
		t.Errorf("fence %d after shared fence %d", w.Fence, r1.Fence)
	}
}

// Rule 1: a Fair grant yields to another token's live queue entry, and
// lapsed entries are ignored; requests without Fair ignore the queue.
func TestFairYieldsToQueue(t *testing.T) {
	f := newFixture(t)
	f.mustGet(excl("h"))
	if res := f.mustRefuse(fair("a")); res.Position != 1 || !res.Queued {
		t.Fatalf("first waiter: %+v, want position 1, queued", res)
	}
	if res := f.mustRefuse(fair("b")); res.Position != 2 || !res.Queued {
		t.Fatalf("second waiter: %+v, want position 2, queued", res)
	}
	f.release("h")
	// Free, but a and b are ahead: a fair TryLock and b are refused.
	res := f.mustRefuse(driver.AcquireRequest{Token: "c", Fair: true})
	if res.Queued || res.Position != 0 {
		t.Errorf("fair TryLock recorded something: %+v", res)
	}
	if info, _, _ := f.b.Inspect(t.Context(), key); info.Queued != 0 {
		t.Errorf("Inspect of a free lock = %+v", info)
	}
	if l := memlock.Leftovers(f.b, key); len(l) != 2 {
		t.Errorf("leftovers %v, want the two queue entries", l)
	}
	if res := f.mustRefuse(fair("b")); res.Position != 2 {
		t.Errorf("b: %+v, want position 2", res)
	}
	// A non-fair request ignores the queue, and says that it overtook it.
	if res := f.mustGet(excl("x")); !res.Overtook {
		t.Errorf("non-fair grant before a live queue: %+v, want Overtook", res)
	}
	f.release("x")
	if res := f.mustGet(fair("a")); res.Overtook {
		t.Errorf("the head's own grant: %+v, want no Overtook", res)
	}
	f.release("a")
	f.mustGet(fair("b"))
	f.release("b")
	if res := f.mustGet(excl("y")); res.Overtook {
		t.Errorf("grant with no queue: %+v, want no Overtook", res)
	}
	f.release("y")
	f.noLeftovers()

	// A head whose entry lapsed is skipped.
	f.mustGet(excl("h"))
	f.mustRefuse(fair("a"))
	f.clock.Advance(queueTTL / 2)
	f.mustRefuse(fair("b"))
	f.release("h")
	f.mustRefuse(fair("b"))
	f.clock.Advance(queueTTL / 2)
	f.mustGet(fair("b"))
	f.release("b")
	f.noLeftovers()
}

// Rule 2: a refused fair waiter keeps its place when it tries again, and its
// entry lives QueueTTL after its last try.
func TestFairKeepsPlace(t *testing.T) {
	f := newFixture(t)
	f.mustGet(excl("h"))
	for _, tok := range []string{"a", "b", "c"} {
		f.mustRefuse(fair(tok))
	}
	for range 4 {
		f.clock.Advance(queueTTL * 2 / 3)
		for i, tok := range []string{"c", "a", "b"} { // refresh order does not matter
			if res := f.mustRefuse(fair(tok)); res.Position != []int{3, 1, 2}[i] {
				t.Fatalf("%s at position %d", tok, res.Position)
			}
		}
		f.mustGet(driver.AcquireRequest{Token: "h", Reentrant: true}) // keeps h's lease alive
		f.release("h")
	}
	if info, ok := f.inspect(); !ok || info.Queued != 3 || info.Holds != 1 {
		t.Errorf("Inspect = %+v, %v; want held, 3 queued", info, ok)
	}
	// b stops trying: it lapses, the others keep their order.
	f.clock.Advance(queueTTL * 2 / 3)
	f.mustRefuse(fair("a"))
	f.mustRefuse(fair("c"))
	f.clock.Advance(queueTTL * 2 / 3)
	if res := f.mustRefuse(fair("c")); res.Position != 2 {
		t.Errorf("c at %d after b lapsed, want 2", res.Position)
	}
}

// Rule 2: a refused exclusive Wait blocked by shared holds records a writer
// intent, one at a time; the intent keeps new readers out and lapses
// QueueTTL after its writer's last try.
func TestWriterIntent(t *testing.T) {
	f := newFixture(t)
	f.mustGet(reader("r1"))
	res := f.mustRefuse(waitExcl("w1"))
	if !res.Queued || res.Position != 0 || res.Holder != "owner of r1" || res.Shared != 1 {
		t.Fatalf("writer refusal = %+v, want queued (intent), holder r1", res)
	}
	if res := f.mustRefuse(waitExcl("w2")); res.Queued {
		t.Errorf("second writer recorded an intent while w1's is live: %+v", res)
	}
	info, _ := f.inspect()
	if !info.WriterWaiting || len(info.Shared) != 1 {
		t.Errorf("Inspect = %+v, want WriterWaiting and one shared hold", info)
	}
	rres := f.mustRefuse(reader("r2"))
	if !rres.WriterWaiting || rres.Holder != "owner of w1" || rres.HolderTTL != queueTTL || rres.Queued {
		t.Errorf("reader refusal = %+v, want WriterWaiting naming w1 with the intent's TTL", rres)
	}
	// A refused shared request records nothing.
	if l := memlock.Leftovers(f.b, key); len(l) != 2 {
		t.Errorf("leftovers %v, want r1's hold and w1's intent", l)
	}
	// w1 refreshes its intent; without it, it lapses.
	f.clock.Advance(queueTTL - time.Second)
	f.mustRefuse(waitExcl("w1"))
	f.clock.Advance(queueTTL - time.Second)
	if res := f.mustRefuse(reader("r2")); !res.WriterWaiting || res.HolderTTL != time.Second {
		t.Errorf("after w1's refresh: %+v, want WriterWaiting with 1s left", res)
	}
	f.mustRefuse(driver.AcquireRequest{Token: "r1", Mode: driver.Shared}) // a token holds once: its own hold refuses it
	f.clock.Advance(time.Second)
	f.mustGet(reader("r2"))
	if info, _ := f.inspect(); info.WriterWaiting {
		t.Errorf("intent still shown after it lapsed: %+v", info)
	}
	// w2 records its own intent now; readers go; w2 gets in and its intent goes.
	if res := f.mustRefuse(waitExcl("w2")); !res.Queued {
		t.Errorf("w2 refusal = %+v, want queued", res)
	}
	f.release("r1")
	f.release("r2")
	f.mustGet(waitExcl("w2"))
	if info, _ := f.inspect(); info.WriterWaiting || info.Queued != 0 {
		t.Errorf("Inspect after w2's grant = %+v, want no intent", info)
	}
	f.release("w2")
	f.noLeftovers()
}

// Rule 2 and 3: a fair writer blocked by readers queues and records its
// intent; its grant removes both.
func TestFairWriterBehindReaders(t *testing.T) {
	f := newFixture(t)
	f.mustGet(reader("r"))
	res := f.mustRefuse(fair("w"))
	if !res.Queued || res.Position != 1 {
		t.Fatalf("refusal = %+v", res)
	}
	if info, _ := f.inspect(); !info.WriterWaiting || info.Queued != 1 {
		t.Errorf("Inspect = %+v, want an intent and one entry", info)
	}
	f.release("r")
	f.mustGet(fair("w"))
	if info, _ := f.inspect(); info.WriterWaiting || info.Queued != 0 {
		t.Errorf("Inspect after the grant = %+v", info)
	}
	f.release("w")
	f.noLeftovers()
}

// Rule 4: a shared grant needs no exclusive holder, no other token's intent
// and, with a Limit, fewer live shared holds than the Limit.
func TestSharedRefusals(t *testing.T) {
	f := newFixture(t)
	f.mustGet(excl("w"))
	res := f.mustRefuse(reader("r"))
	if res.Holder != "owner of w" || res.HolderTTL != leaseTTL || res.WriterWaiting || res.Queued {
		t.Errorf("reader refused by a writer: %+v", res)
	}
	f.release("w")

	f.mustGet(driver.AcquireRequest{Token: "p1", Mode: driver.Shared, Limit: 2, TTL: 4 * time.Second})
	f.mustGet(driver.AcquireRequest{Token: "p2", Mode: driver.Shared, Limit: 2, TTL: 3 * time.Second})
	res = f.mustRefuse(permit("p3", 2))
	if res.Shared != 2 || res.Holder != "owner of p2" || res.HolderTTL != 3*time.Second || res.WriterWaiting {
		t.Errorf("permit refused at the limit: %+v, want Shared 2 and the first to expire (p2, 3s)", res)
	}
	// The holds bind the limit: readers and other limits are refused as
	// conflicts, and take no hold away.
	for _, req := range []driver.AcquireRequest{reader("r"), permit("p3", 4), permit("p3", 1)} {
		if res := f.mustRefuse(req); !res.Conflict || res.HeldLimit != 2 || res.Shared != 2 || res.Holder != "owner of p1" {
			t.Errorf("limit %d beside permits of 2 = %+v, want a conflict with limit 2, 2 shared, naming p1", req.Limit, res)
		}
	}
	if info, _ := f.inspect(); info.Limit != 2 || len(info.Shared) != 2 || info.Owner != "" {
		t.Errorf("Inspect = %+v, want Limit 2, two shared holds", info)
	}
	// Expiry frees a permit.
	f.clock.Advance(3 * time.Second)
	f.mustGet(permit("p3", 2))
	// Once every hold is gone, any limit.
	f.release("p3")
	f.clock.Advance(2 * time.Second)
	f.mustGet(permit("p4", 3))
	f.mustGet(permit("p5", 3))
	f.mustGet(permit("p6", 3))
	f.mustRefuse(permit("p7", 3))
}

// Rules 1 and 4: every grant, exclusive or shared, draws from one fence
// counter.
func TestOneFenceCounter(t *testing.T) {
	f := newFixture(t)
	var last uint64
	step := func(res driver.AcquireResult) {
		t.Helper()
		if res.Fence <= last {
			t.Fatalf("fence %d after %d", res.Fence, last)
		}
		last = res.Fence
	}
	step(f.mustGet(excl("w1")))
	f.release("w1")
	step(f.mustGet(reader("r1")))
	step(f.mustGet(reader("r2")))
	f.release("r1")
	f.release("r2")
	step(f.mustGet(permit("p", 5)))
	f.release("p")
	step(f.mustGet(fair("w2")))
}

// Rule 5: releases notify, naming the live queue head when the lock is left
// without an exclusive holder.
func TestReleaseNotifications(t *testing.T) {
	f := newFixture(t)
	f.mustGet(excl("h"))
	f.mustRefuse(fair("a"))
	f.mustRefuse(fair("b"))
	f.takeNotes()

	if res := f.release("h"); !res.Held || res.Remaining != 0 {
		t.Errorf("Release = %+v", res)
	}
	if got := f.takeNotes(); !slices.Equal(got, []note{{key, "a"}}) {
		t.Errorf("release of the holder: notes %v, want next a", got)
	}
	// The head gives up while the lock is free: the next one is named.
	if res := f.release("a"); res.Held {
		t.Errorf("Release of a waiter = %+v, want not held", res)
	}
	if got := f.takeNotes(); !slices.Equal(got, []note{{key, "b"}}) {
		t.Errorf("head leaving: notes %v, want next b", got)
	}
	f.mustGet(fair("b"))
	f.mustRefuse(fair("c"))
	f.mustRefuse(fair("d"))
	f.takeNotes()
	// A waiter behind the head leaves while the lock is held: nobody can get in.
	f.release("d")
	if got := f.takeNotes(); len(got) != 0 {
		t.Errorf("non-head leaving a held lock: notes %v, want none", got)
	}
	if info, _ := f.inspect(); info.Queued != 1 {
		t.Errorf("Queued = %d after d left, want 1", info.Queued)
	}
	f.release("b")
	if got := f.takeNotes(); !slices.Equal(got, []note{{key, "c"}}) {
		t.Errorf("notes %v, want next c", got)
	}
	f.mustGet(fair("c"))
	f.release("c")
	if got := f.takeNotes(); !slices.Equal(got, []note{{key, ""}}) {
		t.Errorf("release with an empty queue: notes %v, want next \"\"", got)
	}

	// A shared hold's release notifies and reports one hold gone.
	f.mustGet(reader("r1"))
	f.mustGet(reader("r2"))
	f.takeNotes()
	if res := f.release("r1"); !res.Held || res.Remaining != 0 {
		t.Errorf("Release of a shared hold = %+v, want held, 0 remaining", res)
	}
	if got := f.takeNotes(); len(got) != 1 {
		t.Errorf("shared release: notes %v, want one", got)
	}
	// A writer that gives up takes its intent with it and lets readers in.
	f.mustRefuse(waitExcl("w"))
	f.mustRefuse(reader("r3"))
	f.takeNotes()
	if res := f.release("w"); res.Held {
		t.Errorf("Release of an intent = %+v, want not held", res)
	}
	if got := f.takeNotes(); !slices.Equal(got, []note{{key, ""}}) {
		t.Errorf("intent removed: notes %v, want next \"\"", got)
	}
	f.mustGet(reader("r3"))
	// A stranger's release changes nothing and wakes nobody.
	if res := f.release("nobody"); res.Held {
		t.Errorf("Release by a stranger = %+v", res)
	}
	if got := f.takeNotes(); len(got) != 0 {
		t.Errorf("stranger's release: notes %v", got)
	}
	// Reentrant holds: only the last release notifies.
	f.release("r2")
	f.release("r3")
	f.mustGet(driver.AcquireRequest{Token: "re", Reentrant: true})
	f.mustGet(driver.AcquireRequest{Token: "re", Reentrant: true})
	f.takeNotes()
	if res := f.release("re"); !res.Held || res.Remaining != 1 {
		t.Errorf("Release = %+v, want 1 remaining", res)
	}
	if got := f.takeNotes(); len(got) != 0 {
		t.Errorf("partial release: notes %v", got)
	}
	f.release("re")
	if got := f.takeNotes(); len(got) != 1 {
		t.Errorf("last release: notes %v", got)
	}
	f.noLeftovers()
}

// A shared hold's release and a writer's intent going are announced to
// everyone (next ""), even with a fair queue: waiting readers and permit
// holders are not in the queue and must be woken too (Notifier.Listen).
func TestSharedReleaseWakesEveryone(t *testing.T) {
	f := newFixture(t)
	f.mustGet(reader("r1"))
	f.mustGet(reader("r2"))
	f.mustRefuse(fair("w")) // queued, with an intent
	f.mustRefuse(fair("v")) // queued
	f.takeNotes()
	f.release("r1")
	if got := f.takeNotes(); !slices.Equal(got, []note{{key, ""}}) {
		t.Errorf("shared release: notes %v, want next \"\"", got)
	}
	f.release("w") // the head leaves, with its intent
	if got := f.takeNotes(); !slices.Equal(got, []note{{key, ""}}) {
		t.Errorf("fair writer leaving with its intent: notes %v, want next \"\"", got)
	}
	f.mustGet(reader("r3"))
	f.release("r2")
	f.release("r3")
	if got := f.takeNotes(); !slices.Equal(got, []note{{key, ""}, {key, ""}}) {
		t.Errorf("notes %v", got)
	}
	f.mustGet(fair("v"))
}

// Rule 5: the next named is the live head: lapsed entries are skipped.
func TestNextSkipsLapsedHead(t *testing.T) {
	f := newFixture(t)
	f.mustGet(excl("h"))
	f.mustRefuse(fair("dead"))
	f.clock.Advance(time.Second)
	f.mustRefuse(fair("alive"))
	f.clock.Advance(queueTTL - time.Second)
	f.takeNotes()
	f.release("h")
	if got := f.takeNotes(); !slices.Equal(got, []note{{key, "alive"}}) {
		t.Errorf("notes %v, want next alive", got)
	}
}

// Rule 6: a shared hold renews, never shortened; an expired or unknown one
// does not.
func TestRenewShared(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	f.mustGet(driver.AcquireRequest{Token: "r", Mode: driver.Shared, TTL: 2 * time.Second})
	f.clock.Advance(time.Second)
	if ok, err := f.b.Renew(ctx, key, "r", 5*time.Second); !ok || err != nil {
		t.Fatalf("Renew = %v, %v", ok, err)
	}
	if ok, _ := f.b.Renew(ctx, key, "r", time.Second); !ok {
		t.Fatal("shorter Renew refused")
	}
	if info, _ := f.inspect(); len(info.Shared) != 1 || info.Shared[0].TTL != 5*time.Second {
		t.Errorf("Inspect = %+v, want one hold with 5s left (a renewal never shortens)", info)
	}
	out := f.b.RenewBatch(ctx, []driver.RenewRequest{{Key: key, Token: "r", TTL: 6 * time.Second}, {Key: key, Token: "x", TTL: time.Second}})
	if !out[0].Held || out[1].Held || out[0].Err != nil || out[1].Err != nil {
		t.Errorf("RenewBatch = %+v", out)
	}
	f.clock.Advance(6 * time.Second)
	if ok, _ := f.b.Renew(ctx, key, "r", 5*time.Second); ok {
		t.Error("Renew of an expired shared hold succeeded")
	}
	if res := f.release("r"); res.Held {
		t.Errorf("Release of an expired shared hold = %+v", res)
	}
	// A queue entry or intent is not a hold: Renew does not keep it.
	f.mustGet(reader("r"))
	f.mustRefuse(waitExcl("w"))
	if ok, _ := f.b.Renew(ctx, key, "w", time.Minute); ok {
		t.Error("Renew of a writer intent succeeded")
	}
}

// Rule 7: Inspect, List and ForceRelease cover shared holds.
func TestInspectShared(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	p1 := f.mustGet(permit("p1", 3))
	f.clock.Advance(time.Second)
	p2 := f.mustGet(permit("p2", 3))
	f.mustRefuse(fair("w"))
	info, ok := f.inspect()
	want := []driver.SharedHold{{Owner: "owner of p1", Fence: p1.Fence, TTL: leaseTTL - time.Second}, {Owner: "owner of p2", Fence: p2.Fence, TTL: leaseTTL}}
	if !ok || info.Owner != "" || info.Fence != 0 || info.Holds != 0 || info.TTL != 0 || !slices.Equal(info.Shared, want) ||
		info.Limit != 3 || info.Queued != 1 || !info.WriterWaiting {
		t.Errorf("Inspect = %+v, %v; want shared %+v, Limit 3, 1 queued, writer waiting", info, ok, want)
	}
	// List has names with only shared holds, in key order, not those with
	// only a queue.
	f.mustGet(driver.AcquireRequest{Key: "a", Token: "x"})
	f.mustGet(driver.AcquireRequest{Key: "q", Token: "y"})
	f.mustRefuse(driver.AcquireRequest{Key: "q", Token: "z", Fair: true, Wait: true})
	f.release2("q", "y")
	list, err := f.b.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, i := range list {
		keys = append(keys, i.Key)
	}
	if !slices.Equal(keys, []string{"a", key}) {
		t.Errorf("List keys = %v, want [a %s]", keys, key)
	}
	if _, ok, _ := f.b.Inspect(ctx, "q"); ok {
		t.Error("Inspect of a name with only a queue entry: ok")
	}
	// ForceRelease removes every hold, keeps the queue and the intent,
	// notifies next "".
	f.takeNotes()
	got, ok, err := f.b.ForceRelease(ctx, key)
	if err != nil || !ok || len(got.Shared) != 2 {
		t.Errorf("ForceRelease = %+v, %v, %v", got, ok, err)
	}
	if n := f.takeNotes(); !slices.Equal(n, []note{{key, ""}}) {
		t.Errorf("notes %v, want next \"\"", n)
	}
	if _, ok := f.inspect(); ok {
		t.Error("held after ForceRelease")
	}
	if ok, _ := f.b.Renew(ctx, key, "p1", time.Minute); ok {
		t.Error("a force-released permit renewed")
	}
	if left := memlock.Leftovers(f.b, key); len(left) != 2 {
		t.Errorf("leftovers %v, want w's entry and intent", left)
	}
	if _, ok, _ := f.b.ForceRelease(ctx, key); ok {
		t.Error("second ForceRelease: ok")
	}
	f.mustGet(fair("w"))
}

func (f *fixture) release2(k, token string) {
	f.t.Helper()
	if _, err := f.b.Release(f.t.Context(), k, token); err != nil {
		f.t.Fatal(err)
	}
}

// Rule 8: nothing is left once holders released and waiters gave up or
// lapsed, and lapsed states are eventually dropped from memory.
func TestNothingLeft(t *testing.T) {
	f := newFixture(t)
	f.mustGet(reader("r"))
	f.mustRefuse(waitExcl("w"))
	f.mustRefuse(fair("q"))
	f.release("r")
	f.release("w")
	f.release("q")
	f.noLeftovers()
	if n := memlock.States(f.b); n != 0 {
		t.Errorf("%d states in memory after everything left", n)
	}
	// Waiters that die lapse; keys nobody touches again are swept.
	for i := range 100 {
		k := fmt.Sprintf("k%d", i)
		f.mustGet(driver.AcquireRequest{Key: k, Token: "h", TTL: time.Second})
		f.mustRefuse(driver.AcquireRequest{Key: k, Token: "q", Fair: true, Wait: true, QueueTTL: time.Second})
	}
	f.clock.Advance(time.Second)
	for range 200 {
		_, _ = f.b.Renew(t.Context(), key, "nobody", time.Second)
	}
	if n := memlock.States(f.b); n != 0 {
		t.Errorf("%d states in memory after every entry lapsed", n)
	}
}

// The store's failures reach every new call.
func TestUnavailableShared(t *testing.T) {
	f := newFixture(t)
	f.b.SetUnavailable(context.DeadlineExceeded)
	if _, err := f.b.Acquire(t.Context(), driver.AcquireRequest{Key: key, Token: "r", Mode: driver.Shared, TTL: time.Second}); err == nil {
		t.Error("Acquire on a store that is down: no error")
	}
	f.b.SetUnavailable(nil)
	if _, err := f.b.Acquire(t.Context(), driver.AcquireRequest{Key: key, Token: "r", Mode: driver.Mode(7), TTL: time.Second}); err == nil {
		t.Error("Acquire with an unknown mode: no error")
	}
}
