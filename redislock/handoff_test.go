package redislock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redislock"
	"github.com/redis/go-redis/v9"
)

// gatedStore orders two concurrent fair first tries of one Client: the
// first to arrive (B) is queued first; the second (A) is answered first, so
// A takes the gate and B is gated. B's answer is held until A has
// subscribed and tried again; then the holder releases (the lock is handed
// to B, which is not registered yet: h.handed), and B's answer is returned.
type gatedStore struct {
	*redislock.Backend
	mu         sync.Mutex
	tokens     []string
	arrived    chan struct{}
	bForwarded chan struct{}
	aSecond    chan struct{}
	release    func()
	aDone      bool
}

func (s *gatedStore) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	if !req.Handoff {
		return s.Backend.Acquire(ctx, req)
	}
	s.mu.Lock()
	idx := -1
	for i, tk := range s.tokens {
		if tk == req.Token {
			idx = i
		}
	}
	first := idx < 0
	if first {
		s.tokens = append(s.tokens, req.Token)
		idx = len(s.tokens) - 1
		if len(s.tokens) == 2 {
			close(s.arrived)
		}
	}
	s.mu.Unlock()
	// Each wait ends with the call's context, or after a while: a Lock of
	// the Client may join its waiters without a request of its own, and
	// then the second try never comes (see TestHandoffGatedWaiterStaleNotice).
	await := func(ch <-chan struct{}) {
		select {
		case <-ch:
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
		}
	}
	switch {
	case first && idx == 0: // B
		await(s.arrived)
		res, err := s.Backend.Acquire(ctx, req)
		close(s.bForwarded)
		await(s.aSecond)
		s.release()
		time.Sleep(300 * time.Millisecond) // the notice "next:B\0f" is heard
		return res, err
	case first && idx == 1: // A
		await(s.arrived)
		await(s.bForwarded)
		return s.Backend.Acquire(ctx, req)
	case idx == 1: // A again, after subscribing
		res, err := s.Backend.Acquire(ctx, req)
		s.mu.Lock()
		if !s.aDone {
			s.aDone = true
			close(s.aSecond)
		}
		s.mu.Unlock()
		return res, err
	}
	return s.Backend.Acquire(ctx, req)
}

// TestHandoffGatedWaiterStaleNotice: two Lock calls of one Client both
// queue; the second to answer takes the Client's turn, and the other gives
// its place back. A handoff announced to that waiter's token before its
// clean-up released that grant must not become a lease: the waiter goes on
// with a token of its own and claims nothing stale. (A Lock that finds its
// Client's first attempt under way joins it without a request of its own,
// so both queue only when the second comes after that attempt's answer;
// whichever way it goes, the two leases must not overlap and the fences
// must rise.)
func TestHandoffGatedWaiterStaleNotice(t *testing.T) {
	srv := testserver.StartRedis(t)
	holderC := dlock.New(redislock.New(srv.Client(t)))
	defer holderC.Close()
	inner := redislock.New(srv.Client(t))
	st := &gatedStore{Backend: inner, arrived: make(chan struct{}), bForwarded: make(chan struct{}), aSecond: make(chan struct{})}
	c := dlock.New(st)
	defer c.Close()
	ctx := t.Context()
	opts := []dlock.Option{dlock.Fair(), dlock.WithTTL(3 * time.Second)}
	hl, err := holderC.Mutex("k", opts...).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st.release = func() { _ = hl.Unlock(ctx) }
	type out struct {
		l   *dlock.Lease
		err error
		at  time.Time
	}
	outs := make(chan out, 2)
	for range 2 {
		go func() {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			l, err := c.Mutex("k", opts...).Lock(wctx)
			outs <- out{l, err, time.Now()}
		}()
	}
	o1 := <-outs
	if o1.err != nil {
		t.Fatalf("first Lock: %v", o1.err)
	}
	// While the first holds the lock, the second must still wait.
	select {
	case o2 := <-outs:
		if o2.err == nil {
			info, _, _ := inner.Inspect(ctx, "k")
			if o1.l.Err() == nil && o2.l.Err() == nil {
				t.Errorf("two live leases on one lock at once: fences %d and %d (store: %+v)", o1.l.Fence(), o2.l.Fence(), info)
			}
			_ = o2.l.Unlock(ctx)
		}
		_ = o1.l.Unlock(ctx)
		return
	case <-time.After(time.Second):
	}
	_ = o1.l.Unlock(ctx)
	o2 := <-outs
	if o2.err != nil {
		t.Fatalf("second Lock after the first unlocked: %v", o2.err)
	}
	if o2.l.Fence() <= o1.l.Fence() {
		t.Errorf("second fence %d, not above the first's %d", o2.l.Fence(), o1.l.Fence())
	}
	_ = o2.l.Unlock(ctx)
}

// TestHandedLeaseSurvivesLatencyBlip: a lease handed over by a release is
// trusted, until its first renewal answers, only for what is left of the
// head's queue entry (its last queue refresh + QueueTTL − margin). A store
// round trip that takes 0.7 s once, right after the handoff (a GC pause, a
// slow network, a Redis fork), must not lose it, as it does not lose the
// same Mutex's lease obtained by a request (9 s to spare). With plain
// entries of twice the margin (trusted until S + 1 s, first renewal at
// S + 0.5 s) it was lost; entries of three times the margin (S + 2 s) and
// a first renewal 50 ms after the handoff ride it out, as a Fair lease
// (S + 4 s) does.
func TestHandedLeaseSurvivesLatencyBlip(t *testing.T) {
	srv := testserver.StartRedis(t)
	for _, tc := range []struct {
		name   string
		handed bool
		opts   []dlock.Option
	}{
		{"handedblip/requested", false, nil},
		{"handedblip/handed", true, nil},
		{"handedblip/handed-fair", true, []dlock.Option{dlock.Fair()}}, // passes: 4 s of trust, renewed at 2 s
	} {
		name, handed := tc.name, tc.handed
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			px := testserver.StartProxy(t, srv.Addr())
			rdb := redis.NewClient(&redis.Options{Addr: px.Addr()})
			t.Cleanup(func() { _ = rdb.Close() })
			qs := newQueuedSignal(redislock.New(rdb))
			obs, gotHanded := handoffObserver()
			xc := dlock.New(qs, obs)
			defer xc.Close()
			var l *dlock.Lease
			if handed {
				if l, _ = handOverRightAfterRefresh(t, srv, name, tc.opts, xc, qs); l == nil {
					return
				}
			} else {
				var err error
				if l, err = xc.Mutex(name, tc.opts...).Lock(ctx); err != nil {
					t.Fatal(err)
				}
			}
			// A latency blip of 700 ms on X's connection, from now on,
			// for 1.5 s.
			px.Latency(t, 700*time.Millisecond)
			time.Sleep(1500 * time.Millisecond)
			px.ClearLatency(t)
			if h := gotHanded(); h != handed {
				t.Fatalf("lease handed over: %v, want %v (setup)", h, handed)
			}
			if err := l.Err(); err != nil {
				t.Errorf("%s: a Mutex lease (TTL 10 s, handed over: %v) was lost to one 700 ms round trip %v after it was granted: %v", name, handed, 1500*time.Millisecond, err)
			}
			_ = l.Unlock(context.WithoutCancel(ctx))
		})
	}
}

// handoffRig is a lock name held by one Client and waited for, in the
// store's fair queue, by a Lock of another Client (X), whose observer says
// whether its grant came from a handoff announcement.
type handoffRig struct {
	inner  *redislock.Backend // for Inspect
	holder *dlock.Lease
	out    chan *dlock.Lease // X's lease, nil when its Lock failed

	mu              sync.Mutex
	handed, granted bool
}

// queueBehindHolder locks name with opts on one Client and starts X's Lock
// of it (bounded by 20 s), returning once X's entry is in the queue.
func queueBehindHolder(t *testing.T, srv *testserver.Redis, name string, opts []dlock.Option) *handoffRig {
	t.Helper()
	ctx := t.Context()
	r := &handoffRig{inner: redislock.New(srv.Client(t)), out: make(chan *dlock.Lease, 1)}
	holder := dlock.New(redislock.New(srv.Client(t)))
	t.Cleanup(func() { _ = holder.Close() })
	x := dlock.New(redislock.New(srv.Client(t)), dlock.WithObserver(dlock.ObserverFunc(func(e dlock.Event) {
		if e.Kind == dlock.EventLockGranted && !e.TryLock {
			r.mu.Lock()
			r.handed, r.granted = e.Handoff, true
			r.mu.Unlock()
		}
	})))
	t.Cleanup(func() { _ = x.Close() })
	var err error
	if r.holder, err = holder.Mutex(name, opts...).Lock(ctx); err != nil {
		t.Fatal(err)
	}
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		l, err := x.Mutex(name, opts...).Lock(wctx)
		if err != nil {
			t.Errorf("X's Lock: %v", err)
		}
		r.out <- l
	}()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		info, _, err := r.inner.Inspect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if info.Queued > 0 {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatal("X never queued")
		}
	}
}

// release unlocks the holder's lease and returns X's lease (nil when its
// Lock failed) and whether it came from a handoff announcement.
func (r *handoffRig) release(t *testing.T) (l *dlock.Lease, handed bool) {
	t.Helper()
	if err := r.holder.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	l = <-r.out
	r.mu.Lock()
	defer r.mu.Unlock()
	if l != nil && !r.granted {
		t.Error("X's grant was not observed")
	}
	return l, r.handed
}

// queuedSignal wraps a Backend and signals each answer "queued" to a fair
// request (a waiter's queue entry made or refreshed).
type queuedSignal struct {
	*redislock.Backend
	queued chan struct{}
}

func newQueuedSignal(b *redislock.Backend) *queuedSignal {
	return &queuedSignal{Backend: b, queued: make(chan struct{}, 1)}
}

func (q *queuedSignal) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	res, err := q.Backend.Acquire(ctx, req)
	if err == nil && req.Fair && res.Queued {
		select {
		case q.queued <- struct{}{}:
		default:
		}
	}
	return res, err
}

// handoffObserver is an option for X's Client that records whether its
// last Lock was granted by a handoff announcement.
func handoffObserver() (dlock.Option, func() bool) {
	var mu sync.Mutex
	var handed bool
	return dlock.WithObserver(dlock.ObserverFunc(func(e dlock.Event) {
			if e.Kind == dlock.EventLockGranted && !e.TryLock {
				mu.Lock()
				handed = e.Handoff
				mu.Unlock()
			}
		})), func() bool {
			mu.Lock()
			defer mu.Unlock()
			return handed
		}
}

// handOverRightAfterRefresh has another Client hold name, starts x's Lock
// of it, and releases right after x's second "queued" answer (its first
// attempt, then a refresh: its subscription is up by then), so that x's
// head time S is about the handoff. It returns x's lease (nil when its
// Lock failed) and when Lock returned.
func handOverRightAfterRefresh(t *testing.T, srv *testserver.Redis, name string, opts []dlock.Option, x *dlock.Client, q *queuedSignal) (*dlock.Lease, time.Time) {
	t.Helper()
	ctx := t.Context()
	hc := dlock.New(redislock.New(srv.Client(t)))
	t.Cleanup(func() { _ = hc.Close() })
	hl, err := hc.Mutex(name, opts...).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		l  *dlock.Lease
		at time.Time
	}
	out := make(chan got, 1)
	go func() {
		l, err := x.Mutex(name, opts...).Lock(ctx)
		if err != nil {
			t.Errorf("Lock: %v", err)
		}
		out <- got{l, time.Now()}
	}()
	<-q.queued
	<-q.queued
	if err := hl.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	g := <-out
	return g.l, g.at
}

// TestHandedLeaseWithinStoreExpiry: the lease a queued waiter builds from
// a handoff announcement must not outlive the handed grant on the store
// (Lease.Deadline: "the store cannot have let the lease go before then").
// The grant expires with the head's queue entry, whose time to live is the
// handle's QueueTTL: 3 s for a plain Mutex with the default TTL, 1 s with
// TTL 3 s (the floor), 5 s for a Fair one; with a 40 s TTL a plain Mutex
// takes no handoff. A handedLease that used another time to live than the
// requests (say 5 s for a plain handle) fails here, and in no other test.
func TestHandedLeaseWithinStoreExpiry(t *testing.T) {
	srv := testserver.StartRedis(t)
	for _, tc := range []struct {
		name    string
		opts    []dlock.Option
		handoff bool
	}{
		{"plain", nil, true},
		{"plain TTL 3s", []dlock.Option{dlock.WithTTL(3 * time.Second)}, true},
		{"fair", []dlock.Option{dlock.Fair()}, true},
		{"plain TTL 40s", []dlock.Option{dlock.WithTTL(40 * time.Second)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "handedlease/" + tc.name
			r := queueBehindHolder(t, srv, name, tc.opts)
			// X subscribes to the name's releases after its first attempt:
			// give it time to, so that it hears the handoff. (Its entry
			// was refreshed within 50 ms, well within a quarter of it.)
			time.Sleep(50 * time.Millisecond)
			l, handed := r.release(t)
			if l == nil {
				return
			}
			defer l.Unlock(context.Background())
			info, _, err := r.inner.Inspect(t.Context(), name)
			if err != nil {
				t.Fatal(err)
			}
			storeExp := time.Now().Add(info.TTL) // after the answer: errs late, never early
			t.Logf("handed %v; store TTL %v; lease deadline in %v", handed, info.TTL.Round(time.Millisecond), time.Until(l.Deadline()).Round(time.Millisecond))
			if handed != tc.handoff {
				t.Errorf("granted by handoff: %v; want %v", handed, tc.handoff)
			}
			if l.Deadline().After(storeExp.Add(20 * time.Millisecond)) {
				t.Errorf("lease Deadline %v after the store's expiry of the grant (fence %d, store TTL %v)",
					l.Deadline().Sub(storeExp).Round(time.Millisecond), l.Fence(), info.TTL.Round(time.Millisecond))
			}
		})
	}
}

// TestPlainHandoffLateInRefreshCycle: a queued waiter can use a handoff
// announcement only within safe − QueueTTL/4 of its last fair request, and
// must refresh its entry within that window, or the grants released late
// in its refresh cycle are claimed with a request instead. A plain waiter
// (default TTL: entries of 3 s, margin 1 s, a 1.25 s window, refreshes
// every 1 s) and a Fair one (5 s entries, a 2.75 s window, refreshes every
// 1.67 s) are released to 950 ms after they queued, just before a plain
// refresh. (With entries of twice the margin and refreshes every third of
// them, a plain waiter lost such handoffs: 2 of 31 waits handed in a run
// of 4 clients holding 190 ms each.)
func TestPlainHandoffLateInRefreshCycle(t *testing.T) {
	srv := testserver.StartRedis(t)
	for _, tc := range []struct {
		name string
		opts []dlock.Option
	}{
		{"fair", []dlock.Option{dlock.Fair()}},
		{"plain", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := queueBehindHolder(t, srv, "handoffwindow/"+tc.name, tc.opts)
			time.Sleep(950 * time.Millisecond) // before the plain 1 s refresh
			l, handed := r.release(t)
			if l != nil {
				_ = l.Unlock(t.Context())
			}
			if !handed {
				t.Errorf("%s: the queued waiter did not take the handoff released to it 950 ms after it queued (claimed with a request)", tc.name)
			}
		})
	}
}

// renewCounter is a queuedSignal that also records the time of every
// renewal call (Renew, RenewGrant, and one per request of a RenewBatch).
type renewCounter struct {
	*queuedSignal

	mu     sync.Mutex
	renews []time.Time
}

func (c *renewCounter) note(n int) {
	c.mu.Lock()
	for range n {
		c.renews = append(c.renews, time.Now())
	}
	c.mu.Unlock()
}

func (c *renewCounter) Renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	c.note(1)
	return c.queuedSignal.Renew(ctx, key, token, ttl)
}

func (c *renewCounter) RenewGrant(ctx context.Context, key, token string, fence uint64, ttl time.Duration) (bool, error) {
	c.note(1)
	return c.queuedSignal.RenewGrant(ctx, key, token, fence, ttl)
}

func (c *renewCounter) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) []driver.RenewResult {
	c.note(len(reqs))
	return c.queuedSignal.RenewBatch(ctx, reqs)
}

func (c *renewCounter) calls() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.renews...)
}

// TestHandedGrantFirstRenewal: a lease obtained by a direct handoff is
// trusted, until its first renewal answers, only until its head's last
// queued request S + the entry's time, less the margin; that renewal goes
// out early enough to leave 1.5 s for its answer, at half that time at the
// latest, and not sooner than 50 ms after the handoff (handedRenewBy). The
// holder here is handed the lock right after a queue refresh (S ≈ the
// handoff): a plain Mutex with the default TTL (3 s entries, S + 2 s)
// renews once at about S + 0.5 s when it holds 800 ms, not at all when it
// holds 10 ms; a Fair one (S + 4 s) keeps its first renewal at S + 2 s, so
// an 800 ms hold costs none; with a 3 s TTL (1 s entries, S + 0.7 s) a
// plain lease renews 50 ms after the handoff.
func TestHandedGrantFirstRenewal(t *testing.T) {
	srv := testserver.StartRedis(t)
	for _, tc := range []struct {
		name          string
		hold          time.Duration
		wantCalls     int
		first, within time.Duration // the first renewal's time after the handoff: first ± within
		opts          []dlock.Option
	}{
		{"held10ms", 10 * time.Millisecond, 0, 0, 0, nil},
		{"held800ms", 800 * time.Millisecond, 1, 500 * time.Millisecond, 150 * time.Millisecond, nil},
		{"fair-held800ms", 800 * time.Millisecond, 0, 0, 0, []dlock.Option{dlock.Fair()}},
		{"ttl3s-held300ms", 300 * time.Millisecond, 1, 50 * time.Millisecond, 100 * time.Millisecond, []dlock.Option{dlock.WithTTL(3 * time.Second)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			name := "handedrenew/" + tc.name
			rc := &renewCounter{queuedSignal: newQueuedSignal(redislock.New(srv.Client(t)))}
			obs, handed := handoffObserver()
			xc := dlock.New(rc, obs)
			defer xc.Close()
			l, at := handOverRightAfterRefresh(t, srv, name, tc.opts, xc, rc.queuedSignal)
			if l == nil {
				return
			}
			time.Sleep(tc.hold)
			if err := l.Unlock(ctx); err != nil {
				t.Fatalf("Unlock: %v", err)
			}
			// Anything scheduled (S + safe/2 is 1 s after S, 2 s for Fair) would
			// have gone out by now, had the grant stayed scheduled.
			time.Sleep(2500 * time.Millisecond)
			if !handed() {
				t.Fatal("setup: the lease was not handed over")
			}
			calls := rc.calls()
			var offs []time.Duration
			for _, c := range calls {
				offs = append(offs, c.Sub(at).Round(time.Millisecond))
			}
			t.Logf("held %v: renewals at %v after Lock returned", tc.hold, offs)
			if len(calls) != tc.wantCalls {
				t.Errorf("a handed lease held %v sent %d renewals (at %v after the handoff), want %d", tc.hold, len(calls), offs, tc.wantCalls)
			}
			if len(calls) > 0 {
				if d := calls[0].Sub(at); d < tc.first-tc.within || d > tc.first+tc.within {
					t.Errorf("first renewal of a handed lease %v after the handoff, want %v ± %v", d.Round(time.Millisecond), tc.first, tc.within)
				}
			}
		})
	}
}

// lapseStore delays the head's answers and its handoff notice (network /
// pause), so that its next queue refresh reaches the store after the
// handed grant lapsed and is answered Queued; the notice is delivered
// after that answer.
type lapseStore struct {
	*redislock.Backend
	d1, d2  time.Duration
	release func()
	mu      sync.Mutex
	n       int
	fn      func(key, next string)
	held    []string
	token   string
	log     func(string, ...any)
}

func (s *lapseStore) Listen(ctx context.Context, fn func(key, next string)) (driver.Listener, error) {
	s.mu.Lock()
	s.fn = fn
	s.mu.Unlock()
	return s.Backend.Listen(ctx, func(key, next string) {
		tok, fence := driver.ParseNext(next)
		s.mu.Lock()
		if fence > 0 && tok == s.token {
			s.held = append(s.held, next)
			s.mu.Unlock()
			s.log("notice held: fence %d", fence)
			return
		}
		s.mu.Unlock()
		fn(key, next)
	})
}

func (s *lapseStore) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	if !req.Handoff {
		return s.Backend.Acquire(ctx, req)
	}
	s.mu.Lock()
	s.n++
	n := s.n
	s.token = req.Token
	s.mu.Unlock()
	switch n {
	case 2:
		res, err := s.Backend.Acquire(ctx, req)
		s.log("R1 answered %+v", res)
		s.release()
		time.Sleep(s.d1) // the answer is slow
		return res, err
	case 3:
		time.Sleep(s.d2) // the request is slow
		res, err := s.Backend.Acquire(ctx, req)
		s.log("R2 answered %+v %v", res, err)
		s.mu.Lock()
		held, fn := s.held, s.fn
		s.held = nil
		s.mu.Unlock()
		for _, next := range held {
			fn(req.Key, next)
		}
		return res, err
	}
	return s.Backend.Acquire(ctx, req)
}

// TestHandoffNoticeAfterLapse: the head's answers and its handoff notice
// are delayed (a slow network, a paused process) so that its next queue
// refresh reaches the store after the handed grant lapsed and is answered
// "queued" behind a new holder, and only then is the notice delivered. The
// notice is stale (the refresh's fence counter shows it) and must not make
// a lease (it would make two live leases).
func TestHandoffNoticeAfterLapse(t *testing.T) {
	srv := testserver.StartRedis(t)
	const ttl = 3 * time.Second
	opts := []dlock.Option{dlock.Fair(), dlock.WithTTL(ttl)}
	holderC := dlock.New(redislock.New(srv.Client(t)))
	defer holderC.Close()
	otherC := dlock.New(redislock.New(srv.Client(t)))
	defer otherC.Close()
	inner := redislock.New(srv.Client(t))
	start := time.Now()
	st := &lapseStore{Backend: inner, d1: 1650 * time.Millisecond, d2: 600 * time.Millisecond,
		log: func(f string, a ...any) {
			t.Logf("%v: "+f, append([]any{time.Since(start).Round(time.Millisecond)}, a...)...)
		}}
	c := dlock.New(st)
	defer c.Close()
	ctx := t.Context()
	hl, err := holderC.Mutex("k", opts...).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st.release = func() { _ = hl.Unlock(ctx) }

	// X: another owner that takes the lock once the handed grant lapsed.
	xl := make(chan *dlock.Lease, 1)
	var xmu sync.Mutex // W checks X's lease under it, so X cannot unlock in between
	go func() {
		for {
			l, err := otherC.Mutex("k", opts...).TryLock(ctx)
			if err == nil {
				st.log("X got the lock, fence %d", l.Fence())
				xl <- l
				// Hold it a while, long enough for W's stale notice to
				// arrive, then let W in.
				time.Sleep(time.Second)
				xmu.Lock()
				_ = l.Unlock(ctx)
				xmu.Unlock()
				return
			}
			if ctx.Err() != nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()

	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	l, err := c.Mutex("k", opts...).Lock(wctx)
	if err != nil {
		t.Fatal(err)
	}
	st.log("W's Lock returned fence %d, err %v", l.Fence(), l.Err())
	var x *dlock.Lease
	select {
	case x = <-xl:
	default:
	}
	xmu.Lock()
	overlap := x != nil && x.Err() == nil && l.Err() == nil
	xmu.Unlock()
	if x != nil && l.Fence() <= x.Fence() {
		t.Errorf("W's fence %d is not above X's %d: W holds a grant older than X's", l.Fence(), x.Fence())
	}
	if overlap {
		t.Errorf("two live leases: X fence %d, W fence %d", x.Fence(), l.Fence())
		for x.Err() == nil && l.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		st.log("overlap ended: W %v / X %v", l.Err(), x.Err())
	}
	_ = l.Unlock(ctx)
	if x != nil {
		_ = x.Unlock(ctx)
	}
}

// promisedPause wraps the Backend of the plain waiter X. Once X's fair
// requests have found the lock free but promised to another head for a
// while (just short of promisedGrace), the answer to X's next fair request
// (S1, which refreshed X's queue entry on the store) comes back late: a
// slow network, or a pause of X's process right after the answer. During
// the pause, onPause runs (a reader takes the name). X's next request is
// then the non-fair one of the promisedGrace fallback (S2): the readers
// refuse it and it records a writer intent, so it is answered "queued",
// though it did not touch X's queue entry. onIntent runs after that
// answer (the head before X goes, the reader releases, and the release
// hands the lock to X, now the head).
type promisedPause struct {
	*redislock.Backend
	pause      time.Duration
	renewDelay time.Duration
	onPause    func()
	onIntent   func()

	mu         sync.Mutex
	queued     chan struct{} // closed at X's first queued fair request
	promisedAt time.Time
	fired      bool
	intentDone bool
	s1, s2     time.Time
}

func (p *promisedPause) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	sent := time.Now()
	res, err := p.Backend.Acquire(ctx, req)
	if err != nil || res.Acquired {
		return res, err
	}
	p.mu.Lock()
	switch {
	case req.Fair && req.Wait && res.Queued:
		if p.queued != nil {
			close(p.queued)
			p.queued = nil
		}
		if res.Holder != "" || res.HolderTTL > 0 || res.Shared > 0 || p.fired {
			break
		}
		if p.promisedAt.IsZero() {
			p.promisedAt = time.Now()
			break
		}
		if time.Since(p.promisedAt) >= 30*time.Millisecond {
			p.fired, p.s1 = true, sent
			p.mu.Unlock()
			p.onPause()
			time.Sleep(p.pause)
			return res, err
		}
	case !req.Fair && req.Wait && p.fired && !p.intentDone && res.Queued && res.Shared > 0:
		p.intentDone, p.s2 = true, sent
		go p.onIntent()
	}
	p.mu.Unlock()
	return res, err
}

// X's renewals are slow too once the pause happened (the same slow
// network): they reach the store renewDelay late.
func (p *promisedPause) slowRenew() {
	p.mu.Lock()
	fired := p.fired
	p.mu.Unlock()
	if fired {
		time.Sleep(p.renewDelay)
	}
}

func (p *promisedPause) Renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	p.slowRenew()
	return p.Backend.Renew(ctx, key, token, ttl)
}

func (p *promisedPause) RenewGrant(ctx context.Context, key, token string, fence uint64, ttl time.Duration) (bool, error) {
	p.slowRenew()
	return p.Backend.RenewGrant(ctx, key, token, fence, ttl)
}

func (p *promisedPause) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) []driver.RenewResult {
	p.slowRenew()
	return p.Backend.RenewBatch(ctx, reqs)
}

// TestPlainHandoffAfterNonFairQueuedAnswer: a plain waiter in the
// queue that falls back to a non-fair request after promisedGrace, and is
// answered "queued" because readers refused it and it recorded a writer
// intent, takes that request's send time (S2) as its queue entry's
// (waiter.answered sets w.queued). But a non-fair request does not refresh
// the queue entry: the entry, and so a grant handed to it, expires at the
// last fair request's arrival + QueueTTL. A release that then hands the
// lock to the waiter makes a lease trusted until S2 + QueueTTL − drift −
// margin, past the store's expiry of the handed grant; another client
// takes the lock while the first lease is still live.
//
// Needs a plain Mutex and RWMutex readers on one name (LOCK-KINDS: "a plain
// Mutex of a name is the write side of the RWMutex of that name"), and
// ~0.6 s+ (margin + drift − the time S1→S2 normally takes) between the
// arrival of the last fair request and the send of the non-fair one (a
// slow answer or a paused process; here 1.7 s with the default TTL 10 s,
// plain entries of 3 s, margin 1 s). The plain waiter takes the handoff in
// waiter.answered.
func TestPlainHandoffAfterNonFairQueuedAnswer(t *testing.T) {
	srv := testserver.StartRedis(t)
	ctx := t.Context()
	const name = "plainhandoff/nonfair"
	raw := redislock.New(srv.Client(t))
	holderC := dlock.New(redislock.New(srv.Client(t)))
	defer holderC.Close()
	readerC := dlock.New(redislock.New(srv.Client(t)))
	defer readerC.Close()
	otherC := dlock.New(redislock.New(srv.Client(t)))
	defer otherC.Close()

	var rl *dlock.Lease
	var rlMu sync.Mutex
	handedAt := make(chan time.Time, 1)
	st := &promisedPause{
		Backend:    redislock.New(srv.Client(t)),
		pause:      1700 * time.Millisecond,
		renewDelay: 500 * time.Millisecond,
		queued:     make(chan struct{}),
	}
	queued := st.queued
	st.onPause = func() {
		l, err := readerC.RWMutex(name).RLock(ctx)
		if err != nil {
			t.Errorf("reader: %v", err)
			return
		}
		rlMu.Lock()
		rl = l
		rlMu.Unlock()
	}
	st.onIntent = func() {
		time.Sleep(30 * time.Millisecond)
		// The head before X goes (as its entry lapses, or it gives up).
		if err := raw.Withdraw(ctx, name, "dead-head"); err != nil {
			t.Errorf("withdraw: %v", err)
		}
		rlMu.Lock()
		l := rl
		rlMu.Unlock()
		handedAt <- time.Now()
		if l != nil {
			_ = l.Unlock(ctx) // hands the lock to X, now the head
		}
	}
	xc := dlock.New(st)
	defer xc.Close()

	hl, err := holderC.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A head that takes no handoff (an older version, a Reentrant Fair
	// handle, a plain handle with a large margin...).
	res, err := raw.Acquire(ctx, driver.AcquireRequest{
		Key: name, Token: "dead-head", Owner: "dead-head", TTL: 10 * time.Second,
		Fair: true, Wait: true, QueueTTL: 5 * time.Second,
	})
	if err != nil || res.Acquired || !res.Queued {
		t.Fatalf("dead head: %+v %v", res, err)
	}

	type out struct {
		l   *dlock.Lease
		err error
	}
	xout := make(chan out, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		l, err := xc.Mutex(name).Lock(wctx)
		xout <- out{l, err}
	}()
	select {
	case <-queued:
	case <-time.After(5 * time.Second):
		t.Fatal("X never queued")
	}
	if err := hl.Unlock(ctx); err != nil { // free, promised to dead-head
		t.Fatal(err)
	}
	var xl *dlock.Lease
	select {
	case o := <-xout:
		if o.err != nil {
			t.Fatalf("X's Lock: %v", o.err)
		}
		xl = o.l
	case <-time.After(15 * time.Second):
		t.Fatal("X's Lock did not return")
	}
	now := time.Now()
	st.mu.Lock()
	fired, s1, s2 := st.fired, st.s1, st.s2
	st.mu.Unlock()
	if !fired || s2.IsZero() {
		// The wrapper's hooks force the interleaving; a run that misses it
		// checks nothing, and must not pass.
		t.Fatalf("setup: the interleaving was not reached (fired %v, non-fair queued answer %v): X got fence %d otherwise", fired, !s2.IsZero(), xl.Fence())
	}
	defer xl.Unlock(context.Background())
	pttl, err := srv.Client(t).PTTL(ctx, "dlock:{"+name+"}").Result()
	if err != nil {
		t.Fatal(err)
	}
	// The server answered between now and answered: the grant expires no
	// later than answered + pttl (+ the millisecond PTTL rounds off).
	answered := time.Now()
	storeExp := answered.Add(pttl + time.Millisecond)
	safe := xl.Deadline().Add(-time.Second) // default margin: TTL/10
	t.Logf("S1 (last fair, refreshed the entry) at 0; S2 (non-fair, answered queued) at +%v; lease deadline +%v (safe +%v); store expiry of the handed grant +%v",
		s2.Sub(s1).Round(time.Millisecond), xl.Deadline().Sub(s1).Round(time.Millisecond),
		safe.Sub(s1).Round(time.Millisecond), storeExp.Sub(s1).Round(time.Millisecond))
	if xl.Deadline().After(storeExp) {
		t.Errorf("X's handed lease (fence %d) has Deadline %v after the store's expiry of its grant (lease trusted until %v past it)",
			xl.Fence(), xl.Deadline().Sub(storeExp).Round(time.Millisecond), safe.Sub(storeExp).Round(time.Millisecond))
	}
	// Another client now takes the lock while X's lease is live.
	var lastErr error
	for time.Now().Before(safe) && time.Since(now) < 3*time.Second {
		ol, err := otherC.Mutex(name).TryLock(ctx)
		lastErr = err
		if err == nil {
			if xl.Err() == nil && time.Now().Before(safe) {
				t.Errorf("two holders: X (fence %d, live, safe deadline in %v) and another client (fence %d)",
					xl.Fence(), time.Until(safe).Round(time.Millisecond), ol.Fence())
			}
			_ = ol.Unlock(ctx)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("no other holder before X's safe deadline; last TryLock: %v; X's lease: %v", lastErr, xl.Err())
	select {
	case at := <-handedAt:
		t.Logf("handed at +%v", at.Sub(s1).Round(time.Millisecond))
	default:
	}
}
