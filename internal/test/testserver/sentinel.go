package testserver

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMaster is the name under which a SentinelSet's sentinels monitor
// its primary.
const SentinelMaster = "mymaster"

// Sentinel timings, short so that tests fail over in seconds. A sentinel
// thinks the primary is down after sentinelDownAfter without an answer;
// a failover that stalls is abandoned after sentinelFailoverTimeout and
// tried again after twice that.
const (
	sentinelDownAfter       = time.Second
	sentinelFailoverTimeout = 2 * time.Second
)

// failoverTimeout bounds how long the helpers wait for a failover, a
// recovery or the first agreement of the sentinels. Sentinels greet each
// other every 2s and elections may need a second round after
// 2*sentinelFailoverTimeout, so this is generous.
const failoverTimeout = 30 * time.Second

// replicaArgs are given to both data nodes, since either may become the
// primary: a replica that (re)connects is served at once, without the
// 5-second wait of Redis 7's diskless sync.
var replicaArgs = []string{"--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"}

// SentinelSet is a Redis primary, one replica and three redis-sentinel
// processes watching them (quorum 2), all on free loopback ports in
// temporary directories and all owned by one test. Which node is the primary
// changes with Failover and KillPrimary; ask Primary and Replica.
type SentinelSet struct {
	nodes     [2]*Redis
	sentinels []*sentinelProcess
}

type sentinelProcess struct {
	port int
	proc process
}

func (s *sentinelProcess) addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// StartSentinel starts a primary, a replica of it and three sentinels that
// monitor the primary as SentinelMaster with quorum 2, a down-after of 1s
// and a failover-timeout of 2s, and waits until every sentinel sees the
// primary, the replica and the two other sentinels. Everything is killed in
// t.Cleanup. It skips the test, or fails it under CI=true, when redis-server
// is missing.
func StartSentinel(t testing.TB) *SentinelSet {
	t.Helper()
	bin := RequireBinary(t, "redis-server")
	primary := StartRedis(t, replicaArgs...)
	replica := StartRedis(t, replicaOfArgs(primary.Addr())...)
	s := &SentinelSet{nodes: [2]*Redis{primary, replica}}
	s.waitReplicating(t, replica, primary)

	host, port, _ := net.SplitHostPort(primary.Addr())
	for range 3 {
		dir := t.TempDir()
		sp := &sentinelProcess{port: freePort(t)}
		conf := filepath.Join(dir, "sentinel.conf")
		text := strings.Join([]string{
			"port " + strconv.Itoa(sp.port),
			"bind 127.0.0.1",
			"protected-mode no",
			"daemonize no",
			`logfile ""`,
			"dir " + dir,
			fmt.Sprintf("sentinel monitor %s %s %s 2", SentinelMaster, host, port),
			fmt.Sprintf("sentinel down-after-milliseconds %s %d", SentinelMaster, sentinelDownAfter.Milliseconds()),
			fmt.Sprintf("sentinel failover-timeout %s %d", SentinelMaster, sentinelFailoverTimeout.Milliseconds()),
			fmt.Sprintf("sentinel parallel-syncs %s 1", SentinelMaster),
			"",
		}, "\n")
		// Sentinel rewrites its configuration file as it learns, so each
		// gets a file of its own in a directory it may write.
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		sp.proc = process{
			name: "redis-sentinel on " + sp.addr(),
			log:  filepath.Join(dir, "sentinel.log"),
			cmd:  func() *exec.Cmd { return exec.Command(bin, conf, "--sentinel") },
		}
		// Registered after TempDir, so it runs first.
		t.Cleanup(func() { sp.proc.stop(syscall.SIGKILL) })
		sp.proc.start(t, func() error { return ping(sp.addr()) })
		s.sentinels = append(s.sentinels, sp)
	}
	s.waitUntil(t, "the sentinels to see the primary, the replica and each other", func(ctx context.Context) error {
		return s.checkSentinels(ctx, primary.Addr(), replica.Addr(), true)
	})
	return s
}

// replicaOfArgs returns the command line of a data node that replicates
// primary.
func replicaOfArgs(primary string) []string {
	host, port, _ := net.SplitHostPort(primary)
	return append(slices.Clone(replicaArgs), "--replicaof", host, port)
}

// MasterName returns the name under which the sentinels know the primary,
// SentinelMaster.
func (s *SentinelSet) MasterName() string { return SentinelMaster }

// SentinelAddrs returns the addresses of the three sentinels.
func (s *SentinelSet) SentinelAddrs() []string {
	addrs := make([]string, len(s.sentinels))
	for i, sp := range s.sentinels {
		addrs[i] = sp.addr()
	}
	return addrs
}

// FailoverOptions returns go-redis options for a failover client of the
// set, for callers that want to change some before redis.NewFailoverClient.
func (s *SentinelSet) FailoverOptions() *redis.FailoverOptions {
	return &redis.FailoverOptions{MasterName: SentinelMaster, SentinelAddrs: s.SentinelAddrs()}
}

// Client returns a new go-redis failover client of the set, which asks the
// sentinels for the primary and follows failovers. It is closed when the
// test ends, before the servers stop.
func (s *SentinelSet) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewFailoverClient(s.FailoverOptions())
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Nodes returns the two data nodes, the first started as the primary.
func (s *SentinelSet) Nodes() []*Redis { return s.nodes[:] }

// Primary returns the node that a majority of the sentinels name as the
// primary now, waiting while they disagree (during a failover). It fails
// the test when they do not agree within the failover timeout.
func (s *SentinelSet) Primary(t testing.TB) *Redis {
	t.Helper()
	var primary *Redis
	s.waitUntil(t, "a majority of the sentinels to name the primary", func(ctx context.Context) error {
		votes := make(map[string]int)
		for _, sp := range s.sentinels {
			if addr, err := s.askPrimary(ctx, sp); err == nil {
				votes[addr]++
			}
		}
		for addr, n := range votes {
			if n > len(s.sentinels)/2 {
				primary = s.node(addr)
				if primary == nil {
					return fmt.Errorf("the sentinels name %s, which is not a node of the set", addr)
				}
				return nil
			}
		}
		return fmt.Errorf("no majority: %v", votes)
	})
	return primary
}

// Replica returns the data node that is not the Primary. It may be down
// (after KillPrimary, before Recover).
func (s *SentinelSet) Replica(t testing.TB) *Redis {
	t.Helper()
	return s.other(s.Primary(t))
}

// Failover asks a sentinel for a failover (SENTINEL FAILOVER), retrying
// while one is in progress or the replica is not yet good enough, and waits
// until every sentinel names the replica as the new primary. It then makes
// the old primary a replica of the new one itself (Sentinel would only do so
// some 10 to 20 seconds later; until then the old primary still takes writes
// from clients that have not heard of the switch) and waits until it
// replicates and every sentinel lists it as a healthy replica.
func (s *SentinelSet) Failover(t testing.TB) {
	t.Helper()
	old := s.Primary(t)
	next := s.other(old)
	s.waitUntil(t, "a sentinel to start a failover", func(ctx context.Context) error {
		sc := s.sentinelClient(s.sentinels[0])
		defer sc.Close()
		return sc.Failover(ctx, SentinelMaster).Err()
	})
	s.waitSwitched(t, next)
	s.Recover(t)
}

// KillPrimary kills the primary with SIGKILL, as a crash would, and waits
// until the sentinels have noticed, agreed and promoted the replica, and
// every sentinel names it. The old primary stays down; Recover restarts it
// as a replica.
func (s *SentinelSet) KillPrimary(t testing.TB) {
	t.Helper()
	old := s.Primary(t)
	next := s.other(old)
	old.Kill(t)
	s.waitSwitched(t, next)
}

// Recover makes the node that is not the primary a healthy replica of it:
// it restarts the node when it is down (empty, as after a crash without
// persistence), points it at the primary when it is not yet replicating it,
// and waits until the link is up and every sentinel lists it as a replica
// that is not down.
func (s *SentinelSet) Recover(t testing.TB) {
	t.Helper()
	primary := s.Primary(t)
	replica := s.other(primary)
	replica.mu.Lock()
	running := replica.exited != nil
	replica.args = replicaOfArgs(primary.Addr())
	replica.mu.Unlock()
	if !running {
		replica.Start(t)
	} else {
		c := redis.NewClient(&redis.Options{Addr: replica.Addr()})
		host, port, _ := net.SplitHostPort(primary.Addr())
		err := c.Do(t.Context(), "REPLICAOF", host, port).Err()
		_ = c.Close()
		if err != nil {
			t.Fatalf("REPLICAOF %s on %s: %v", primary.Addr(), replica.Addr(), err)
		}
	}
	s.waitReplicating(t, replica, primary)
	finalP, finalR := primary, replica
	s.waitUntil(t, "the sentinels to see the replica", func(ctx context.Context) error {
		p, r := primary, replica
		// On a loaded machine the primary can look down long enough for
		// the sentinels to fail over once more meanwhile: follow them.
		if addr, err := s.askPrimary(ctx, s.sentinels[0]); err == nil && addr != p.Addr() {
			if n := s.node(addr); n != nil {
				p, r = n, s.other(n)
			}
		}
		finalP, finalR = p, r
		return s.checkSentinels(ctx, p.Addr(), r.Addr(), false)
	})
	if finalP != primary {
		// The sentinels reconfigure the old primary as a replica of the
		// new one in their own time: wait until it replicates.
		s.waitReplicating(t, finalR, finalP)
	}
}

// Kill kills both data nodes and the three sentinels, so that the set stops
// answering for good.
func (s *SentinelSet) Kill(t testing.TB) {
	t.Helper()
	for _, sp := range s.sentinels {
		sp.proc.stop(syscall.SIGKILL)
	}
	for _, n := range s.nodes {
		n.Kill(t)
	}
}

// waitSwitched waits until every sentinel names next as the primary and next
// says it is one.
func (s *SentinelSet) waitSwitched(t testing.TB, next *Redis) {
	t.Helper()
	s.waitUntil(t, "the sentinels to promote "+next.Addr(), func(ctx context.Context) error {
		for _, sp := range s.sentinels {
			addr, err := s.askPrimary(ctx, sp)
			if err != nil {
				return err
			}
			if addr != next.Addr() {
				return fmt.Errorf("sentinel %s names %s", sp.addr(), addr)
			}
		}
		info, err := nodeInfo(ctx, next.Addr())
		if err != nil {
			return err
		}
		if info["role"] != "master" {
			return fmt.Errorf("%s is still a %s", next.Addr(), info["role"])
		}
		return nil
	})
}

// waitReplicating waits until replica's link to primary is up and primary
// counts it.
func (s *SentinelSet) waitReplicating(t testing.TB, replica, primary *Redis) {
	t.Helper()
	s.waitUntil(t, replica.Addr()+" to replicate "+primary.Addr(), func(ctx context.Context) error {
		info, err := nodeInfo(ctx, replica.Addr())
		if err != nil {
			return err
		}
		host, port, _ := net.SplitHostPort(primary.Addr())
		if info["role"] != "slave" || info["master_host"] != host || info["master_port"] != port || info["master_link_status"] != "up" {
			return fmt.Errorf("replica reports role %s of %s:%s, link %s", info["role"], info["master_host"], info["master_port"], info["master_link_status"])
		}
		pinfo, err := nodeInfo(ctx, primary.Addr())
		if err != nil {
			return err
		}
		if pinfo["connected_slaves"] != "1" {
			return fmt.Errorf("primary counts %s replicas", pinfo["connected_slaves"])
		}
		return nil
	})
}

// checkSentinels reports whether every sentinel sees primary as a master
// that is up and replica as a replica of it that is up. When initial is set
// it also wants the two other sentinels seen and the replica's link reported
// up; later a sentinel asks a replica for INFO only every 10s (every second
// once the primary is down, in time for a failover), so its view of the link
// may lag that long.
func (s *SentinelSet) checkSentinels(ctx context.Context, primary, replica string, initial bool) error {
	for _, sp := range s.sentinels {
		sc := s.sentinelClient(sp)
		err := func() error {
			m, err := sc.Master(ctx, SentinelMaster).Result()
			if err != nil {
				return err
			}
			if got := net.JoinHostPort(m["ip"], m["port"]); got != primary || m["flags"] != "master" {
				return fmt.Errorf("master is %s, flags %s", got, m["flags"])
			}
			if initial && m["num-other-sentinels"] != strconv.Itoa(len(s.sentinels)-1) {
				return fmt.Errorf("sees %s other sentinels", m["num-other-sentinels"])
			}
			replicas, err := sc.Replicas(ctx, SentinelMaster).Result()
			if err != nil {
				return err
			}
			for _, r := range replicas {
				if net.JoinHostPort(r["ip"], r["port"]) == replica {
					if r["flags"] != "slave" || initial && r["master-link-status"] != "ok" {
						return fmt.Errorf("replica %s has flags %s, link %s", replica, r["flags"], r["master-link-status"])
					}
					return nil
				}
			}
			return fmt.Errorf("does not list replica %s", replica)
		}()
		_ = sc.Close()
		if err != nil {
			return fmt.Errorf("sentinel %s: %w", sp.addr(), err)
		}
	}
	return nil
}

// askPrimary asks one sentinel for the primary's address.
func (s *SentinelSet) askPrimary(ctx context.Context, sp *sentinelProcess) (string, error) {
	sc := s.sentinelClient(sp)
	defer sc.Close()
	hp, err := sc.GetMasterAddrByName(ctx, SentinelMaster).Result()
	if err != nil {
		return "", fmt.Errorf("sentinel %s: %w", sp.addr(), err)
	}
	if len(hp) != 2 {
		return "", fmt.Errorf("sentinel %s: GET-MASTER-ADDR-BY-NAME = %v", sp.addr(), hp)
	}
	return net.JoinHostPort(hp[0], hp[1]), nil
}

// sentinelClient returns a client of one sentinel that gives up quickly, so
// that a dead sentinel does not stall the polling.
func (s *SentinelSet) sentinelClient(sp *sentinelProcess) *redis.SentinelClient {
	return redis.NewSentinelClient(&redis.Options{
		Addr:        sp.addr(),
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
		MaxRetries: -1,
	})
}

// node returns the data node at addr, or nil.
func (s *SentinelSet) node(addr string) *Redis {
	for _, n := range s.nodes {
		if n.Addr() == addr {
			return n
		}
	}
	return nil
}

// other returns the data node that is not n.
func (s *SentinelSet) other(n *Redis) *Redis {
	if s.nodes[0] == n {
		return s.nodes[1]
	}
	return s.nodes[0]
}

// waitUntil calls check every 50ms until it succeeds, and fails the test
// with check's last error after failoverTimeout.
func (s *SentinelSet) waitUntil(t testing.TB, what string, check func(ctx context.Context) error) {
	t.Helper()
	deadline := time.Now().Add(failoverTimeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := check(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s: %v", failoverTimeout, what, err)
		}
		<-tick.C
	}
}

// nodeInfo returns the replication section of INFO of the data node at
// addr, as field → value.
func nodeInfo(ctx context.Context, addr string) (map[string]string, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, MaxRetries: -1})
	defer c.Close()
	text, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return nil, fmt.Errorf("INFO on %s: %w", addr, err)
	}
	info := make(map[string]string)
	for _, line := range strings.Split(text, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			info[k] = v
		}
	}
	return info, nil
}
