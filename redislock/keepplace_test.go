package redislock_test

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/locktest/chaos"
	"github.com/dlock-go/dlock/redislock"
)

// queueOf returns the fair queue of key, head first.
func queueOf(t *testing.T, rdb *redis.Client, key string) []string {
	t.Helper()
	q, err := rdb.ZRange(t.Context(), "dlock:{"+key+"}:q", 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// A release that hands the lock to an entry whose client keeps its place
// queues the entry's successor at the tail, with the entry's owner and
// handoff channel, and says so in its announcement; an entry without
// KeepPlace gets none, and neither does one whose last request dropped it.
func TestReleaseQueuesTheHeadsSuccessor(t *testing.T) {
	holder, rdb, srv := setup(t)
	head, other := redislock.New(srv.Client(t)), redislock.New(srv.Client(t))
	heard := listenTo(t, head, "k")
	join := func(b *redislock.Backend, token, owner string, keep bool) {
		t.Helper()
		res := acquire(t, b, driver.AcquireRequest{Key: "k", Token: token, Owner: owner, TTL: 10 * time.Second,
			Fair: true, Wait: true, QueueTTL: 5 * time.Second, Handoff: true, KeepPlace: keep})
		if res.Acquired || !res.Queued {
			t.Fatalf("%s's join: %+v; want queued", owner, res)
		}
	}
	// Releases tied to their grant's fence, as the client sends them: a
	// release without one is a clean-up.
	release := func(b *redislock.Backend, token string, fence uint64) {
		t.Helper()
		if res, err := b.ReleaseGrant(t.Context(), "k", token, fence); err != nil || !res.Held {
			t.Fatalf("release of %s's grant %d: %+v, %v", token, fence, res, err)
		}
	}
	holderTok, headTok, otherTok := newToken(t), newToken(t), newToken(t)
	mustAcquire(t, holder, driver.AcquireRequest{Key: "k", Token: holderTok, Owner: "holder", TTL: 10 * time.Second, Fair: true})
	join(head, headTok, "head", true)
	join(other, otherTok, "other", false)
	headExp, err := rdb.ZScore(t.Context(), "dlock:{k}:qe", headTok).Result()
	if err != nil {
		t.Fatal(err)
	}

	release(holder, holderTok, 1)
	succ := driver.Successor(headTok)
	if got := queueOf(t, rdb, "k"); len(got) != 2 || got[0] != otherTok || got[1] != succ {
		t.Fatalf("queue after the handoff to the head: %q; want the other entry, then the head's successor %q", got, succ)
	}
	waitHeard(t, heard, "k "+driver.Handoff{Token: headTok, Fence: 2, Successor: true}.Next())
	if owner, _ := rdb.HGet(t.Context(), "dlock:{k}:qo", succ).Result(); owner != "head" {
		t.Errorf("the successor's owner: %q; want the head's", owner)
	}
	if ch, _ := rdb.HGet(t.Context(), "dlock:{k}:qo", "\x00"+succ).Result(); ch == "" || !strings.Contains(redislock.HandoffChannel(head, "k"), ":ho:"+ch+":") {
		t.Errorf("the successor's handoff channel id: %q; want the head's (%s)", ch, redislock.HandoffChannel(head, "k"))
	}
	if ms, err := rdb.ZScore(t.Context(), "dlock:{k}:qe", succ).Result(); err != nil || ms != headExp {
		t.Errorf("the successor's entry expires at %v (%v); want the head's entry's expiry, %v", ms, err, headExp)
	}

	// The head's release hands the lock to the other entry, which keeps
	// no place: no successor.
	release(head, headTok, 2)
	if got := queueOf(t, rdb, "k"); len(got) != 1 || got[0] != succ {
		t.Fatalf("queue after the handoff to the other entry: %q; want the successor alone", got)
	}
	// Its release hands it to the successor, which keeps the place as the
	// head's entry did.
	release(other, otherTok, 3)
	if got, _ := rdb.HGet(t.Context(), "dlock:{k}", "owner").Result(); got != "head" {
		t.Fatalf("owner after the other's release: %q; want the successor (owned by the head)", got)
	}
	if got := queueOf(t, rdb, "k"); len(got) != 1 || got[0] != driver.Successor(succ) {
		t.Fatalf("queue after the handoff to the successor: %q; want its own successor", got)
	}

	// A request of the successor's successor without KeepPlace drops it:
	// the next handoff queues none, and the queue is empty after it.
	join(head, driver.Successor(succ), "head", false)
	release(head, succ, 4)
	if got := queueOf(t, rdb, "k"); len(got) != 0 {
		t.Errorf("queue after a handoff to an entry that dropped KeepPlace: %q; want empty", got)
	}
	if left, _ := rdb.Exists(t.Context(), "dlock:{k}:qo", "dlock:{k}:qe").Result(); left != 0 {
		t.Errorf("%d of the queue's keys left with an empty queue", left)
	}
}

// A client that keeps its place and then stops asking (it died) keeps
// nothing past the entry of its last request: the successor that a
// handoff to its entry queues expires with that entry, so the lock comes
// round to it at most until then, and the next waiter gets the lock.
func TestDeadClientsPlaceLapsesWithItsLastEntry(t *testing.T) {
	holder, rdb, srv := setup(t)
	dead, next := redislock.New(srv.Client(t)), redislock.New(srv.Client(t))
	holderTok, deadTok, nextTok := newToken(t), newToken(t), newToken(t)
	mustAcquire(t, holder, driver.AcquireRequest{Key: "k", Token: holderTok, Owner: "holder", TTL: 10 * time.Second, Fair: true})
	const qttl = time.Second
	waitReq := func(token, owner string, keep bool) driver.AcquireRequest {
		return driver.AcquireRequest{Key: "k", Token: token, Owner: owner, TTL: 10 * time.Second,
			Fair: true, Wait: true, QueueTTL: qttl, Handoff: true, KeepPlace: keep}
	}
	if res := acquire(t, dead, waitReq(deadTok, "dead", true)); !res.Queued {
		t.Fatalf("the dead client's join: %+v; want queued", res)
	}
	joined := time.Now()
	if res := acquire(t, next, waitReq(nextTok, "next", false)); !res.Queued {
		t.Fatalf("the next client's join: %+v; want queued", res)
	}
	// Half the dead client's entry has gone by when the lock comes to it: a
	// successor that lived QueueTTL from the handoff would outlast it.
	time.Sleep(qttl / 2)
	if res, err := holder.ReleaseGrant(t.Context(), "k", holderTok, 1); err != nil || !res.Held {
		t.Fatalf("release: %+v, %v", res, err)
	}
	if got := queueOf(t, rdb, "k"); len(got) != 2 || got[1] != driver.Successor(deadTok) {
		t.Fatalf("queue after the handoff to the dead client: %q; want the next client, then the successor", got)
	}
	// The next client asks until it gets the lock, as its wait would.
	for {
		res := acquire(t, next, waitReq(nextTok, "next", false))
		if res.Acquired {
			break
		}
		if time.Since(joined) > qttl+2*time.Second {
			t.Fatalf("the next client waited %v for a lock that the dead client's entry held: %+v", time.Since(joined), res)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := queueOf(t, rdb, "k"); len(got) != 0 {
		t.Errorf("queue once the next client holds the lock: %q; want the dead client's places gone", got)
	}
}

// The goroutines of one Client that take turns at a Fair Mutex hand it on
// without a request to join the queue: the release that hands the lock to
// one waiter queues the Client's next place, which the next waiter takes.
func TestFairHandOverWithinAClientJoinsNoQueue(t *testing.T) {
	_, _, srv := setup(t)
	rdb := srv.Client(t)
	var acquires atomic.Int64
	rdb.AddHook(acquireCounter{sha: redislock.AcquireScriptHash(), n: &acquires})
	c := dlock.New(redislock.New(rdb))
	defer c.Close()
	m := c.Mutex("k", dlock.Fair())
	const workers, rounds = 4, 25
	var turns []turnTaker
	for range workers {
		turns = append(turns, turnTaker{lock: m.Lock})
	}
	takeTurns(t, rounds, turns...)
	// Each Lock that found the Client waiting on the name already joins its
	// group without a request; only a Lock that found nobody waiting (the
	// first, and any that came when the others were all between Unlock and
	// Lock) sends one. How many find nobody depends on the scheduling (3 to
	// 30 of 100 seen, the most on a loaded machine); a hand-over that
	// joined the queue would cost a request each, more than the grants.
	grants := int64(workers * rounds)
	if n := acquires.Load(); n > grants/2 {
		t.Errorf("%d acquire requests for %d grants; want at most half as many: hand-overs within the Client joined the queue", n, grants)
	}
	waitFree(t, redislock.New(rdb), "k")
}

// waitFree waits up to 5s for key to be free, with an empty queue: the
// place that the last waiter passed on, which no waiter took, is withdrawn
// in the background.
func waitFree(t *testing.T, b *redislock.Backend, key string) {
	t.Helper()
	var info driver.LockInfo
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var err error
		info, _, err = b.Inspect(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		if info.Queued == 0 && info.Holds == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lock after every waiter left: %+v; want free, with an empty queue", info)
		}
	}
}

// Waiters of one Client that give up while they hold the Client's place,
// or just after a release handed it the lock, leave nothing behind: the
// place's clean-up takes its successor with it, and a place passed on to
// nobody is withdrawn. Another Client's fair waiter then gets the lock.
func TestGivenUpPlacesLeaveNothing(t *testing.T) {
	_, _, srv := setup(t)
	c := dlock.New(redislock.New(srv.Client(t)))
	defer c.Close()
	other := dlock.New(redislock.New(srv.Client(t)))
	defer other.Close()
	m := c.Mutex("k", dlock.Fair())
	for round := range 20 {
		holder, err := m.Lock(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		// Three waiters of the holder's Client, each giving up a little
		// later than the one before, around the holder's release.
		var wg sync.WaitGroup
		for i := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(t.Context(), time.Duration(5+5*i)*time.Millisecond)
				defer cancel()
				if l, err := m.Lock(ctx); err == nil {
					time.Sleep(time.Duration(round%4) * time.Millisecond)
					_ = l.Unlock(t.Context())
				}
			}()
		}
		time.Sleep(time.Duration(round%8) * time.Millisecond)
		if err := holder.Unlock(t.Context()); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		l, err := other.Mutex("k", dlock.Fair()).Lock(ctx)
		cancel()
		if err != nil {
			t.Fatalf("round %d: another Client's Lock after the waiters left: %v", round, err)
		}
		if err := l.Unlock(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	waitFree(t, redislock.New(srv.Client(t)), "k")
}

// acquireCounter counts the EVALSHA calls of the acquire script; with
// keepOnly, those that ask to keep the Client's place (ARGV[16] "1").
type acquireCounter struct {
	sha      string
	n        *atomic.Int64
	keepOnly bool
}

func (a acquireCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (a acquireCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a.count(cmd)
		return next(ctx, cmd)
	}
}

func (a acquireCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			a.count(cmd)
		}
		return next(ctx, cmds)
	}
}

func (a acquireCounter) count(cmd redis.Cmder) {
	if args := cmd.Args(); len(args) > 1 && cmd.Name() == "evalsha" && args[1] == a.sha && (!a.keepOnly || args[len(args)-1] == "1") {
		a.n.Add(1)
	}
}

// An entry that the successor's token made by a request of its own (a wait
// that went on with Successor(token) after an attempt of unknown outcome,
// whose clean-up of token has not landed) lives QueueTTL from that
// request, however a later handoff to token queues its successor: the
// waiter's handed lease trusts the grant until its own request's time +
// QueueTTL (handedLease), so neither the entry nor the grant it is handed
// may expire sooner.
func TestSuccessorEntryKeepsItsOwnRequestsExpiry(t *testing.T) {
	holder, rdb, srv := setup(t)
	waiter := redislock.New(srv.Client(t))
	const qttl = 2 * time.Second
	waitReq := func(token string) driver.AcquireRequest {
		return driver.AcquireRequest{Key: "k", Token: token, Owner: "waiter", TTL: 10 * time.Second,
			Fair: true, Wait: true, QueueTTL: qttl, Handoff: true, KeepPlace: true}
	}
	holderTok, tok := newToken(t), newToken(t)
	succ := driver.Successor(tok)
	mustAcquire(t, holder, driver.AcquireRequest{Key: "k", Token: holderTok, Owner: "holder", TTL: 10 * time.Second, Fair: true})
	if res := acquire(t, waiter, waitReq(tok)); !res.Queued {
		t.Fatalf("join of %s: %+v; want queued", tok, res)
	}
	time.Sleep(qttl / 2)
	// The wait goes on with the successor's token, whose request queues it
	// QueueTTL from now; tok's entry is still there.
	if res := acquire(t, waiter, waitReq(succ)); !res.Queued {
		t.Fatalf("join of %s: %+v; want queued", succ, res)
	}
	own, err := rdb.ZScore(t.Context(), "dlock:{k}:qe", succ).Result()
	if err != nil {
		t.Fatal(err)
	}
	if res, err := holder.ReleaseGrant(t.Context(), "k", holderTok, 1); err != nil || !res.Held {
		t.Fatalf("release: %+v, %v", res, err)
	}
	if ms, err := rdb.ZScore(t.Context(), "dlock:{k}:qe", succ).Result(); err != nil || ms < own {
		t.Errorf("the successor's entry expires at %v (%v) after the handoff to %s; want no sooner than its own request made it, %v (%v sooner)",
			ms, err, tok, own, time.Duration(own-ms)*time.Millisecond)
	}
	// tok's clean-up lands: the lock goes to the successor's entry.
	if res, err := waiter.Release(t.Context(), "k", tok); err != nil || !res.Held {
		t.Fatalf("clean-up of %s: %+v, %v", tok, res, err)
	}
	if got, _ := rdb.HGet(t.Context(), "dlock:{k}", succ).Result(); got != "1" {
		t.Fatalf("the lock after %s's clean-up: %s's holds %q; want it handed to %s", tok, succ, got, succ)
	}
	pttl, err := rdb.PTTL(t.Context(), "dlock:{k}").Result()
	if err != nil {
		t.Fatal(err)
	}
	now, err := rdb.Time(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	if until := float64(now.Add(pttl).UnixMilli()); until < own-5 {
		t.Errorf("the grant handed to %s expires %v before the time its request's entry promised", succ, time.Duration(own-until)*time.Millisecond)
	}
}

// loseAnswer runs one EVALSHA of the acquire script, the n-th the hook
// sees that asks to keep the Client's place (ARGV[16] "1"), and delay
// after it ran calls landed with the request's token and reports its
// answer lost (io.EOF, a transient error): the request ran, its outcome is
// unknown to the client.
type loseAnswer struct {
	sha    string
	seen   *atomic.Int64
	n      int64
	delay  time.Duration
	landed func(token string)
}

func (a loseAnswer) DialHook(next redis.DialHook) redis.DialHook { return next }

func (a loseAnswer) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if len(args) < 2 || cmd.Name() != "evalsha" || args[1] != a.sha {
			return next(ctx, cmd)
		}
		if args[len(args)-1] != "1" || a.seen.Add(1) != a.n {
			return next(ctx, cmd)
		}
		if err := next(ctx, cmd); err != nil {
			return err
		}
		nk, _ := strconv.Atoi(fmt.Sprint(args[2]))
		time.Sleep(a.delay)
		a.landed(fmt.Sprint(args[3+nk]))
		cmd.SetErr(io.EOF)
		return io.EOF
	}
}

func (a loseAnswer) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A wait whose request to keep the Client's place ran but went unanswered
// (its outcome unknown) leaves no place behind that nobody takes: a release
// may have handed the request's token the lock, and queued its successor,
// before the wait's clean-up of that token lands; the clean-up must not
// hand the lock to that successor, which no waiter of the Client will
// claim (the wait went on with another token), and which would hold the
// lock up for everyone until the request's entry lapsed.
func TestUnansweredKeepPlaceRequestLeavesNoPlaceBehind(t *testing.T) {
	_, rdb, srv := setup(t)
	other := dlock.New(redislock.New(srv.Client(t)))
	defer other.Close()
	held, err := other.Mutex("k", dlock.Fair()).Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	released := make(chan time.Time, 1)
	hooked := srv.Client(t)
	var seen atomic.Int64
	// The first request of the Client's waiter is its first try, which
	// queues it; the second, its first refresh, asks to keep the place
	// (another waiter of the Client waits by then). Its answer is lost
	// after the holder's release handed its token the lock.
	hooked.AddHook(loseAnswer{sha: redislock.AcquireScriptHash(), seen: &seen, n: 1, landed: func(string) {
		if err := held.Unlock(context.Background()); err != nil {
			t.Error(err)
		}
		released <- time.Now()
	}})
	c := dlock.New(redislock.New(hooked))
	defer c.Close()
	m := c.Mutex("k", dlock.Fair(), dlock.WithTTL(3*time.Second))
	got := make(chan time.Time, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			l, err := m.Lock(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			got <- time.Now()
			_ = l.Unlock(t.Context())
		}()
		if i == 0 {
			time.Sleep(100 * time.Millisecond) // the first waiter's first try is answered
		}
	}
	wg.Wait()
	var at time.Time
	select {
	case at = <-released:
	default:
		t.Fatal("the refresh whose answer was to be lost never went out")
	}
	first := <-got
	if d := first.Sub(at); d > 2*time.Second {
		t.Errorf("the Client's first waiter got the lock %v after the holder's release; want well under the entry's 3s: a place its lost request kept held the lock (queue %q)", d, queueOf(t, rdb, "k"))
	}
	waitFree(t, redislock.New(rdb), "k")
}

// ReleasePlace takes the successor's entry out before it hands the lock
// on, whatever the token holds: also a grant that its request claimed
// (the handed grant, answered), whose release takes the handoff fast path.
func TestReleasePlaceOfAClaimedGrantTakesTheSuccessorOut(t *testing.T) {
	holder, rdb, srv := setup(t)
	waiter := redislock.New(srv.Client(t))
	req := func(token string) driver.AcquireRequest {
		return driver.AcquireRequest{Key: "k", Token: token, Owner: "waiter", TTL: 10 * time.Second,
			Fair: true, Wait: true, QueueTTL: 5 * time.Second, Handoff: true, KeepPlace: true}
	}
	holderTok, tok := newToken(t), newToken(t)
	mustAcquire(t, holder, driver.AcquireRequest{Key: "k", Token: holderTok, Owner: "holder", TTL: 10 * time.Second, Fair: true})
	if res := acquire(t, waiter, req(tok)); !res.Queued {
		t.Fatalf("join: %+v; want queued", res)
	}
	if res, err := holder.ReleaseGrant(t.Context(), "k", holderTok, 1); err != nil || !res.Held {
		t.Fatalf("release: %+v, %v", res, err)
	}
	// The waiter claims the handed grant with a request, and gives it up
	// as a place's clean-up (its client kept the place, and none of its
	// waiters will take it).
	if res := acquire(t, waiter, req(tok)); !res.Acquired {
		t.Fatalf("claim of the handed grant: %+v; want granted", res)
	}
	if res, err := waiter.ReleasePlace(t.Context(), "k", tok); err != nil || !res.Held {
		t.Fatalf("ReleasePlace: %+v, %v", res, err)
	}
	if q := queueOf(t, rdb, "k"); len(q) != 0 {
		t.Errorf("queue after ReleasePlace of %s: %q; want the successor's entry gone", tok, q)
	}
	if owner, _ := rdb.HGet(t.Context(), "dlock:{k}", "owner").Result(); owner != "" {
		t.Errorf("the lock after ReleasePlace of %s: owned by %q; want it free, not handed to the successor", tok, owner)
	}
}

// A wait that gives up (its context ends) while its request to keep the
// Client's place is under way cleans up as one that kept it: a release may
// have handed the request's token the lock, and queued its successor,
// which no waiter of the Client will claim.
func TestCancelledKeepPlaceRequestLeavesNoPlaceBehind(t *testing.T) {
	givenUpPlaceLeavesNothing(t, false, 1)
}

// A wait that gives up after a release handed its token the lock, and
// queued the token's successor, leaves nothing that nobody claims, on the
// bare Backend and through a wrapper of it that forwards its capabilities
// (chaos.Observe, as the chaos tests run redislock): a Client keeps places
// only where its clean-up can take the successor with it
// (driver.PlaceReleaser).
func TestGivenUpPlaceBehindAWrapperLeavesNothing(t *testing.T) {
	for _, wrapped := range []bool{false, true} {
		name := "bare"
		if wrapped {
			name = "chaos.Observe"
		}
		t.Run(name, func(t *testing.T) {
			// The second request that keeps the place (the first,
			// answered, made the wait's token keep it).
			givenUpPlaceLeavesNothing(t, wrapped, 2)
		})
	}
}

// givenUpPlaceLeavesNothing runs two waiters of one Client (its backend
// wrapped in chaos.Observe when wrapped) on a fair lock that another
// Client holds. The n-th request that keeps the place runs, the holder's
// release then hands its token the lock, and the first waiter gives up
// before it reads the answer; the second gives up too. Another Client's
// Lock must then get the lock at once, not when the entry lapses.
func givenUpPlaceLeavesNothing(t *testing.T, wrapped bool, n int64) {
	t.Helper()
	_, rdb, srv := setup(t)
	other := dlock.New(redislock.New(srv.Client(t)))
	defer other.Close()
	held, err := other.Mutex("k", dlock.Fair()).Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ctx1, cancel1 := context.WithCancel(t.Context())
	defer cancel1()
	released := make(chan time.Time, 1)
	hooked := srv.Client(t)
	var seen atomic.Int64
	hooked.AddHook(loseAnswer{sha: redislock.AcquireScriptHash(), seen: &seen, n: n, landed: func(string) {
		if err := held.Unlock(context.Background()); err != nil {
			t.Error(err)
		}
		released <- time.Now()
		cancel1() // the first waiter gives up, its request's answer unread
	}})
	var b driver.Backend = redislock.New(hooked)
	if wrapped {
		b = chaos.Observe(b, chaos.NewRecorder(), "c")
	}
	c := dlock.New(b)
	defer c.Close()
	m := c.Mutex("k", dlock.Fair(), dlock.WithTTL(3*time.Second))
	first := make(chan error, 1)
	go func() {
		_, err := m.Lock(ctx1)
		first <- err
	}()
	time.Sleep(100 * time.Millisecond) // the first waiter's first try is answered
	ctx2, cancel2 := context.WithCancel(t.Context())
	second := make(chan error, 1)
	go func() {
		l, err := m.Lock(ctx2)
		if err == nil {
			// The first waiter's clean-up left the lock free in time for
			// this one: it lets it go.
			err = l.Unlock(t.Context())
		}
		second <- err
	}()
	if err := <-first; err == nil {
		t.Fatal("the first waiter got the lock; want it to give up")
	}
	at := <-released
	// The second waiter of the Client gives up too: nobody of the Client
	// wants the lock any more.
	cancel2()
	<-second
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	l, err := other.Mutex("k", dlock.Fair()).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(t.Context())
	if d := time.Since(at); d > 2*time.Second {
		t.Errorf("another Client got the lock %v after the release, with nobody else waiting; want well under the entry's 3s (queue %q)", d, queueOf(t, rdb, "k"))
	}
}

// holdRelease holds back the release (an EVALSHA of more than six
// arguments, not the acquire script's) of the token that token() names,
// once, until go is closed.
type holdRelease struct {
	acquireSHA string
	token      func() string
	held       chan struct{}
	goOn       chan struct{}
	once       *sync.Once
}

func (h holdRelease) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h holdRelease) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if cmd.Name() == "evalsha" && len(args) > 3 && args[1] != h.acquireSHA {
			nk, _ := strconv.Atoi(fmt.Sprint(args[2]))
			if tok := h.token(); tok != "" && len(args) >= 3+nk+7 && fmt.Sprint(args[3+nk]) == tok {
				hold := false
				h.once.Do(func() { hold = true })
				if hold {
					close(h.held)
					<-h.goOn
				}
			}
		}
		return next(ctx, cmd)
	}
}

func (h holdRelease) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A wait whose request to keep the Client's place went unanswered goes on
// with the token's successor (retoken), whose own request queues it for
// QueueTTL from then. When the old token's entry is still queued (its
// clean-up is slow to land), a release that hands the old token the lock
// must not cut the successor's entry down to the old one's expiry: the
// grant that the clean-up then hands the successor would expire on the
// store before the lease that the wait makes of it (handedLease trusts it
// QueueTTL from the successor's own request), and another Client would get
// the lock while that lease is live.
func TestRetokenedPlaceHandedLeaseOutlivesNoStoreHold(t *testing.T) {
	t.Parallel() // seconds of deliberate delays
	_, rdb, srv := setup(t)
	other := dlock.New(redislock.New(srv.Client(t)))
	defer other.Close()
	holder := redislock.New(srv.Client(t))
	holderTok := newToken(t)
	mustAcquire(t, holder, driver.AcquireRequest{Key: "k", Token: holderTok, Owner: "holder", TTL: 30 * time.Second, Fair: true})

	var lostTok atomic.Value
	lostTok.Store("")
	hooked := srv.Client(t)
	var seen atomic.Int64
	// The second request that keeps the place (the first, answered, made
	// the wait's token keep it) runs, and its answer is lost 2.2s later.
	lost := make(chan time.Time, 1)
	hooked.AddHook(loseAnswer{sha: redislock.AcquireScriptHash(), seen: &seen, n: 2, delay: 2200 * time.Millisecond,
		landed: func(tok string) { lostTok.Store(tok); lost <- time.Now() }})
	held, goOn := make(chan struct{}), make(chan struct{})
	hooked.AddHook(holdRelease{acquireSHA: redislock.AcquireScriptHash(), token: func() string { return lostTok.Load().(string) },
		held: held, goOn: goOn, once: new(sync.Once)})
	c := dlock.New(redislock.New(hooked))
	defer c.Close()
	m := c.Mutex("k", dlock.Fair(), dlock.WithTTL(3*time.Second))
	leases := make(chan *dlock.Lease, 2)
	for i := range 2 {
		go func() {
			ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
			defer cancel()
			if l, err := m.Lock(ctx); err == nil {
				leases <- l
			}
		}()
		if i == 0 {
			time.Sleep(100 * time.Millisecond)
		}
	}
	t0 := <-lost
	<-held // the clean-up of the lost request's token waits
	tok := lostTok.Load().(string)
	succ := driver.Successor(tok)
	// The wait's request with the successor's token queues it.
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := rdb.ZScore(t.Context(), "dlock:{k}:qe", succ).Result(); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the wait never queued %s", succ)
		}
	}
	t.Logf("successor queued %v after the lost request", time.Since(t0))
	// The holder's release hands the lock to the old token, still queued;
	// then its clean-up lands, and hands the lock to the successor.
	if res, err := holder.ReleaseGrant(t.Context(), "k", holderTok, 1); err != nil || !res.Held {
		t.Fatalf("release: %+v, %v", res, err)
	}
	close(goOn)
	var l *dlock.Lease
	select {
	case l = <-leases:
	case <-time.After(5 * time.Second):
		t.Fatal("the wait got no lease")
	}
	// The store's hold ends when the old token's entry would have; the
	// lease's deadline must have passed by then, before anyone else (the
	// Client's other waiter, another Client) can hold the lock. A read that
	// finds the hold gone and returns before the deadline shows it gone
	// while the lease is live (the lease's own end may lag on a busy
	// machine; its deadline does not).
	for stop := time.Now().Add(5 * time.Second); time.Now().Before(stop) && l.Err() == nil; {
		h, err := rdb.HGetAll(t.Context(), "dlock:{k}").Result()
		if err != nil {
			t.Fatal(err)
		}
		if read := time.Now(); h[succ] == "" && read.Before(l.Deadline()) {
			t.Errorf("the store's lock is %v, not held by %s, while the wait's lease (fence %d) is live, its deadline %v ahead",
				h, succ, l.Fence(), l.Deadline().Sub(read).Round(time.Millisecond))
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	_ = l.Unlock(t.Context())
}

// A successor whose token its client gave up before the release that would
// queue it (the clean-up found it holding nothing, and recorded it) is not
// queued: nobody would take it, and a handoff to it would hold the lock up
// until its entry lapsed.
func TestGivenUpSuccessorIsNotQueued(t *testing.T) {
	holder, rdb, srv := setup(t)
	waiter := redislock.New(srv.Client(t))
	heard := listenTo(t, waiter, "k")
	holderTok, tok := newToken(t), newToken(t)
	mustAcquire(t, holder, driver.AcquireRequest{Key: "k", Token: holderTok, Owner: "holder", TTL: 10 * time.Second, Fair: true})
	if res := acquire(t, waiter, driver.AcquireRequest{Key: "k", Token: tok, Owner: "waiter", TTL: 10 * time.Second,
		Fair: true, Wait: true, QueueTTL: 5 * time.Second, Handoff: true, KeepPlace: true}); !res.Queued {
		t.Fatalf("join: %+v; want queued", res)
	}
	// The client gives the successor's place up before any release made it.
	if _, err := waiter.ReleasePlace(t.Context(), "k", driver.Successor(tok)); err != nil {
		t.Fatal(err)
	}
	if res, err := holder.ReleaseGrant(t.Context(), "k", holderTok, 1); err != nil || !res.Held {
		t.Fatalf("release: %+v, %v", res, err)
	}
	waitHeard(t, heard, "k "+driver.Handoff{Token: tok, Fence: 2}.Next())
	if msgs := heard.all(); slices.Contains(msgs, "k "+driver.Handoff{Token: tok, Fence: 2, Successor: true}.Next()) {
		t.Errorf("the handoff announced a successor: %q", msgs)
	}
	if got := queueOf(t, rdb, "k"); len(got) != 0 {
		t.Errorf("queue after the handoff: %q; want no successor of a token given up", got)
	}
}

// Writers and readers of one Client on a fair RWMutex share the Client's
// group for the name, where the writers keep the Client's place and pass
// it on, and readers take turns between them. With a writer and a reader
// of another Client beside them, no reader shares the lock with a writer,
// no two writers hold it at once, every call gets the lock, and the lock
// ends free with an empty queue.
func TestFairRWMutexWritersKeepPlacesBesideReaders(t *testing.T) {
	_, _, srv := setup(t)
	rdb := srv.Client(t)
	var kept atomic.Int64
	rdb.AddHook(acquireCounter{sha: redislock.AcquireScriptHash(), n: &kept, keepOnly: true})
	c := dlock.New(redislock.New(rdb))
	defer c.Close()
	other := dlock.New(redislock.New(srv.Client(t)))
	defer other.Close()
	var writers, readers atomic.Int64
	writer := func(rw *dlock.RWMutex) turnTaker {
		return turnTaker{lock: rw.Lock, inside: func() error {
			defer writers.Add(-1)
			if n := writers.Add(1); n != 1 || readers.Load() != 0 {
				return fmt.Errorf("a writer holds the lock beside %d writers and %d readers", n-1, readers.Load())
			}
			time.Sleep(200 * time.Microsecond)
			return nil
		}}
	}
	reader := func(rw *dlock.RWMutex) turnTaker {
		return turnTaker{lock: rw.RLock, inside: func() error {
			readers.Add(1)
			defer readers.Add(-1)
			if n := writers.Load(); n != 0 {
				return fmt.Errorf("a reader holds the lock beside %d writers", n)
			}
			time.Sleep(200 * time.Microsecond)
			return nil
		}}
	}
	mine, theirs := c.RWMutex("k", dlock.Fair()), other.RWMutex("k", dlock.Fair())
	// Three writers and two readers of one Client, a writer and a reader of
	// another.
	takeTurns(t, 20, writer(mine), writer(mine), writer(mine), reader(mine), reader(mine), writer(theirs), reader(theirs))
	if kept.Load() == 0 {
		t.Error("no writer's request asked to keep the Client's place: the run proves nothing")
	}
	waitFree(t, redislock.New(srv.Client(t)), "k")
}

// turnTaker is a goroutine of takeTurns: its lock, and what it does while
// it holds the lock (nil: a 200µs critical section).
type turnTaker struct {
	lock   func(context.Context) (*dlock.Lease, error)
	inside func() error
}

// takeTurns runs each taker in a goroutine of its own, rounds times: lock
// (within 20s), its critical section, unlock. A failed call ends that
// goroutine; every error fails the test once all have ended.
func takeTurns(t *testing.T, rounds int, takers ...turnTaker) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 2*len(takers)*rounds)
	for _, tk := range takers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
				l, err := tk.lock(ctx)
				cancel()
				if err != nil {
					errs <- err
					return
				}
				if tk.inside == nil {
					time.Sleep(200 * time.Microsecond)
				} else if err := tk.inside(); err != nil {
					errs <- err
				}
				if err := l.Unlock(t.Context()); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A place passed from goroutine to goroutine of one Client without a
// request of theirs is still refreshed a third of its QueueTTL after the
// request that last set its expiry, by the goroutine that holds it: the
// successor's entry inherits its predecessor's expiry, and a goroutine
// that counted from its own turn, as it does for a place of its own
// making, would leave it until a handoff came too late to be trusted
// (about three quarters of the QueueTTL). Over a run longer than that,
// every entry the queue holds has more than half its QueueTTL left.
func TestKeptPlaceIsRefreshedAlongAChain(t *testing.T) {
	t.Parallel() // seconds of hand-overs
	_, rdb, srv := setup(t)
	c := dlock.New(redislock.New(srv.Client(t)))
	defer c.Close()
	const qttl = 5 * time.Second // refreshed every 1.67s
	m := c.Mutex("k", dlock.Fair(), dlock.WithTTL(6*time.Second))
	stop := make(chan struct{})
	sampled := make(chan time.Duration, 1)
	go func() {
		least := time.Duration(math.MaxInt64)
		defer func() { sampled <- least }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			entries, err := rdb.ZRangeWithScores(context.Background(), "dlock:{k}:qe", 0, -1).Result()
			if err != nil {
				continue
			}
			now, err := rdb.Time(context.Background()).Result()
			if err != nil {
				continue
			}
			for _, e := range entries {
				least = min(least, time.UnixMilli(int64(e.Score)).Sub(now))
			}
		}
	}()
	hold := turnTaker{lock: m.Lock, inside: func() error { time.Sleep(30 * time.Millisecond); return nil }}
	takeTurns(t, 55, hold, hold, hold) // about 5s of hand-overs
	close(stop)
	if least := <-sampled; least < qttl/2 {
		t.Errorf("an entry of the chain had %v left; want more than half its QueueTTL (%v): the place was not refreshed in time", least, qttl)
	}
	waitFree(t, redislock.New(srv.Client(t)), "k")
}
