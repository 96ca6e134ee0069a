package locktest

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// testProclaim checks Leadership.Proclaim across Clients: the new value,
// with the same fence, is read by another Client's Leader and observer and
// kept through renewals; a lost leadership cannot proclaim. At the driver
// level, a proclaim with a lower Seq than one applied (a late one) changes
// nothing, and one for another grant reports not held. A backend with
// driver.Inspector but without driver.Proclaimer must refuse Proclaim.
func testProclaim(t *testing.T, s *Store) {
	const name = "locktest/proclaim"
	backend := s.NewBackend(t)
	if _, ok := backend.(driver.Inspector); !ok {
		return // no elections at all: testElection checks the refusal
	}
	p, proclaims := backend.(driver.Proclaimer)
	// What is checked is values, not expiry: a TTL that renewals held up
	// under load (a busy etcd cluster) cannot run out between two.
	a := clientOn(t, backend, dlock.WithTTL(proclaimTTL)).Election(name)
	watcher := client(t, s).Election(name)
	la, err := a.Campaign(t.Context(), "v1")
	if err != nil {
		t.Fatal(err)
	}
	if !proclaims {
		if err := la.Proclaim(t.Context(), "v2"); !errors.Is(err, dlock.ErrUnsupported) || !errors.Is(err, dlock.ErrInvalid) {
			t.Fatalf("Proclaim on a backend without Proclaimer = %v, want ErrInvalid and ErrUnsupported", err)
		}
		unlock(t, la.Lease())
		return
	}
	seen, err := watcher.Observe(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got := nextGoodLeader(t, seen); got.Value != "v1" || got.Fence != la.Fence() {
		t.Fatalf("Observe's first value = %+v, want v1 with fence %d", got, la.Fence())
	}
	fence := la.Fence()
	if err := la.Proclaim(t.Context(), "v2 | zone b"); err != nil {
		t.Fatal(err)
	}
	if la.Value() != "v2 | zone b" || la.Fence() != fence {
		t.Fatalf("after Proclaim: value %q fence %d; want v2, fence %d", la.Value(), la.Fence(), fence)
	}
	if got, err := watcher.Leader(t.Context()); err != nil || got.Value != "v2 | zone b" || got.Fence != fence || got.Owner != la.Lease().Owner() {
		t.Fatalf("Leader after Proclaim = %+v, %v; want value v2, fence %d, owner %q", got, err, fence, la.Lease().Owner())
	}
	if got := nextGoodLeader(t, seen); got.Value != "v2 | zone b" || got.Fence != fence {
		t.Fatalf("Observe after Proclaim = %+v, want v2 with fence %d", got, fence)
	}
	waitRenewals(t, la.Lease(), 2) // renewals keep the new value
	if err := la.Proclaim(t.Context(), "v3"); err != nil {
		t.Fatal(err)
	}
	if got, err := watcher.Leader(t.Context()); err != nil || got.Value != "v3" || got.Fence != fence {
		t.Fatalf("Leader after renewals and a second Proclaim = %+v, %v; want v3 with fence %d", got, err, fence)
	}
	s.Delete(t, name)
	if err := la.Proclaim(t.Context(), "v4"); !errors.Is(err, dlock.ErrNotHeld) {
		t.Fatalf("Proclaim after the leadership was deleted = %v, want ErrNotHeld", err)
	}
	if err := la.Err(); !errors.Is(err, dlock.ErrLost) {
		t.Fatalf("Err after Proclaim found the leadership gone = %v, want ErrLost", err)
	}

	// The driver: a late proclaim (lower Seq) changes nothing; another
	// grant's token or fence is not held.
	const raw = name + "/raw"
	res, err := backend.Acquire(t.Context(), driver.AcquireRequest{Key: raw, Token: "proclaim-token", Owner: "o0", TTL: 10 * time.Second})
	if err != nil || !res.Acquired {
		t.Fatalf("Acquire = %+v, %v", res, err)
	}
	req := driver.ProclaimRequest{Key: raw, Token: "proclaim-token", Fence: res.Fence, Owner: "o2", Seq: 2}
	for _, c := range []struct {
		what string
		req  driver.ProclaimRequest
		held bool
	}{
		{"seq 2", req, true},
		{"a late seq 1", withSeq(req, 1, "o1"), true},
		{"a resent seq 2", withSeq(req, 2, "o1"), true},
		{"another fence", driver.ProclaimRequest{Key: raw, Token: req.Token, Fence: res.Fence + 1, Owner: "ox", Seq: 9}, false},
		{"another token", driver.ProclaimRequest{Key: raw, Token: "other", Fence: res.Fence, Owner: "ox", Seq: 9}, false},
	} {
		if held, err := p.Proclaim(t.Context(), c.req); err != nil || held != c.held {
			t.Fatalf("Proclaim of %s = %v, %v; want held %v", c.what, held, err, c.held)
		}
	}
	if info, ok, err := backend.(driver.Inspector).Inspect(t.Context(), raw); err != nil || !ok || info.Owner != "o2" || info.Fence != res.Fence {
		t.Fatalf("Inspect after the proclaims = %+v, %v, %v; want owner o2 (seq 2), fence %d", info, ok, err, res.Fence)
	}
	if r, err := backend.Release(t.Context(), raw, req.Token); err != nil || !r.Held {
		t.Fatalf("Release = %+v, %v", r, err)
	}
	if held, err := p.Proclaim(t.Context(), withSeq(req, 3, "o3")); err != nil || held {
		t.Fatalf("Proclaim after Release = %v, %v; want not held", held, err)
	}
	noLeftoversWithin(t, s, 3*time.Second, name, raw)
}

// proclaimTTL is the leadership's TTL in testProclaim.
const proclaimTTL = 3 * time.Second

// waitRenewals waits until l was renewed n times (its deadline moved on),
// for as long as that takes, and fails if l ends first.
func waitRenewals(t *testing.T, l *dlock.Lease, n int) {
	t.Helper()
	last, seen := l.Deadline(), 0
	for limit := time.Now().Add(time.Minute); seen < n; time.Sleep(10 * time.Millisecond) {
		if err := l.Err(); err != nil {
			t.Fatalf("lease %q ended while renewed: %v", l.Name(), err)
		}
		if time.Now().After(limit) {
			t.Fatalf("lease %q renewed %d times in a minute, want %d", l.Name(), seen, n)
		}
		if d := l.Deadline(); d.After(last) {
			last, seen = d, seen+1
		}
	}
}

// nextGoodLeader returns the next value an Observe channel gives that is
// not a failed read (a read that took too long on a loaded machine).
func nextGoodLeader(t *testing.T, seen <-chan dlock.LeaderInfo) dlock.LeaderInfo {
	t.Helper()
	got := nextLeader(t, seen)
	for got.Err != nil {
		got = nextLeader(t, seen)
	}
	return got
}

// withSeq returns req with another Seq and Owner.
func withSeq(req driver.ProclaimRequest, seq uint64, owner string) driver.ProclaimRequest {
	req.Seq, req.Owner = seq, owner
	return req
}
