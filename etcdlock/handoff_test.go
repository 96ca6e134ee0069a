package etcdlock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/testserver"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const hoTTL = 10 * time.Second

// hoHolder grants key to a fair holder on a Backend of its own.
func hoHolder(t *testing.T, srv *testserver.Etcd, key string) (*etcdlock.Backend, driver.AcquireResult) {
	t.Helper()
	b := etcdlock.New(srv.Client(t))
	res, err := b.Acquire(t.Context(), driver.AcquireRequest{Key: key, Token: "holder", Owner: "the holder", TTL: hoTTL, Fair: true})
	if err != nil || !res.Acquired {
		t.Fatalf("the holder's acquire: %+v, %v", res, err)
	}
	return b, res
}

// hoHead queues token at the head of key's queue, taking handoffs.
func hoHead(t *testing.T, b *etcdlock.Backend, key, token string, queueTTL time.Duration) driver.AcquireRequest {
	t.Helper()
	req := driver.AcquireRequest{
		Key: key, Token: token, Owner: "head " + token, TTL: hoTTL,
		Fair: true, Wait: true, QueueTTL: queueTTL, Handoff: true,
	}
	res, err := b.Acquire(t.Context(), req)
	if err != nil || res.Acquired || !res.Queued {
		t.Fatalf("queueing %s: %+v, %v; want refused and queued", token, res, err)
	}
	return req
}

// hoInspect returns key's holder and fence.
func hoInspect(t *testing.T, b *etcdlock.Backend, key string) (driver.LockInfo, bool) {
	t.Helper()
	info, held, err := b.Inspect(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	return info, held
}

// A head whose Lock ended as the lock was handed to it (its Client never
// heard) gives the grant back with the clean-up's release of its token:
// the lock is free at once, not after the head's queue lease.
func TestHandoffCancelledHeadReleasesGrant(t *testing.T) {
	srv := testserver.StartEtcd(t)
	hb, held := hoHolder(t, srv, "k")
	b := etcdlock.New(srv.Client(t))
	hoHead(t, b, "k", "head", 5*time.Second)
	if _, err := hb.Release(t.Context(), "k", "holder"); err != nil {
		t.Fatal(err)
	}
	info, ok := hoInspect(t, b, "k")
	if !ok || info.Owner != "head head" || info.Fence <= held.Fence {
		t.Fatalf("after the release: %+v (held %v); want handed to the head, with a fence above %d", info, ok, held.Fence)
	}
	res, err := b.Release(t.Context(), "k", "head")
	if err != nil || !res.Held {
		t.Fatalf("the head's clean-up: %+v, %v; want the handed grant released", res, err)
	}
	if _, ok := hoInspect(t, b, "k"); ok {
		t.Fatal("held after the head's clean-up")
	}
	n, err := srv.Client(t).Get(t.Context(), "dlock/k\x00q\x00", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || n.Count != 0 {
		t.Fatalf("queue entries left: %v, %v", n, err)
	}
}

// A grant handed to a head whose lease is dead goes with that lease, and
// wakes the waiters; the head's late request does not get it back, and
// tells the head's Client that the handoff is over (Counter).
func TestHandoffHeadLeaseDead(t *testing.T) {
	srv := testserver.StartEtcd(t)
	admin := srv.Client(t)
	hb, _ := hoHolder(t, srv, "k")
	b := etcdlock.New(srv.Client(t))
	req := hoHead(t, b, "k", "head", 5*time.Second)

	waiter := dlock.New(etcdlock.New(srv.Client(t)))
	defer waiter.Close()
	type out struct {
		l   *dlock.Lease
		err error
	}
	got := make(chan out, 1)
	go func() {
		l, err := waiter.Mutex("k", dlock.Fair(), dlock.WithTTL(hoTTL), dlock.WithWait(10*time.Second)).Lock(context.Background())
		got <- out{l, err}
	}()
	// The waiter queues second.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		n, err := admin.Get(t.Context(), "dlock/k\x00q\x00", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if n.Count == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter did not queue")
		}
	}
	if _, err := hb.Release(t.Context(), "k", "holder"); err != nil {
		t.Fatal(err)
	}
	info, ok := hoInspect(t, b, "k")
	if !ok || info.Owner != "head head" {
		t.Fatalf("after the release: %+v (held %v); want handed to the head", info, ok)
	}
	kv, err := admin.Get(t.Context(), "dlock/k\x00e")
	if err != nil || len(kv.Kvs) != 1 || kv.Kvs[0].Lease == 0 {
		t.Fatalf("the handed grant's key: %v, %v", kv, err)
	}
	// The head dies: its queue lease goes (as it would expire).
	start := time.Now()
	if _, err := admin.Revoke(t.Context(), clientv3.LeaseID(kv.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	o := <-got
	if o.err != nil {
		t.Fatalf("the next waiter: %v", o.err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the next waiter got the lock %v after the head's lease went; want at once (woken by the watch)", took)
	}
	if o.l.Fence() <= info.Fence {
		t.Errorf("the next grant's fence %d, want above the handed one's %d", o.l.Fence(), info.Fence)
	}
	res, err := b.Acquire(t.Context(), req)
	if err != nil || res.Acquired {
		t.Fatalf("the dead head's late request: %+v, %v; want refused", res, err)
	}
	if res.Counter < info.Fence {
		t.Errorf("the late request's Counter %d, want at least the handed fence %d", res.Counter, info.Fence)
	}
	if err := o.l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Release(t.Context(), "k", "head"); err != nil {
		t.Fatal(err)
	}
}

// A head that never hears of the handoff (its watch event lost) gets the
// grant with its next request: the same fence, moved to a lease of its
// TTL that its renewals keep alive.
func TestHandoffClaimedByRequest(t *testing.T) {
	srv := testserver.StartEtcd(t)
	admin := srv.Client(t)
	hb, _ := hoHolder(t, srv, "k")
	b := etcdlock.New(srv.Client(t))
	req := hoHead(t, b, "k", "head", 5*time.Second)
	if _, err := hb.Release(t.Context(), "k", "holder"); err != nil {
		t.Fatal(err)
	}
	info, ok := hoInspect(t, b, "k")
	if !ok || info.Owner != "head head" {
		t.Fatalf("after the release: %+v (held %v); want handed to the head", info, ok)
	}
	before, err := admin.Get(t.Context(), "dlock/k\x00e")
	if err != nil || len(before.Kvs) != 1 {
		t.Fatal(before, err)
	}
	res, err := b.Acquire(t.Context(), req)
	if err != nil || !res.Acquired || res.Fence != info.Fence || res.Holds != 1 {
		t.Fatalf("the head's next request: %+v, %v; want the handed grant (fence %d)", res, err, info.Fence)
	}
	after, err := admin.Get(t.Context(), "dlock/k\x00e")
	if err != nil || len(after.Kvs) != 1 {
		t.Fatal(after, err)
	}
	if after.Kvs[0].Lease == before.Kvs[0].Lease {
		t.Error("the claimed grant stayed on the head's queue lease")
	}
	if info2, _ := hoInspect(t, b, "k"); info2.Fence != info.Fence {
		t.Errorf("fence after the claim %d, want %d", info2.Fence, info.Fence)
	}
	if ok, err := b.Renew(t.Context(), "k", "head", hoTTL); err != nil || !ok {
		t.Fatalf("renewal of the claimed grant: %v, %v", ok, err)
	}
	if r, err := b.ReleaseGrant(t.Context(), "k", "head", res.Fence); err != nil || !r.Held {
		t.Fatalf("release of the claimed grant: %+v, %v", r, err)
	}
}

// The head's Listener announces the handoff (driver.Handoff with the
// grant's fence); a plain release announces the head only.
func TestHandoffAnnounced(t *testing.T) {
	srv := testserver.StartEtcd(t)
	hb, _ := hoHolder(t, srv, "k")
	b := etcdlock.New(srv.Client(t))
	var (
		mu    sync.Mutex
		nexts []string
	)
	l, err := b.Listen(t.Context(), func(key, next string) {
		mu.Lock()
		defer mu.Unlock()
		if key == "k" {
			nexts = append(nexts, next)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Subscribe(t.Context(), "k"); err != nil {
		t.Fatal(err)
	}
	hoHead(t, b, "k", "head", 5*time.Second)
	if _, err := hb.Release(t.Context(), "k", "holder"); err != nil {
		t.Fatal(err)
	}
	info, _ := hoInspect(t, b, "k")
	want := driver.Handoff{Token: "head", Fence: info.Fence}.Next()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		mu.Lock()
		got := append([]string(nil), nexts...)
		mu.Unlock()
		if len(got) > 0 {
			if len(got) != 1 || got[0] != want {
				t.Fatalf("announced %q, want [%q]", got, want)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no announcement of the handoff")
		}
	}
	if _, err := b.Release(t.Context(), "k", "head"); err != nil {
		t.Fatal(err)
	}
}

// A release whose Backend guessed a head that has left since still hands
// the lock to the head it then reads.
func TestHandoffStaleGuess(t *testing.T) {
	srv := testserver.StartEtcd(t)
	hb, _ := hoHolder(t, srv, "k")
	b := etcdlock.New(srv.Client(t))
	hoHead(t, b, "k", "first", 5*time.Second)
	hoHead(t, b, "k", "second", 5*time.Second)
	// The holder's Backend reads the queue (a refused fair request of
	// another token), so that it guesses "first".
	if res, err := hb.Acquire(t.Context(), driver.AcquireRequest{Key: "k", Token: "peek", Owner: "peek", TTL: hoTTL, Fair: true}); err != nil || res.Acquired {
		t.Fatalf("peek: %+v, %v", res, err)
	}
	if err := b.Withdraw(t.Context(), "k", "first"); err != nil {
		t.Fatal(err)
	}
	if _, err := hb.Release(t.Context(), "k", "holder"); err != nil {
		t.Fatal(err)
	}
	info, ok := hoInspect(t, b, "k")
	if !ok || info.Owner != "head second" {
		t.Fatalf("after the release: %+v (held %v); want handed to the second head", info, ok)
	}
	if _, err := b.Release(t.Context(), "k", "second"); err != nil {
		t.Fatal(err)
	}
}

// A forced release (ForceRelease, BreakIf) wakes every waiter (next ""),
// not only the queue's head: the head may be gone, and the plain waiters
// would otherwise sleep until their next poll.
func TestForcedReleaseWakesEveryone(t *testing.T) {
	srv := testserver.StartEtcd(t)
	for _, force := range []string{"ForceRelease", "BreakIf"} {
		t.Run(force, func(t *testing.T) {
			key := "forced-" + force
			hb, held := hoHolder(t, srv, key)
			b := etcdlock.New(srv.Client(t))
			var (
				mu    sync.Mutex
				nexts []string
			)
			l, err := b.Listen(t.Context(), func(k, next string) {
				mu.Lock()
				defer mu.Unlock()
				if k == key {
					nexts = append(nexts, next)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if err := l.Subscribe(t.Context(), key); err != nil {
				t.Fatal(err)
			}
			hoHead(t, b, key, "head", 5*time.Second)
			switch force {
			case "ForceRelease":
				if _, ok, err := hb.ForceRelease(t.Context(), key); err != nil || !ok {
					t.Fatalf("ForceRelease: %v, %v", ok, err)
				}
			default:
				if ok, err := hb.BreakIf(t.Context(), key, held.Fence); err != nil || !ok {
					t.Fatalf("BreakIf: %v, %v", ok, err)
				}
			}
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				mu.Lock()
				all := false
				for _, n := range nexts {
					all = all || n == ""
				}
				got := append([]string(nil), nexts...)
				mu.Unlock()
				if all {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("announced %q after the forced release; want a wake-up of everyone (\"\")", got)
				}
			}
			if _, err := b.Release(t.Context(), key, "head"); err != nil {
				t.Fatal(err)
			}
		})
	}
}
