package etcdlock_test

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/testserver"
)

// A queue entry lives at least QueueTTL past the send time of its owner's
// last request, and not much longer. A handed grant lives on the head's
// entry lease, and the client trusts it until S + QueueTTL − drift −
// margin, S being the send time of the head's last request answered with
// the entry: the lease must not expire on the server before S + QueueTTL,
// for every S. Entries are kept alive through their lease (one keep-alive
// per request, shared by the entries on it), so a lease may outlive the
// first request written on it; but once its waiter stops asking, nothing
// keeps it: it goes within its granted TTL (the entry's TTL rounded up +
// 1 s, 4 s here: the bound ETCD.md gives for a head that died) of the last
// request, give or take etcd's expiry sweep (every 500 ms, later on a
// loaded machine). A waiter refreshes its entry every 100 ms for 2.5 s
// (plain default QueueTTL 3 s), and each lease's expiry on the server is
// compared with the last request written on it.
func TestQueueLeaseOutlivesLastRequestPlusQueueTTL(t *testing.T) {
	srv := testserver.StartEtcd(t)
	const qttl = 3 * time.Second
	hoHolder(t, srv, "k")
	b := etcdlock.New(srv.Client(t))
	cli := srv.Client(t)
	last := map[clientv3.LeaseID]time.Time{} // lease → send time of the last request on it
	granted := map[clientv3.LeaseID]time.Duration{}
	for end := time.Now().Add(2500 * time.Millisecond); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		s := time.Now()
		hoHead(t, b, "k", "head", qttl)
		resp, err := cli.Get(t.Context(), "dlock/k\x00q\x00head")
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("queue entry: %v, %v", resp, err)
		}
		id := clientv3.LeaseID(resp.Kvs[0].Lease)
		last[id] = s
		if _, ok := granted[id]; !ok {
			r, err := cli.TimeToLive(t.Context(), id)
			if err != nil {
				t.Fatal(err)
			}
			granted[id] = time.Duration(r.GrantedTTL) * time.Second
		}
	}
	t.Logf("%d queue leases", len(last))
	gone := map[clientv3.LeaseID]time.Time{}
	for deadline := time.Now().Add(8 * time.Second); len(gone) < len(last) && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for id := range last {
			if _, ok := gone[id]; ok {
				continue
			}
			r, err := cli.TimeToLive(t.Context(), id)
			if err != nil {
				t.Fatal(err)
			}
			if r.TTL < 0 {
				gone[id] = time.Now()
			}
		}
	}
	for id, s := range last {
		g, ok := gone[id]
		if !ok {
			t.Errorf("lease %x still alive 8 s after its last request", id)
			continue
		}
		lived := g.Sub(s)
		t.Logf("lease %x (granted %v): gone %v after its last request", id, granted[id], lived.Round(time.Millisecond))
		if lived < qttl {
			t.Errorf("queue lease %x expired %v after the last request written on it, before S + QueueTTL (%v): a handed grant on it is trusted longer than it lives", id, lived.Round(time.Millisecond), qttl)
		}
		if most := 4 * time.Second; granted[id] > most {
			t.Errorf("queue lease %x was granted for %v, more than the entry's TTL rounded up + 1 s (%v): a dead head would hold a handed grant on it longer than documented", id, granted[id], most)
		}
		if most := granted[id] + 1500*time.Millisecond; lived > most {
			t.Errorf("queue lease %x lived %v after the last request written on it, more than its granted TTL and slack (%v): something kept it alive", id, lived.Round(time.Millisecond), most)
		}
	}
}
