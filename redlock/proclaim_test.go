package redlock_test

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/redislock"
)

// TestProclaimMinorityNotReported checks that a new owner that reached
// fewer than a quorum of nodes (a Proclaim cut short) is not what Inspect
// reports: the owner a quorum holds is, and once a quorum has the new
// owner, that one is.
func TestProclaimMinorityNotReported(t *testing.T) {
	servers := startNodes(t, 3)
	b := newBackend(t, servers)
	req := request(t, "minority", 10*time.Second)
	res := mustAcquire(t, b, req)
	nodes := admins(t, servers)
	proclaim := driver.ProclaimRequest{Key: req.Key, Token: req.Token, Fence: res.Fence, Owner: "new owner", Seq: 1}

	if held, err := redislock.New(nodes[0]).Proclaim(t.Context(), proclaim); err != nil || !held {
		t.Fatalf("Proclaim on node 0 = %v, %v; want held", held, err)
	}
	info, ok, err := b.Inspect(t.Context(), req.Key)
	if err != nil || !ok || info.Owner != req.Owner || info.Fence != res.Fence {
		t.Fatalf("Inspect after a proclaim on one node of 3 = %+v, %v, %v; want the quorum's owner %q", info, ok, err, req.Owner)
	}

	if held, err := redislock.New(nodes[1]).Proclaim(t.Context(), proclaim); err != nil || !held {
		t.Fatalf("Proclaim on node 1 = %v, %v; want held", held, err)
	}
	info, ok, err = b.Inspect(t.Context(), req.Key)
	if err != nil || !ok || info.Owner != "new owner" || info.Fence != res.Fence {
		t.Fatalf("Inspect after a proclaim on a quorum = %+v, %v, %v; want %q", info, ok, err, "new owner")
	}
	mustRelease(t, b, req.Key, req.Token)
}
