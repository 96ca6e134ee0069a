package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/test/testserver"
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
			// Two of the Listener's watches can both see the handoff's
			// write and announce it: the same announcement again, which
			// the client takes once. Anything else is wrong.
			for _, g := range got {
				if g != want {
					t.Fatalf("announced %q, want only %q", got, want)
				}
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

// BreakIf with the fence of the holder whose release handed the lock on
// leaves the handed grant alone (driver.Breaker: only the grant with that
// fence), although the handed key keeps its releaser's create revision;
// BreakIf with the handed grant's own fence breaks it.
func TestBreakIfEarlierFenceKeepsHandedGrant(t *testing.T) {
	srv := testserver.StartEtcd(t)
	hb, held := hoHolder(t, srv, "k")
	b := etcdlock.New(srv.Client(t))
	hoHead(t, b, "k", "head", 5*time.Second)
	if _, err := hb.Release(t.Context(), "k", "holder"); err != nil {
		t.Fatal(err)
	}
	info, ok := hoInspect(t, b, "k")
	if !ok || info.Owner != "head head" || info.Fence <= held.Fence {
		t.Fatalf("after the release: %+v; want handed to the head", info)
	}
	broken, err := b.BreakIf(t.Context(), "k", held.Fence)
	if err != nil {
		t.Fatal(err)
	}
	after, ok := hoInspect(t, b, "k")
	if broken || !ok || after.Owner != "head head" {
		t.Fatalf("BreakIf(old holder's fence %d) = %v; lock now %+v held=%v; want false and the head's grant (fence %d) kept", held.Fence, broken, after, ok, info.Fence)
	}
	if broken, err := b.BreakIf(t.Context(), "k", info.Fence); err != nil || !broken {
		t.Fatalf("BreakIf(the handed grant's fence %d) = %v, %v; want true", info.Fence, broken, err)
	}
	if after, ok := hoInspect(t, b, "k"); ok {
		t.Fatalf("held after BreakIf of its fence: %+v", after)
	}
}

// The key's create revision survives a chain of handoffs: BreakIf with the
// fence of the grant that started the chain leaves whoever holds the lock
// two handoffs later alone.
func TestBreakIfFirstFenceOfHandoffChain(t *testing.T) {
	srv := testserver.StartEtcd(t)
	hb, held := hoHolder(t, srv, "k")
	b := etcdlock.New(srv.Client(t))
	hoHead(t, b, "k", "h1", 5*time.Second)
	hoHead(t, b, "k", "h2", 5*time.Second)
	if _, err := hb.Release(t.Context(), "k", "holder"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Release(t.Context(), "k", "h1"); err != nil {
		t.Fatal(err)
	}
	info, ok := hoInspect(t, b, "k")
	if !ok || info.Owner != "head h2" {
		t.Fatalf("want h2 handed the lock: %+v", info)
	}
	if broken, err := b.BreakIf(t.Context(), "k", held.Fence); err != nil || broken {
		t.Fatalf("BreakIf(first holder's fence %d) = %v, %v while h2 holds fence %d; want false", held.Fence, broken, err, info.Fence)
	}
	if after, ok := hoInspect(t, b, "k"); !ok || after.Owner != "head h2" || after.Fence != info.Fence {
		t.Fatalf("after BreakIf of the first fence: %+v held=%v; want h2's grant kept", after, ok)
	}
}

// A head's clean-up release (no fence) that drops the grant a release
// handed to it records the release, as the clean-up found nothing and
// recorded it before the handoff: a request of that token still on its way
// (sent before its caller gave up, landing after the clean-up: here
// through a second Backend, which has not queued the token and so joins in
// one transaction) is refused, rather than granted again (no next waiter)
// or queued as a ghost head (a next waiter holds the lock), and its
// Backend writes no entry after that refusal either.
//
// (A Backend that already queued the token reads first, then writes its
// entry: a write whose read came before the handoff is refused by its
// compare of the lock's key, which the handoff changed; one whose read came
// after the clean-up belongs to a request sent after it.)
//
// With heard, the head's Backend listens to the lock and hears of the
// handoff (its Client's Lock had ended all the same).
func TestHandedCleanupRefusesLateRequest(t *testing.T) {
	for _, c := range []struct{ withNext, heard bool }{{false, false}, {true, false}, {false, true}} {
		t.Run(fmt.Sprintf("next_waiter_%v/heard_%v", c.withNext, c.heard), func(t *testing.T) {
			srv := testserver.StartEtcd(t)
			hb, _ := hoHolder(t, srv, "k")
			b := etcdlock.New(srv.Client(t))
			b2 := etcdlock.New(srv.Client(t))
			handed := make(chan string, 4)
			if c.heard {
				l, err := b.Listen(t.Context(), func(key, next string) {
					if key == "k" {
						handed <- next
					}
				})
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				if err := l.Subscribe(t.Context(), "k"); err != nil {
					t.Fatal(err)
				}
			}
			req := hoHead(t, b, "k", "head", 5*time.Second)
			if c.withNext {
				hoHead(t, b, "k", "next", 5*time.Second)
			}
			if _, err := hb.Release(t.Context(), "k", "holder"); err != nil {
				t.Fatal(err)
			}
			info, ok := hoInspect(t, b, "k")
			if !ok || info.Owner != "head head" {
				t.Fatalf("not handed: %+v", info)
			}
			if c.heard {
				select {
				case next := <-handed:
					if want := (driver.Handoff{Token: "head", Fence: info.Fence}).Next(); next != want {
						t.Fatalf("announced %q, want %q", next, want)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("no announcement of the handoff")
				}
			}
			// The head's Lock ended: its clean-up releases the token.
			if res, err := b.Release(t.Context(), "k", "head"); err != nil || !res.Held {
				t.Fatalf("clean-up: %+v %v", res, err)
			}
			// The request of the head that was on its way lands now.
			res, err := b2.Acquire(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			if res.Acquired || res.Queued {
				info, _ := hoInspect(t, b, "k")
				t.Fatalf("late request of the released head: acquired=%v queued=%v (lock now %+v); want refused, as a release record would", res.Acquired, res.Queued, info)
			}
		})
	}
}

// The same sequence without the handoff (a control for the test above):
// the clean-up finds nothing, records the release, and the late request is
// refused.
func TestCleanupOfNothingRefusesLateRequest(t *testing.T) {
	srv := testserver.StartEtcd(t)
	hb, _ := hoHolder(t, srv, "k")
	b := etcdlock.New(srv.Client(t))
	b2 := etcdlock.New(srv.Client(t))
	req := driver.AcquireRequest{Key: "k", Token: "head", Owner: "head head", TTL: hoTTL, Fair: true, Wait: true, QueueTTL: 5 * time.Second}
	for _, x := range []*etcdlock.Backend{b, b2} {
		if res, err := x.Acquire(t.Context(), req); err != nil || !res.Queued {
			t.Fatalf("queue: %+v %v", res, err)
		}
	}
	if _, err := hb.Release(t.Context(), "k", "holder"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Release(t.Context(), "k", "head"); err != nil {
		t.Fatal(err)
	}
	res, err := b2.Acquire(t.Context(), req)
	if err != nil || res.Acquired || res.Queued {
		t.Fatalf("late request: %+v %v; want refused", res, err)
	}
}

// With WithHandoff(false), a fair waiter's grant is a key it created, as
// before the handoff, so that a version of etcdlock without the handoff on
// the same namespace reads its fence right (the key's create revision),
// even when the releaser's Backend takes handoffs; and the Backend neither
// reports nor accepts the handoff.
func TestWithoutHandoffGrantsReadableByEarlierVersions(t *testing.T) {
	srv := testserver.StartEtcd(t)
	hb, held := hoHolder(t, srv, "k")
	b := etcdlock.New(srv.Client(t), etcdlock.WithHandoff(false))
	if b.Supports(driver.CapHandoff) {
		t.Fatal("Supports(CapHandoff) with WithHandoff(false)")
	}
	if _, err := b.Acquire(t.Context(), driver.AcquireRequest{Key: "h", Token: "t", TTL: hoTTL, Fair: true, Wait: true, QueueTTL: time.Second, Handoff: true}); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("a handoff request with WithHandoff(false): %v; want ErrInvalid", err)
	}
	c := dlock.New(b)
	t.Cleanup(func() { c.Close() })
	got := make(chan *dlock.Lease, 1)
	go func() {
		l, err := c.Mutex("k", dlock.Fair(), dlock.WithTTL(hoTTL)).Lock(t.Context())
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	raw := srv.Client(t)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		n, err := raw.Get(t.Context(), "dlock/k\x00q\x00", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if n.Count > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter did not queue")
		}
	}
	if _, err := hb.Release(t.Context(), "k", "holder"); err != nil {
		t.Fatal(err)
	}
	l := <-got
	if l == nil {
		return
	}
	kv, err := raw.Get(t.Context(), "dlock/k\x00e")
	if err != nil || len(kv.Kvs) != 1 {
		t.Fatal(kv, err)
	}
	if got := uint64(kv.Kvs[0].CreateRevision); got != l.Fence() || got <= held.Fence {
		t.Fatalf("an earlier version's view of the waiter's grant (value %q): fence %d; the waiter holds %d, the holder held %d", kv.Kvs[0].Value, got, l.Fence(), held.Fence)
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// ForceRelease of a lock that nobody holds writes nothing: no forced
// release record (which would wake every waiter for nothing).
func TestForceReleaseOfFreeLockWritesNothing(t *testing.T) {
	srv := testserver.StartEtcd(t)
	b := etcdlock.New(srv.Client(t))
	info, held, err := b.ForceRelease(t.Context(), "free")
	if err != nil || held || info.Key != "free" {
		t.Fatalf("ForceRelease of a free lock: %+v, %v, %v; want not held", info, held, err)
	}
	n, err := srv.Client(t).Get(t.Context(), "dlock/free\x00", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || n.Count != 0 {
		t.Fatalf("keys written by ForceRelease of a free lock: %v, %v; want none", n, err)
	}
}

// answerLosingKV commits every transaction, but while lose is set it
// loses the answer of the next one (once): the caller sees its attempt's
// deadline pass, as when the member it went through froze as it answered.
type answerLosingKV struct {
	clientv3.KV
	lose *atomic.Bool
}

func (k answerLosingKV) Txn(ctx context.Context) clientv3.Txn {
	return &answerLosingTxn{Txn: k.KV.Txn(ctx), lose: k.lose}
}

type answerLosingTxn struct {
	clientv3.Txn
	lose *atomic.Bool
}

func (t *answerLosingTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t *answerLosingTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }
func (t *answerLosingTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }

func (t *answerLosingTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.Txn.Commit()
	if err == nil && t.lose.CompareAndSwap(true, false) {
		return nil, context.DeadlineExceeded
	}
	return resp, err
}

// The release of a handed grant whose first try landed but whose answer
// was lost (the member it went through froze as it answered) is tried
// again, finds the grant gone, and reports it released, as it does for a
// grant the Backend made: the grant's queue lease still lives, so only
// that release can have taken it. A head that heard of its grant from its
// Listener must not be told its lease was lost.
func TestHandedGrantReleaseWithLostAnswerReportsReleased(t *testing.T) {
	srv := testserver.StartEtcd(t)
	hb, _ := hoHolder(t, srv, "k")
	cli := srv.Client(t)
	var lose atomic.Bool
	cli.KV = answerLosingKV{cli.KV, &lose}
	b := etcdlock.New(cli)
	handed := make(chan string, 4)
	l, err := b.Listen(t.Context(), func(key, next string) {
		if key == "k" {
			handed <- next
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
	info, ok := hoInspect(t, hb, "k")
	if !ok || info.Owner != "head head" {
		t.Fatalf("not handed: %+v", info)
	}
	want := driver.Handoff{Token: "head", Fence: info.Fence}.Next()
	select {
	case next := <-handed:
		if next != want {
			t.Fatalf("announced %q, want %q", next, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no announcement of the handoff")
	}
	lose.Store(true)
	res, err := b.ReleaseGrant(t.Context(), "k", "head", info.Fence)
	if err != nil {
		t.Fatal(err)
	}
	if lose.Load() {
		t.Fatal("the release sent no transaction")
	}
	if _, held := hoInspect(t, hb, "k"); held {
		t.Fatal("still held after the release")
	}
	if !res.Held {
		t.Fatalf("ReleaseGrant after its first try landed unanswered: %+v; want Held (the token's grant was released, not lost)", res)
	}
}
