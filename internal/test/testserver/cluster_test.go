package testserver_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/test/testserver"
)

func TestClusterSpreadsSlotsOverPrimaries(t *testing.T) {
	t.Parallel()
	start := time.Now()
	c := testserver.StartCluster(t, 3)
	t.Logf("3-primary cluster ready in %v", time.Since(start))
	if c.Len() != 3 || len(c.Addrs()) != 3 {
		t.Fatalf("Len() = %d, Addrs() = %v, want 3 nodes", c.Len(), c.Addrs())
	}
	rdb := c.Client(t)
	ctx := t.Context()

	// Keys land on every node, and each is stored where NodeOf says.
	seen := make(map[int]int)
	for i := range 30 {
		key := fmt.Sprintf("k%d", i)
		if err := rdb.Set(ctx, key, "v", 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", key, err)
		}
		n := c.NodeOf(t, key)
		seen[n]++
		if got, err := c.Node(n).Client(t).Exists(ctx, key).Result(); err != nil || got != 1 {
			t.Errorf("EXISTS %s on node %d (which serves its slot) = %d, %v", key, n, got, err)
		}
	}
	if len(seen) != 3 {
		t.Errorf("30 keys on %d nodes (%v), want all 3", len(seen), seen)
	}
}

func TestClusterOneNode(t *testing.T) {
	t.Parallel()
	c := testserver.StartCluster(t, 1)
	rdb := c.Client(t)
	if err := rdb.Set(t.Context(), "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n := c.NodeOf(t, "k"); n != 0 {
		t.Errorf("NodeOf = %d, want 0", n)
	}
}

func TestClusterMoveSlotKeepsKeys(t *testing.T) {
	t.Parallel()
	c := testserver.StartCluster(t, 3)
	rdb := c.Client(t)
	ctx := t.Context()
	if err := rdb.Set(ctx, "{x}a", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, "{x}b", "2", 0).Err(); err != nil {
		t.Fatal(err)
	}
	from := c.NodeOf(t, "x")
	to := (from + 1) % 3
	c.MoveSlot(t, c.Slot(t, "x"), to)
	if got := c.NodeOf(t, "x"); got != to {
		t.Fatalf("after MoveSlot the slot is on node %d, want %d", got, to)
	}
	keys, err := c.Node(to).Client(t).Keys(ctx, "{x}*").Result()
	slices.Sort(keys)
	if err != nil || !slices.Equal(keys, []string{"{x}a", "{x}b"}) {
		t.Errorf("keys on the new node: %v, %v", keys, err)
	}
	// The Cluster client follows the MOVED redirection.
	if got, err := rdb.Get(ctx, "{x}b").Result(); err != nil || got != "2" {
		t.Errorf("GET through the cluster client = %q, %v", got, err)
	}
}

func TestClusterNodeRestart(t *testing.T) {
	t.Parallel()
	c := testserver.StartCluster(t, 3)
	rdb := c.Client(t)
	ctx := t.Context()
	n := c.NodeOf(t, "k")
	c.Node(n).Kill(t)
	c.Node(n).Start(t)
	c.WaitReady(t)
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Errorf("SET after the node came back: %v", err)
	}
}
