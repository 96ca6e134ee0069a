package testserver_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/test/testserver"
)

// TestSentinelFailoverAndCrash walks a SentinelSet through a manual
// failover, a crash of the primary and a recovery, checking the roles the
// helpers report against the nodes themselves and that a failover client
// follows.
func TestSentinelFailoverAndCrash(t *testing.T) {
	start := time.Now()
	set := testserver.StartSentinel(t)
	t.Logf("StartSentinel took %v", time.Since(start).Round(time.Millisecond))
	ctx := t.Context()
	if got := set.MasterName(); got != testserver.SentinelMaster {
		t.Errorf("MasterName = %q", got)
	}
	if n := len(set.SentinelAddrs()); n != 3 {
		t.Fatalf("%d sentinels, want 3", n)
	}
	first, replica := set.Primary(t), set.Replica(t)
	if first != set.Nodes()[0] || replica != set.Nodes()[1] {
		t.Fatalf("Primary %s, Replica %s; want the first node as the primary", first.Addr(), replica.Addr())
	}
	rdb := set.Client(t)
	// WAIT 1: the write reached the replica, so it survives the failover.
	if err := rdb.Set(ctx, "k", "v1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := rdb.Wait(ctx, 1, 5*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v", n, err)
	}

	start = time.Now()
	set.Failover(t)
	t.Logf("SENTINEL FAILOVER done in %v", time.Since(start).Round(time.Millisecond))
	if got := set.Primary(t); got != replica {
		t.Fatalf("after Failover the primary is %s, want %s", got.Addr(), replica.Addr())
	}
	if got := set.Replica(t); got != first {
		t.Fatalf("after Failover the replica is %s, want %s", got.Addr(), first.Addr())
	}
	if role, err := first.Client(t).Do(ctx, "ROLE").Slice(); err != nil || role[0] != "slave" {
		t.Fatalf("old primary's ROLE = %v, %v; want slave", role, err)
	}
	if got, err := rdb.Get(ctx, "k").Result(); err != nil || got != "v1" {
		t.Fatalf("GET after Failover = %q, %v; want v1", got, err)
	}
	if err := rdb.Set(ctx, "k", "v2", 0).Err(); err != nil {
		t.Fatalf("SET through the failover client after Failover: %v", err)
	}
	if n, err := rdb.Wait(ctx, 1, 5*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 after Failover = %d, %v", n, err)
	}

	start = time.Now()
	set.KillPrimary(t)
	t.Logf("failover after SIGKILL done in %v", time.Since(start).Round(time.Millisecond))
	if got := set.Primary(t); got != first {
		t.Fatalf("after KillPrimary the primary is %s, want %s", got.Addr(), first.Addr())
	}
	got, err := rdb.Get(ctx, "k").Result()
	for i := 0; err != nil && i < 50; i++ { // the client may still dial the dead node once
		time.Sleep(100 * time.Millisecond)
		got, err = rdb.Get(ctx, "k").Result()
	}
	if err != nil || got != "v2" {
		t.Fatalf("GET after KillPrimary = %q, %v; want v2", got, err)
	}

	start = time.Now()
	set.Recover(t)
	t.Logf("Recover done in %v", time.Since(start).Round(time.Millisecond))
	// Recover follows a further failover on a loaded machine (see
	// SentinelSet.Recover): the replica is then the other node, but it
	// must still be the node that is not the primary, replicating it.
	rep, primary := set.Replica(t), set.Primary(t)
	if rep == primary {
		t.Fatalf("after Recover the replica %s is also the primary", rep.Addr())
	}
	if rep != replica {
		t.Logf("after Recover the sentinels had failed over once more: replica %s, primary %s", rep.Addr(), primary.Addr())
	}
	if n, err := rdb.Wait(ctx, 1, 5*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 after Recover = %d, %v", n, err)
	}

	set.Kill(t)
	for _, n := range set.Nodes() {
		c := redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1, DialerRetries: 1})
		err := c.Ping(ctx).Err()
		_ = c.Close()
		if err == nil {
			t.Errorf("node %s answers after Kill", n.Addr())
		}
	}
}
