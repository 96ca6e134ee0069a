package testserver

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// numSlots is the number of hash slots of a Redis Cluster.
const numSlots = 16384

// defaultNodeTimeout is the cluster-node-timeout of the nodes StartCluster
// starts: short, so that a killed node is noticed within the few seconds a
// test waits, and long enough that a node slowed down by a loaded machine
// is not declared failed.
const defaultNodeTimeout = "3000"

// Cluster is a Redis Cluster of primaries without replicas, owned by one test.
type Cluster struct {
	nodes    []*Redis
	busPorts []int // each node's cluster bus port
}

// StartCluster starts a Redis Cluster of the given number of primaries
// (at least one), each a redis-server on free loopback ports (client and
// cluster bus) in a directory of its own, with the hash slots split evenly
// in ascending order of node index. It returns once every node reports
// cluster_state:ok and all nodes agree on the slot map. args are appended to
// every node's command line and override the defaults (for example
// "--cluster-node-timeout", "15000"). The nodes stop in t.Cleanup.
// It skips the test, or fails it under CI=true, when redis-server is missing.
//
// The cluster is formed with CLUSTER ADDSLOTSRANGE, SET-CONFIG-EPOCH and
// MEET, as redis-cli --cluster create does, without redis-cli's pauses of a
// second and its minimum of three primaries.
func StartCluster(t testing.TB, primaries int, args ...string) *Cluster {
	t.Helper()
	if primaries < 1 {
		t.Fatalf("StartCluster: %d primaries, want at least 1", primaries)
	}
	c := &Cluster{}
	for range primaries {
		bus := freePort(t)
		nodeArgs := []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", defaultNodeTimeout,
			// The default bus port, the client port + 10000, may be
			// above 65535 or taken.
			"--cluster-port", strconv.Itoa(bus),
		}
		n := StartRedis(t, append(nodeArgs, args...)...)
		c.nodes = append(c.nodes, n)
		c.busPorts = append(c.busPorts, n.ClusterPort()) // StartRedis may have moved it
	}

	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), readyTimeout)
	defer cancel()
	for i, n := range c.nodes {
		lo, hi := i*numSlots/primaries, (i+1)*numSlots/primaries-1
		err := withNode(n.Addr(), func(rdb *redis.Client) error {
			if err := rdb.ClusterAddSlotsRange(ctx, lo, hi).Err(); err != nil {
				return fmt.Errorf("CLUSTER ADDSLOTSRANGE %d %d: %w", lo, hi, err)
			}
			// Distinct epochs, so that no collision has to be resolved
			// before the slot map settles.
			if err := rdb.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
				return fmt.Errorf("CLUSTER SET-CONFIG-EPOCH: %w", err)
			}
			if i == 0 {
				return nil
			}
			host, port, _ := net.SplitHostPort(c.nodes[0].Addr())
			if err := rdb.Do(ctx, "CLUSTER", "MEET", host, port, c.busPorts[0]).Err(); err != nil {
				return fmt.Errorf("CLUSTER MEET: %w", err)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("form a cluster: node %s: %v", n.Addr(), err)
		}
	}
	c.WaitReady(t)
	return c
}

// Addrs returns the nodes' addresses, "127.0.0.1:PORT", in node order.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Len returns the number of nodes.
func (c *Cluster) Len() int { return len(c.nodes) }

// Node returns the i-th node, for example to Kill and Start it; after a
// Start, WaitReady waits until the cluster has taken it back.
func (c *Cluster) Node(i int) *Redis { return c.nodes[i] }

// Client returns a new go-redis Cluster client that knows every node, closed
// when the test ends (before the nodes stop).
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// Slot returns the hash slot of key, from CLUSTER KEYSLOT on the first node
// that answers.
func (c *Cluster) Slot(t testing.TB, key string) int {
	t.Helper()
	var slot int64
	c.anyNode(t, func(rdb *redis.Client) (err error) {
		slot, err = rdb.ClusterKeySlot(t.Context(), key).Result()
		return err
	})
	return int(slot)
}

// NodeOf returns the index of the node that serves key's hash slot, as the
// first node that answers sees the slot map.
func (c *Cluster) NodeOf(t testing.TB, key string) int {
	t.Helper()
	return c.nodeOfSlot(t, c.Slot(t, key))
}

// nodeOfSlot returns the index of the node that serves slot.
func (c *Cluster) nodeOfSlot(t testing.TB, slot int) int {
	t.Helper()
	var owner string
	c.anyNode(t, func(rdb *redis.Client) error {
		m, err := slotMap(t.Context(), rdb, rdb.Options().Addr)
		owner = m[slot]
		return err
	})
	i := slices.Index(c.Addrs(), owner)
	if i < 0 {
		t.Fatalf("slot %d is served by %q, not a node of the cluster", slot, owner)
	}
	return i
}

// anyNode runs fn on the nodes in order until it succeeds on one, and fails
// the test when it succeeds on none.
func (c *Cluster) anyNode(t testing.TB, fn func(rdb *redis.Client) error) {
	t.Helper()
	var errs []string
	for _, n := range c.nodes {
		err := withNode(n.Addr(), fn)
		if err == nil {
			return
		}
		errs = append(errs, n.Addr()+": "+err.Error())
	}
	t.Fatalf("no node of the cluster answered: %s", strings.Join(errs, "; "))
}

// MoveSlot moves hash slot slot, with its keys, to node to, as
// redis-cli --cluster reshard does (IMPORTING, MIGRATING, MIGRATE, NODE),
// and waits until every node agrees on the new slot map.
func (c *Cluster) MoveSlot(t testing.TB, slot int, to int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), readyTimeout)
	defer cancel()
	ids := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		err := withNode(n.Addr(), func(rdb *redis.Client) error {
			id, err := rdb.ClusterMyID(ctx).Result()
			ids[i] = id
			return err
		})
		if err != nil {
			t.Fatalf("move slot %d: node %s: %v", slot, n.Addr(), err)
		}
	}
	from := c.nodeOfSlot(t, slot)
	if from == to {
		return
	}
	src, dst := c.nodes[from], c.nodes[to]
	step := func(n *Redis, what string, fn func(rdb *redis.Client) error) {
		t.Helper()
		if err := withNode(n.Addr(), fn); err != nil {
			t.Fatalf("move slot %d from %s to %s: %s on %s: %v", slot, src.Addr(), dst.Addr(), what, n.Addr(), err)
		}
	}
	setSlot := func(rdb *redis.Client, state, id string) error {
		return rdb.Do(ctx, "CLUSTER", "SETSLOT", slot, state, id).Err()
	}
	step(dst, "IMPORTING", func(rdb *redis.Client) error { return setSlot(rdb, "IMPORTING", ids[from]) })
	step(src, "MIGRATING", func(rdb *redis.Client) error { return setSlot(rdb, "MIGRATING", ids[to]) })
	step(src, "MIGRATE", func(rdb *redis.Client) error {
		host, port, _ := net.SplitHostPort(dst.Addr())
		for {
			keys, err := rdb.ClusterGetKeysInSlot(ctx, slot, 100).Result()
			if err != nil || len(keys) == 0 {
				return err
			}
			args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
			for _, k := range keys {
				args = append(args, k)
			}
			if err := rdb.Do(ctx, args...).Err(); err != nil {
				return err
			}
		}
	})
	// The new owner first, which bumps its epoch so that the others accept
	// its claim; then the old owner; then the rest, to spare the gossip.
	order := []int{to, from}
	for i := range c.nodes {
		if i != to && i != from {
			order = append(order, i)
		}
	}
	for _, i := range order {
		step(c.nodes[i], "NODE", func(rdb *redis.Client) error { return setSlot(rdb, "NODE", ids[to]) })
	}
	c.WaitReady(t)
}

// clusterReadyTimeout bounds WaitReady. A node that restarts is back in
// the cluster after its rejoin delay (about 3 s on a quiet machine); one
// that a loaded machine kept down past the node timeout (3 s) was flagged
// failed by the others, who clear the flag only twice the node timeout
// after it answers again, which took a restart past 10 s.
const clusterReadyTimeout = 30 * time.Second

// WaitReady waits until every node reports cluster_state:ok, knows every
// other node and has the same slot map, covering every slot with nodes of
// this cluster. It fails the test after clusterReadyTimeout, with what each
// node said.
func (c *Cluster) WaitReady(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), clusterReadyTimeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		err := c.ready(ctx)
		if err == nil {
			return
		}
		if ctx.Err() == nil || last == nil {
			last = err
		}
		select {
		case <-ctx.Done():
			t.Fatalf("Redis Cluster %v not ready after %v: %v", c.Addrs(), clusterReadyTimeout, last)
		case <-tick.C:
		}
	}
}

// ready checks once what WaitReady waits for.
func (c *Cluster) ready(ctx context.Context) error {
	var first map[int]string
	addrs := c.Addrs()
	for _, n := range c.nodes {
		err := withNode(n.Addr(), func(rdb *redis.Client) error {
			info, err := rdb.ClusterInfo(ctx).Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok\r\n") {
				return fmt.Errorf("cluster_state is not ok")
			}
			if want := fmt.Sprintf("cluster_known_nodes:%d\r\n", len(c.nodes)); !strings.Contains(info, want) {
				return fmt.Errorf("not %s", strings.TrimSpace(want))
			}
			m, err := slotMap(ctx, rdb, n.Addr())
			if err != nil {
				return err
			}
			if len(m) != numSlots {
				return fmt.Errorf("%d slots served, want %d", len(m), numSlots)
			}
			for slot, addr := range m {
				if !slices.Contains(addrs, addr) {
					return fmt.Errorf("slot %d served by %s, not a node of the cluster", slot, addr)
				}
			}
			if first == nil {
				first = m
			} else if !maps.Equal(first, m) {
				return fmt.Errorf("slot map differs from %s's", c.nodes[0].Addr())
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("node %s: %w", n.Addr(), err)
		}
	}
	return nil
}

// slotMap returns the address of the master of each slot, as the node of
// rdb, at addr, sees it. A node that has not yet learned its own IP address
// from a peer (any node of a one-node cluster) leaves it empty.
func slotMap(ctx context.Context, rdb *redis.Client, addr string) (map[int]string, error) {
	host, _, _ := net.SplitHostPort(addr)
	shards, err := rdb.ClusterShards(ctx).Result()
	if err != nil {
		return nil, err
	}
	m := make(map[int]string, numSlots)
	for _, sh := range shards {
		for _, n := range sh.Nodes {
			if n.Role != "master" {
				continue
			}
			ip := n.IP
			if ip == "" {
				ip = host
			}
			a := net.JoinHostPort(ip, strconv.FormatInt(n.Port, 10))
			for _, r := range sh.Slots {
				for s := r.Start; s <= r.End; s++ {
					m[int(s)] = a
				}
			}
		}
	}
	return m, nil
}

// withNode runs fn with a client of its own for the node at addr, one that
// does not retry, so that a node that is down fails fast.
func withNode(addr string, fn func(rdb *redis.Client) error) error {
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second})
	defer rdb.Close()
	return fn(rdb)
}
