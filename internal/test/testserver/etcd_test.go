package testserver_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/test/testserver"
)

func TestEtcdKeepsDataAcrossRestarts(t *testing.T) {
	srv := testserver.StartEtcd(t)
	c := srv.Client(t)
	put(t, c.KV.Put, "k", "1")
	srv.Stop(t, 0)
	srv.Stop(t, 0) // idempotent
	srv.Start(t, 0)
	srv.Kill(t, 0)
	srv.Kill(t, 0) // idempotent
	srv.Start(t, 0)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, "k")
	if err != nil {
		t.Fatalf("get after a clean stop and a crash: %v", err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "1" {
		t.Fatalf("after a clean stop and a crash: %v, want k=1", resp.Kvs)
	}
}

// A 3-member cluster survives the loss of its leader and of a paused member,
// and comes back whole after a restart of every member.
func TestEtcdClusterFailover(t *testing.T) {
	srv := testserver.StartEtcdCluster(t, 3)
	if srv.Members() != 3 || len(srv.Endpoints()) != 3 {
		t.Fatalf("members %d, endpoints %v", srv.Members(), srv.Endpoints())
	}
	c := srv.Client(t)
	put(t, c.KV.Put, "k", "1")

	leader := srv.Leader(t)
	srv.Kill(t, leader)
	if next := srv.Leader(t); next == leader {
		t.Fatalf("member %d still leader after it was killed", leader)
	}
	put(t, c.KV.Put, "k", "2") // a majority is up
	srv.Start(t, leader)

	paused := srv.Leader(t)
	srv.Pause(t, paused) // the leader: the others elect a new one
	put(t, c.KV.Put, "k", "3")
	srv.Resume(t, paused)

	srv.KillAll(t)
	srv.StartAll(t)
	// Each member, asked alone, has the last write.
	for i := range 3 {
		one := srv.ClientOf(t, srv.Endpoint(i))
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		resp, err := one.Get(ctx, "k")
		cancel()
		if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "3" {
			t.Errorf("member %d after a full restart: %v, %v; want k=3", i, resp, err)
		}
	}
}

// put writes k=v, trying again for 10s: a write in flight when the leader
// goes away fails with "request timed out" rather than wait for the next.
func put[R any, O any](t *testing.T, fn func(context.Context, string, string, ...O) (R, error), k, v string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		_, err := fn(ctx, k, v)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("put %s=%s: %v", k, v, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A member cut off through its proxies loses its part in the cluster: the
// other two elect a leader among themselves and keep taking writes; healed,
// it catches up.
func TestEtcdPartition(t *testing.T) {
	srv := testserver.StartEtcdClusterProxied(t, 3)
	c := srv.Client(t)
	put(t, c.KV.Put, "k", "1")
	cut := srv.Leader(t)
	srv.Partition(t, cut)
	var others []string
	for i := range 3 {
		if i != cut {
			others = append(others, srv.Endpoint(i))
		}
	}
	put(t, srv.ClientOf(t, others...).KV.Put, "k", "2")
	if leader := srv.Leader(t); leader == cut {
		// It may still think so; the others must have another.
		t.Logf("member %d still reports itself leader while cut off", cut)
	}
	srv.Heal(t, cut)
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		resp, err := srv.ClientOf(t, srv.Endpoint(cut)).Get(ctx, "k")
		cancel()
		if err == nil && len(resp.Kvs) == 1 && string(resp.Kvs[0].Value) == "2" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("member %d after the partition healed: %v, %v; want k=2", cut, resp, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
