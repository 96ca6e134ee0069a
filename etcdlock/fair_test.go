package etcdlock_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/test/testserver"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// crowdRun is the outcome of one crowd of waiters on one name.
type crowdRun struct {
	grants, failed int
	elapsed        time.Duration // from the first release to the last grant
	maxHolds       int           // most grants of one waiter (1 when each got it once)
	// outOfOrder counts the grants of a fair crowd that came before the
	// grant of a waiter queued ahead of them.
	outOfOrder int
	// reqs counts the member's requests by kind from the first release to
	// the last grant (see etcdRequests), when asked for.
	reqs map[string]float64
}

func (r crowdRun) perSecond() float64 { return float64(r.grants) / r.elapsed.Seconds() }

// crowdName is the name the crowds wait for.
const crowdName = "crowd"

// waitQueued waits until count() reports want, checking every 50ms, and
// fails tb when wait passes first.
func waitQueued(tb testing.TB, want int, wait time.Duration, count func(context.Context) (int, error)) {
	tb.Helper()
	deadline := time.Now().Add(wait)
	for {
		ctx, cancel := context.WithTimeout(tb.Context(), 5*time.Second)
		n, err := count(ctx)
		cancel()
		if err == nil && n >= want {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%d of %d waiters queued after %v (last error: %v)", n, want, wait, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// lockCrowd makes n waiters, each with a dlock Client of its own (a
// process each), wait for one held name at once, then, once a fair crowd
// has all queued (a plain one: after 2s), releases it and lets each take
// it once; the clients share conns etcd clients. For a fair crowd it
// counts the grants that overtook a waiter queued ahead (the order of
// their queue entries' create revisions).
func lockCrowd(tb testing.TB, conns []*clientv3.Client, n int, fair bool, wait time.Duration, metrics string) crowdRun {
	tb.Helper()
	clients := make([]*dlock.Client, n)
	for i := range clients {
		clients[i] = dlock.New(etcdlock.New(conns[i%len(conns)]), dlock.WithTTL(10*time.Second))
	}
	defer func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}()
	mutex := func(i int) *dlock.Mutex {
		opts := []dlock.Option{dlock.WithMetadata(crowdTag(i))}
		if fair {
			opts = append(opts, dlock.Fair())
		}
		return clients[i].Mutex(crowdName, opts...)
	}
	first, err := mutex(0).Lock(tb.Context())
	if err != nil {
		tb.Fatal(err)
	}
	var (
		wg       sync.WaitGroup
		failed   atomic.Int64
		holding  atomic.Int64
		overlaps atomic.Int64
		mu       sync.Mutex
		last     time.Time
		order    []int // the waiters, in the order of their grants
		holds    = make([]int, n)
	)
	for i := 1; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(tb.Context(), wait)
			defer cancel()
			l, err := mutex(i).Lock(ctx)
			if err != nil {
				failed.Add(1)
				tb.Logf("waiter %d: %v", i, err)
				return
			}
			if holding.Add(1) != 1 {
				overlaps.Add(1)
			}
			mu.Lock()
			holds[i]++
			order = append(order, i)
			last = time.Now()
			mu.Unlock()
			holding.Add(-1)
			if err := l.Unlock(context.WithoutCancel(ctx)); err != nil {
				tb.Errorf("waiter %d: unlock: %v", i, err)
			}
		}()
	}
	var queue []int // the waiters, in queue order
	if fair {
		qp := etcdlock.DefaultNamespace + crowdName + "\x00q\x00"
		waitQueued(tb, n-1, wait, func(ctx context.Context) (int, error) {
			resp, err := conns[0].Get(ctx, qp, clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil {
				return 0, err
			}
			return int(resp.Count), nil
		})
		resp, err := conns[0].Get(tb.Context(), qp, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		if err != nil {
			tb.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			queue = append(queue, crowdWaiter(string(kv.Value)))
		}
	} else {
		time.Sleep(2 * time.Second) // every waiter has sent its first request
	}
	before := etcdRequests(tb, metrics)
	start := time.Now()
	if err := first.Unlock(tb.Context()); err != nil {
		tb.Fatal(err)
	}
	wg.Wait()
	if overlaps.Load() > 0 {
		tb.Errorf("%d grants overlapped another", overlaps.Load())
	}
	r := crowdRun{grants: len(order), failed: int(failed.Load()), elapsed: last.Sub(start), reqs: requestsSince(tb, metrics, before)}
	for _, h := range holds {
		r.maxHolds = max(r.maxHolds, h)
	}
	if fair {
		// The grants in queue order: each waiter's grant after those of
		// every waiter queued ahead of it.
		place := make(map[int]int, len(queue))
		for p, w := range queue {
			place[w] = p
		}
		latest := -1
		for _, w := range order {
			if p, ok := place[w]; ok && p < latest {
				r.outOfOrder++
			} else if ok {
				latest = p
			}
		}
	}
	return r
}

// etcdRequests reads the requests a member has served, from its metrics
// at url ("" for none: nil): the messages it received per gRPC method
// (a unary call is one, a watch or keep-alive stream one per message),
// the streams it opened per method ("open " + method), the Raft proposals
// it committed ("raft") and its CPU time in seconds ("cpu").
func etcdRequests(tb testing.TB, url string) map[string]float64 {
	tb.Helper()
	if url == "" {
		return nil
	}
	resp, err := http.Get(url)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	m := make(map[string]float64)
	for _, line := range strings.Split(string(body), "\n") {
		name, rest, _ := strings.Cut(line, "{")
		labels, value, _ := strings.Cut(rest, "} ")
		if n, v, ok := strings.Cut(line, " "); ok && (n == "process_cpu_seconds_total" || n == "etcd_server_proposals_committed_total") {
			name, labels, value = n, "", v
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		_, method, _ := strings.Cut(labels, `grpc_method="`)
		method, _, _ = strings.Cut(method, `"`)
		switch {
		case name == "process_cpu_seconds_total":
			m["cpu"] = v
		case name == "etcd_server_proposals_committed_total":
			m["raft"] = v
		case name == "grpc_server_msg_received_total":
			m[method] += v
		case name == "grpc_server_started_total" && !strings.Contains(labels, `grpc_type="unary"`):
			m["open "+method] += v
		}
	}
	return m
}

// requestsSince returns what etcdRequests counts at url now less before.
func requestsSince(tb testing.TB, url string, before map[string]float64) map[string]float64 {
	tb.Helper()
	now := etcdRequests(tb, url)
	for k := range now {
		now[k] -= before[k]
		if now[k] == 0 {
			delete(now, k)
		}
	}
	return now
}

// perGrant formats the requests of r per grant, by kind.
func perGrant(r crowdRun) string {
	kinds := make([]string, 0, len(r.reqs))
	for k := range r.reqs {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var sb strings.Builder
	for _, k := range kinds {
		fmt.Fprintf(&sb, " %s %.3g", k, r.reqs[k]/float64(max(r.grants, 1)))
	}
	return sb.String()
}

// crowdTag is the metadata of waiter i's owner; crowdWaiter reads i back
// from an owner (or queue entry value) that carries it.
func crowdTag(i int) string { return "crowd-waiter-" + strconv.Itoa(i) + ";" }

func crowdWaiter(owner string) int {
	_, rest, ok := strings.Cut(owner, "crowd-waiter-")
	if !ok {
		return -1
	}
	num, _, _ := strings.Cut(rest, ";")
	i, err := strconv.Atoi(num)
	if err != nil {
		return -1
	}
	return i
}

// mutexCrowd is lockCrowd with etcd's concurrency.Mutex: a session (a
// lease kept alive) per waiter, as a process each would have.
func mutexCrowd(tb testing.TB, conns []*clientv3.Client, n int, wait time.Duration, metrics string) crowdRun {
	tb.Helper()
	sessions := make([]*concurrency.Session, n)
	for i := range sessions {
		s, err := concurrency.NewSession(conns[i%len(conns)], concurrency.WithTTL(10))
		if err != nil {
			tb.Fatal(err)
		}
		sessions[i] = s
	}
	defer func() {
		for _, s := range sessions {
			_ = s.Close()
		}
	}()
	const pfx = "cmutex/" + crowdName
	first := concurrency.NewMutex(sessions[0], pfx)
	if err := first.Lock(tb.Context()); err != nil {
		tb.Fatal(err)
	}
	var (
		wg      sync.WaitGroup
		failed  atomic.Int64
		granted atomic.Int64
		mu      sync.Mutex
		last    time.Time
	)
	for i := 1; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(tb.Context(), wait)
			defer cancel()
			m := concurrency.NewMutex(sessions[i], pfx)
			if err := m.Lock(ctx); err != nil {
				failed.Add(1)
				tb.Logf("concurrency.Mutex waiter %d: %v", i, err)
				return
			}
			granted.Add(1)
			mu.Lock()
			last = time.Now()
			mu.Unlock()
			if err := m.Unlock(context.WithoutCancel(ctx)); err != nil {
				tb.Errorf("concurrency.Mutex waiter %d: unlock: %v", i, err)
			}
		}()
	}
	waitQueued(tb, n, wait, func(ctx context.Context) (int, error) {
		resp, err := conns[0].Get(ctx, pfx+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return 0, err
		}
		return int(resp.Count), nil
	})
	before := etcdRequests(tb, metrics)
	start := time.Now()
	if err := first.Unlock(tb.Context()); err != nil {
		tb.Fatal(err)
	}
	wg.Wait()
	return crowdRun{grants: int(granted.Load()), failed: int(failed.Load()), elapsed: last.Sub(start), maxHolds: 1,
		reqs: requestsSince(tb, metrics, before)}
}

// BenchmarkFairCrowd measures, in one run on one etcd member, the grants/s
// of N Fair() waiters on one name, each on a dlock Client of its own (a
// process each), and of N waiters of etcd's own concurrency.Mutex (a
// session each), from the first release to the last grant once every
// waiter has queued. It reports both rates, their ratio and the failed
// waits of each. The figures are in docs/ETCD.md:
//
//	go test -run '^$' -bench FairCrowd -benchtime 1x ./etcdlock/
func BenchmarkFairCrowd(b *testing.B) {
	for _, n := range []int{300, 1000} {
		b.Run(fmt.Sprintf("waiters=%d", n), func(b *testing.B) {
			srv := testserver.StartEtcd(b)
			metrics := "http://" + srv.Endpoint(0) + "/metrics"
			conns := make([]*clientv3.Client, 8)
			for i := range conns {
				conns[i] = srv.Client(b)
			}
			const wait = 2 * time.Minute
			var dl, cm crowdRun
			for range b.N {
				c := mutexCrowd(b, conns, n+1, wait, metrics)
				d := lockCrowd(b, conns, n+1, true, wait, metrics)
				b.Logf("requests per grant, concurrency.Mutex:%s", perGrant(c))
				b.Logf("requests per grant, dlock Fair():%s", perGrant(d))
				b.Logf("grants/s: dlock Fair() %.1f (%d failed, %d out of queue order), concurrency.Mutex %.1f (%d failed), ratio %.2f",
					d.perSecond(), d.failed, d.outOfOrder, c.perSecond(), c.failed, d.perSecond()/c.perSecond())
				cm.grants += c.grants
				cm.failed += c.failed
				cm.elapsed += c.elapsed
				dl.grants += d.grants
				dl.failed += d.failed
				dl.elapsed += d.elapsed
				dl.outOfOrder += d.outOfOrder
				dl.maxHolds = max(dl.maxHolds, d.maxHolds)
			}
			b.ReportMetric(dl.perSecond(), "dlock-grants/s")
			b.ReportMetric(cm.perSecond(), "cmutex-grants/s")
			b.ReportMetric(dl.perSecond()/cm.perSecond(), "ratio")
			b.ReportMetric(float64(dl.failed), "dlock-failed")
			b.ReportMetric(float64(cm.failed), "cmutex-failed")
			b.ReportMetric(0, "ns/op")
			if dl.failed > 0 || dl.outOfOrder > 0 || dl.maxHolds != 1 {
				b.Errorf("dlock Fair(): %d waits failed, %d grants out of queue order, most grants of one waiter %d", dl.failed, dl.outOfOrder, dl.maxHolds)
			}
		})
	}
}

// Fair() waiters on one name, each on a Client of its own, all get the
// lock, each once, in the order they queued in, with none of their waits
// failing.
func TestFairCrowdGrantsEveryWaiterInQueueOrder(t *testing.T) {
	srv := testserver.StartEtcd(t)
	conns := []*clientv3.Client{srv.Client(t), srv.Client(t)}
	const n = 150
	r := lockCrowd(t, conns, n+1, true, 2*time.Minute, "")
	t.Logf("%d waiters: %d granted in %v", n, r.grants, r.elapsed.Round(time.Millisecond))
	if r.failed > 0 || r.grants != n || r.maxHolds != 1 || r.outOfOrder > 0 {
		t.Fatalf("%d of %d waits failed, %d granted, %d out of queue order, most grants of one waiter %d; want every waiter granted once, in queue order", r.failed, n, r.grants, r.outOfOrder, r.maxHolds)
	}
}

// lateKV delivers the puts of fair queue entries late: the request has
// left the client when its ctx ends, and the server runs it afterwards
// (what a cancelled gRPC call may do).
type lateKV struct {
	clientv3.KV
	wg *sync.WaitGroup
}

func (k lateKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	if !strings.Contains(key, "\x00q\x00") {
		return k.KV.Put(ctx, key, val, opts...)
	}
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		time.Sleep(400 * time.Millisecond)
		_, _ = k.KV.Put(context.Background(), key, val, opts...)
	}()
	<-ctx.Done()
	return nil, ctx.Err()
}

// Txn delivers late, in the same way, a transaction that writes a fair
// queue entry (the backend writes entries in a transaction that checks the
// token has not left since).
func (k lateKV) Txn(ctx context.Context) clientv3.Txn {
	return &lateTxn{ctx: ctx, kv: k}
}

type lateTxn struct {
	ctx       context.Context
	kv        lateKV
	cmps      []clientv3.Cmp
	then, els []clientv3.Op
}

func (t *lateTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.cmps = append(t.cmps, cs...); return t }
func (t *lateTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.then = append(t.then, ops...); return t }
func (t *lateTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.els = append(t.els, ops...); return t }

func (t *lateTxn) Commit() (*clientv3.TxnResponse, error) {
	queue := false
	for _, op := range append(append([]clientv3.Op(nil), t.then...), t.els...) {
		if op.IsPut() && strings.Contains(string(op.KeyBytes()), "\x00q\x00") {
			queue = true
		}
	}
	if !queue {
		return t.kv.KV.Txn(t.ctx).If(t.cmps...).Then(t.then...).Else(t.els...).Commit()
	}
	t.kv.wg.Add(1)
	go func() {
		defer t.kv.wg.Done()
		time.Sleep(400 * time.Millisecond)
		_, _ = t.kv.KV.Txn(context.Background()).If(t.cmps...).Then(t.then...).Else(t.els...).Commit()
	}()
	<-t.ctx.Done()
	return nil, t.ctx.Err()
}

// A fair waiter gives up while its queue entry is on its way; the server
// writes the entry after the client's clean-up (a release that records the
// token as released). The entry then heads the queue of a lock that nobody
// waits for under that token, and no fair waiter gets the free lock until
// the entry's lease runs out (up to QueueTTL rounded up + 1s, 6s here), unless the
// entry's write is refused: the release record must refuse the token's
// late queue entries as it refuses its grants.
func TestCancelledFairWaiterLateQueueEntryRefused(t *testing.T) {
	srv := testserver.StartEtcd(t)
	holder := dlock.New(etcdlock.New(srv.Client(t)))
	defer holder.Close()
	lh, err := holder.Mutex("k", dlock.Fair()).TryLock(t.Context())
	if err != nil {
		t.Fatal(err)
	}

	var late sync.WaitGroup
	cli := srv.Client(t)
	cli.KV = lateKV{cli.KV, &late}
	w := dlock.New(etcdlock.New(cli))
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	_, err = w.Mutex("k", dlock.Fair(), dlock.WithTTL(10*time.Second)).Lock(ctx)
	cancel()
	if err == nil {
		t.Fatal("the waiter got the lock")
	}
	late.Wait()
	w.Close()

	if err := lh.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	next := dlock.New(etcdlock.New(srv.Client(t)))
	defer next.Close()
	start := time.Now()
	l, err := next.Mutex("k", dlock.Fair(), dlock.WithWait(3*time.Second)).Lock(t.Context())
	if err != nil {
		n, _ := srv.Client(t).Get(t.Context(), "dlock/k\x00q\x00", clientv3.WithPrefix(), clientv3.WithCountOnly())
		t.Fatalf("free fair lock not granted within 3s (%v): %v; queue entries on the store: %d", time.Since(start).Round(time.Millisecond), err, n.Count)
	}
	_ = l.Unlock(t.Context())
}
