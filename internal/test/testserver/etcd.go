package testserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Etcd is an etcd cluster owned by one test: one member (StartEtcd) or
// several (StartEtcdCluster), each an etcd process with a data directory of
// its own, on free loopback ports. Members keep their data across Stop,
// Kill and Start, as a real member keeps it across a restart.
type Etcd struct {
	members []*etcdMember
	// With StartEtcdClusterProxied: a proxy in front of each member's peer
	// URL and one in front of its client URL, by member.
	peerProxies, clientProxies []*Proxy
}

// etcdMember is one etcd process of a cluster.
type etcdMember struct {
	name       string
	clientPort int
	peerPort   int
	dir        string
	proc       process
}

// etcdHeartbeat and etcdElection are the members' Raft timings (the
// defaults are 100ms and 1s): short, so that a test that kills the leader
// sees a new one within a second, and long enough for two busy cores under
// the race detector not to cause elections by themselves.
const (
	etcdHeartbeat = 100 * time.Millisecond
	etcdElection  = 600 * time.Millisecond
)

// StartEtcd starts a fresh single-member etcd cluster in t.TempDir() and
// stops it in t.Cleanup. It skips the test, or fails it under CI=true, when
// etcd (Debian's etcd-server package) is missing.
func StartEtcd(t testing.TB) *Etcd {
	t.Helper()
	return StartEtcdCluster(t, 1)
}

// StartEtcdCluster starts a fresh etcd cluster of n members, each on free
// loopback ports in a directory of its own under t.TempDir(), waits until
// every member answers through an elected leader, and stops them all in
// t.Cleanup.
func StartEtcdCluster(t testing.TB, n int) *Etcd {
	t.Helper()
	return startEtcd(t, n, false)
}

// StartEtcdClusterProxied is StartEtcdCluster with a toxiproxy in front of
// every member's peer URL (the members reach each other through them) and
// client URL (Endpoints are the proxies), so that Partition can cut a
// member off from the others and from the clients.
func StartEtcdClusterProxied(t testing.TB, n int) *Etcd {
	t.Helper()
	return startEtcd(t, n, true)
}

func startEtcd(t testing.TB, n int, proxied bool) *Etcd {
	t.Helper()
	bin := findBinary(t, "etcd", "/usr/bin", "/usr/local/bin")
	if n < 1 {
		t.Fatalf("StartEtcdCluster: %d members", n)
	}
	dir := t.TempDir()
	e := &Etcd{}
	for i := range n {
		m := &etcdMember{
			name:       "m" + strconv.Itoa(i),
			clientPort: freePort(t),
			peerPort:   freePort(t),
			dir:        filepath.Join(dir, "m"+strconv.Itoa(i)),
		}
		e.members = append(e.members, m)
	}
	advertised := make([]string, n)
	for i, m := range e.members {
		advertised[i] = m.peerURL()
		if proxied {
			pp := StartProxy(t, e.PeerAddr(i))
			cp := StartProxy(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(m.clientPort)))
			e.peerProxies = append(e.peerProxies, pp)
			e.clientProxies = append(e.clientProxies, cp)
			advertised[i] = "http://" + pp.Addr()
		}
	}
	var initial []string
	for i, m := range e.members {
		initial = append(initial, m.name+"="+advertised[i])
	}
	for i, m := range e.members {
		m.proc = process{
			name: "etcd " + m.name,
			log:  filepath.Join(dir, m.name+".log"),
			cmd: func() *exec.Cmd {
				return exec.Command(bin,
					"--name="+m.name,
					"--data-dir="+m.dir,
					"--listen-client-urls="+m.clientURL(),
					"--advertise-client-urls="+m.clientURL(),
					"--listen-peer-urls="+m.peerURL(),
					"--initial-advertise-peer-urls="+advertised[i],
					"--initial-cluster="+strings.Join(initial, ","),
					"--initial-cluster-state=new",
					"--initial-cluster-token=dlock-test",
					"--heartbeat-interval="+strconv.Itoa(int(etcdHeartbeat/time.Millisecond)),
					"--election-timeout="+strconv.Itoa(int(etcdElection/time.Millisecond)),
					"--logger=zap",
					"--log-level=warn",
					"--log-outputs=stderr",
				)
			},
		}
	}
	// Registered after TempDir, so it runs first: the processes are gone
	// before their directories are removed.
	t.Cleanup(func() {
		for _, m := range e.members {
			m.proc.stop(syscall.SIGKILL)
		}
	})
	e.StartAll(t)
	return e
}

func (m *etcdMember) clientURL() string {
	return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(m.clientPort))
}

func (m *etcdMember) peerURL() string {
	return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(m.peerPort))
}

// Members returns the number of members.
func (e *Etcd) Members() int { return len(e.members) }

// Endpoints returns the client addresses of every member, "127.0.0.1:PORT":
// their proxies' for a cluster started by StartEtcdClusterProxied.
func (e *Etcd) Endpoints() []string {
	eps := make([]string, len(e.members))
	for i := range e.members {
		eps[i] = e.Endpoint(i)
		if e.clientProxies != nil {
			eps[i] = e.clientProxies[i].Addr()
		}
	}
	return eps
}

// Partition cuts member i off from the other members and from the
// clients, without closing a connection (StartEtcdClusterProxied only):
// its peer and client proxies stop passing anything. The member still
// reaches the others through their proxies, but gets no answer.
func (e *Etcd) Partition(t testing.TB, i int) {
	t.Helper()
	if e.peerProxies == nil {
		t.Fatal("Partition needs StartEtcdClusterProxied")
	}
	e.peerProxies[i].Partition(t)
	e.clientProxies[i].Partition(t)
}

// Heal ends Partition of member i.
func (e *Etcd) Heal(t testing.TB, i int) {
	t.Helper()
	e.peerProxies[i].Heal(t)
	e.clientProxies[i].Heal(t)
}

// Endpoint returns the client address of member i, "127.0.0.1:PORT",
// without a proxy.
func (e *Etcd) Endpoint(i int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(e.members[i].clientPort))
}

// PeerAddr returns the peer (Raft) address of member i, "127.0.0.1:PORT".
func (e *Etcd) PeerAddr(i int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(e.members[i].peerPort))
}

// Client returns a new client on every member, closed when the test ends
// (before the members stop). Its dial timeout is 2s.
func (e *Etcd) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	return e.ClientOf(t, e.Endpoints()...)
}

// ClientOf returns a new client on the given endpoints, closed when the test
// ends.
func (e *Etcd) ClientOf(t testing.TB, endpoints ...string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 2 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("etcd client for %v: %v", endpoints, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// StartAll starts every member that is not running (none that runs) and waits until all of
// them answer through an elected leader: the first start, or a restart of
// the whole cluster.
func (e *Etcd) StartAll(t testing.TB) {
	t.Helper()
	for i := range e.members {
		e.startProcess(t, i)
	}
	for i := range e.members {
		e.waitHealthy(t, i)
	}
}

// Start restarts member i after Stop or Kill, on its ports and data
// directory (it does not start one that runs), and waits until it answers through an elected leader (which
// needs a majority of the members running).
func (e *Etcd) Start(t testing.TB, i int) {
	t.Helper()
	e.startProcess(t, i)
	e.waitHealthy(t, i)
}

// startProcess starts member i's process and waits until its peer port
// accepts connections: a member serves clients only once the cluster has a
// leader, which the first member of a new cluster cannot have alone.
func (e *Etcd) startProcess(t testing.TB, i int) {
	t.Helper()
	m := e.members[i]
	if m.proc.running() {
		return
	}
	m.proc.start(t, func() error {
		c, err := net.DialTimeout("tcp", e.PeerAddr(i), time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	})
}

// waitHealthy waits, readyTimeout at most, until member i's /health says
// that it serves requests through a leader.
func (e *Etcd) waitHealthy(t testing.TB, i int) {
	t.Helper()
	m := e.members[i]
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(readyTimeout)
	var last error
	for time.Now().Before(deadline) {
		last = health(client, m.clientURL())
		if last == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("etcd %s not healthy after %v: %v\nlast lines of its log:\n%s",
		m.name, readyTimeout, last, tail(m.proc.log, 20))
}

func health(c *http.Client, url string) error {
	resp, err := c.Get(url + "/health")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var b [256]byte
	n, _ := resp.Body.Read(b[:])
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b[:n]), `"true"`) {
		return fmt.Errorf("/health: %s %s", resp.Status, b[:n])
	}
	return nil
}

// Stop shuts member i down cleanly (SIGTERM) and waits for it to exit. It
// does nothing when the member is not running.
func (e *Etcd) Stop(t testing.TB, i int) {
	t.Helper()
	e.members[i].proc.stop(syscall.SIGTERM)
}

// Kill sends SIGKILL to member i and waits for it to exit, as a crash would.
// It does nothing when the member is not running.
func (e *Etcd) Kill(t testing.TB, i int) {
	t.Helper()
	e.members[i].proc.stop(syscall.SIGKILL)
}

// KillAll kills every member.
func (e *Etcd) KillAll(t testing.TB) {
	t.Helper()
	for i := range e.members {
		e.Kill(t, i)
	}
}

// Pause freezes member i with SIGSTOP: it holds its sockets open and answers
// nothing, like a process stuck in a long pause, until Resume.
func (e *Etcd) Pause(t testing.TB, i int) {
	t.Helper()
	if err := e.members[i].proc.signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("pause etcd %s: %v", e.members[i].name, err)
	}
}

// Resume continues member i after Pause (SIGCONT).
func (e *Etcd) Resume(t testing.TB, i int) {
	t.Helper()
	if err := e.members[i].proc.signal(syscall.SIGCONT); err != nil {
		t.Fatalf("resume etcd %s: %v", e.members[i].name, err)
	}
}

// Leader returns the index of the member that is the Raft leader, asking
// the running members; it fails the test when none knows one within
// readyTimeout.
func (e *Etcd) Leader(t testing.TB) int {
	t.Helper()
	deadline := time.Now().Add(readyTimeout)
	var last error = errors.New("no member answered")
	for time.Now().Before(deadline) {
		for i := range e.members {
			if !e.members[i].proc.running() {
				continue
			}
			id, leader, err := e.status(i)
			if err != nil {
				last = err
				continue
			}
			if leader != 0 && id == leader {
				return i
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no etcd leader after %v: %v", readyTimeout, last)
	return -1
}

// status asks member i for its member ID and the leader it knows.
func (e *Etcd) status(i int) (id, leader uint64, err error) {
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{e.Endpoint(i)},
		DialTimeout: time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, err := c.Status(ctx, e.Endpoint(i))
	if err != nil {
		return 0, 0, err
	}
	return st.Header.MemberId, st.Leader, nil
}

// EnableAuth turns on etcd's authentication with a root user whose
// password is password; clients must then log in as root.
func (e *Etcd) EnableAuth(t testing.TB, password string) {
	t.Helper()
	c := e.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.UserAdd(ctx, "root", password); err != nil {
		t.Fatalf("etcd user add root: %v", err)
	}
	if _, err := c.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatalf("etcd grant root: %v", err)
	}
	if _, err := c.AuthEnable(ctx); err != nil {
		t.Fatalf("etcd auth enable: %v", err)
	}
}
