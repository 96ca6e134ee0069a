package etcdlock_test

import (
	"testing"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/test/testserver"
)

// A renewal tied to a grant (RenewGrant) does not extend, or report as
// held, a newer grant of the same token: an owner ID shared by processes,
// whose first grant expired on the store before another process of the
// owner was granted the lock.
func TestRenewGrantOtherGrantOfToken(t *testing.T) {
	srv := testserver.StartEtcd(t)
	admin := srv.Client(t)
	a, b := etcdlock.New(srv.Client(t)), etcdlock.New(srv.Client(t))
	req := driver.AcquireRequest{Key: "k", Token: "owner", Owner: "shared owner", TTL: hoTTL, Reentrant: true}
	first, err := a.Acquire(t.Context(), req)
	if err != nil || !first.Acquired {
		t.Fatal(first, err)
	}
	// The first grant expires on the store.
	if _, err := admin.Delete(t.Context(), "dlock/k\x00e"); err != nil {
		t.Fatal(err)
	}
	second, err := b.Acquire(t.Context(), req)
	if err != nil || !second.Acquired || second.Fence <= first.Fence {
		t.Fatalf("the second grant: %+v, %v", second, err)
	}
	if held, err := a.RenewGrant(t.Context(), "k", "owner", first.Fence, hoTTL); err != nil || held {
		t.Fatalf("RenewGrant of the expired first grant: %v, %v; want not held", held, err)
	}
	r := a.RenewBatch(t.Context(), []driver.RenewRequest{{Key: "k", Token: "owner", TTL: hoTTL, Fence: first.Fence}})
	if r[0].Err != nil || r[0].Held {
		t.Fatalf("RenewBatch with the first grant's fence: %+v; want not held", r[0])
	}
	if held, err := b.RenewGrant(t.Context(), "k", "owner", second.Fence, hoTTL); err != nil || !held {
		t.Fatalf("RenewGrant of the second grant: %v, %v; want held", held, err)
	}
	if res, err := b.ReleaseGrant(t.Context(), "k", "owner", second.Fence); err != nil || !res.Held {
		t.Fatalf("release: %+v, %v", res, err)
	}
}

// A renewal that moves its grant onto a lease of its own (here the grant
// is on another Backend's lease: an owner ID shared by processes) keeps
// it when a proclaim rewrote the grant's owner between the renewal's read
// and its move: the grant, its token and fence, is the same.
func TestRenewMoveAfterProclaimKeepsGrant(t *testing.T) {
	srv := testserver.StartEtcd(t)
	a, b := etcdlock.New(srv.Client(t)), etcdlock.New(srv.Client(t))
	res, err := a.Acquire(t.Context(), driver.AcquireRequest{Key: "k", Token: "owner", Owner: "o1", TTL: hoTTL, Reentrant: true})
	if err != nil || !res.Acquired {
		t.Fatal(res, err)
	}
	etcdlock.BeforeFirstLeaseGrant(b, func() {
		// b's renewal read the grant on a's lease, and now grants a lease
		// to move it onto.
		req := driver.ProclaimRequest{Key: "k", Token: "owner", Fence: res.Fence, Owner: "o2", Seq: 1}
		if held, err := a.Proclaim(t.Context(), req); err != nil || !held {
			t.Errorf("Proclaim = %v, %v; want held", held, err)
		}
	})
	if held, err := b.RenewGrant(t.Context(), "k", "owner", res.Fence, hoTTL); err != nil || !held {
		t.Fatalf("RenewGrant that moves the grant after a proclaim = %v, %v; want held", held, err)
	}
	info, ok, err := b.Inspect(t.Context(), "k")
	if err != nil || !ok || info.Owner != "o2" || info.Fence != res.Fence {
		t.Fatalf("Inspect after the move = %+v, %v, %v; want owner o2, fence %d", info, ok, err, res.Fence)
	}
	if r, err := b.ReleaseGrant(t.Context(), "k", "owner", res.Fence); err != nil || !r.Held {
		t.Fatalf("release: %+v, %v", r, err)
	}
}
