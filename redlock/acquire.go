package redlock

import (
	"context"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/redisnode"
)

// How Acquire works. It grants the lock named req.Key to req.Token when a
// quorum of nodes grant it, by the Redlock algorithm:
//
//  1. The request goes to every node at once, one goroutine per node, and
//     Acquire waits for each answer at most min(node timeout, TTL/10). It
//     decides as soon as Q nodes have granted (Q = N/2+1) or enough have
//     refused or failed that Q grants are impossible: a slow or dead node
//     never delays a success. A node's call is not cut short when the wait
//     ends (see Backend.callLimit): its answer, read late, decides its
//     follow-up, and its connection is kept. On a contended key the
//     request goes to the key's leader node first (see leaderFor), and
//     elapsed counts from then.
//  2. The grant's fence F is the highest fence among the Q winning nodes.
//     Winning nodes that drew a lower fence get F by RaiseFence, concurrently
//     (a second round trip, needed only when the nodes' counters differ);
//     unless Q nodes end up carrying F, nothing is granted.
//  3. The grant is valid for TTL − elapsed − Drift(TTL); when that is not
//     positive nothing is granted and the error wraps ErrValidityElapsed.
//
// When the lock is held by others on enough nodes that no quorum is
// possible, the result is not acquired, with a nil error: Holder is the
// owner that most of those nodes reported, and HolderTTL an estimate of when
// a quorum could be free (see busyResult: the time until enough of the busy
// nodes expire, or a short random delay when contenders split the nodes).
// When failures or timeouts prevent a quorum, the error is a *QuorumError
// (Op "acquire") listing the failed nodes; when ctx ends first, it wraps
// ctx's error.
//
// Whenever nothing is granted, the nodes that granted, and for a
// non-reentrant request also those that failed or timed out (their outcome
// is unknown), are released in the background; each release is sent only
// once that node's own acquire has returned, so it can never overtake it
// (see Backend.enqueue). After a refusal these releases are not announced
// to waiters: a grant on a node that was free blocked nobody, and announcing
// it would wake the other waiters, whose failed attempts would announce
// theirs, for as long as the holder keeps its quorum. After a failure they
// are announced like any release.
// For a reentrant request a node whose outcome is unknown is left alone: the
// token may hold an earlier grant there that a release would cut, and the
// dlock client releases or drains such holds itself. When the lock is
// granted, nodes that grant it late join it: their fence is raised to F in
// the background.
//
// A shared request (a reader of a read-write lock) goes the same way: a
// quorum of shared grants wins, with a fence chosen and raised as for an
// exclusive grant. An exclusive request with Wait records a writer intent
// on each node where readers refused it (see driver.AcquireRequest.Wait);
// Queued is set when any node kept one. Readers that refuse a writer, and
// intents that refuse a reader, are holders to wait for, not contenders:
// see busyResult. Requests for semaphores (Limit) and fair locks (Fair)
// are refused with an error wrapping driver.ErrInvalid (see Supports).
//
// Re-entry: a node that answers with a hold count above one re-entered the
// grant the token holds there. The result is a re-entry only when the client
// re-enters a grant (req.Joining, its fence) and at least a quorum of the
// winning nodes re-entered that grant with one hold count; when fewer agree
// the attempt is undone and fails. See chooseFence.

// Acquire grants the lock named req.Key to req.Token when a quorum of N/2+1
// nodes grant it in time (TTL less the time taken and Drift), with the
// highest fence among the winners; the comment above it tells the
// algorithm, and docs/REDLOCK.md why it is safe. When others hold the lock
// on enough nodes, the answer is "not acquired" with a nil error; when
// failures prevent a quorum the error is a *QuorumError; when the validity
// is used up it wraps ErrValidityElapsed. Whatever nodes granted when the
// lock is not granted is released in the background. Semaphores and fair
// locks are refused (driver.ErrInvalid).
func (b *Backend) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	if err := ctx.Err(); err != nil {
		return driver.AcquireResult{}, fmt.Errorf("redlock: %w", err)
	}
	if err := checkRequest(req); err != nil {
		return driver.AcquireResult{}, fmt.Errorf("redlock: %w", err)
	}
	a := newAttempt(b, ctx, req)
	start := time.Now()
	defer close(a.decided) // the node goroutines go on with their follow-ups
	lead := b.leaderFor(req)
	if lead != nil {
		b.start(a, lead)
		if res, done, err := a.askLeader(ctx, lead); done {
			return res, err
		}
	}
	for _, n := range b.nodes {
		if n != lead {
			b.start(a, n)
		}
	}
	return a.decide(ctx, start)
}

// start sends a's acquire to node n, after the calls of a's token on n
// that went before it.
func (b *Backend) start(a *attempt, n *node) {
	ahead, done := b.enqueue(a.req.Key, a.req.Token, n.index)
	b.goBackground(func() {
		defer done()
		if ahead != nil {
			<-ahead // an earlier call of this token, bounded by its timeouts
		}
		a.run(n)
	})
}

// leaderFor returns the node that an attempt asks first, alone, or nil
// when the attempt asks every node at once.
//
// Contenders that all ask every node at once split the nodes between
// them: each wins some, none wins a quorum, and all undo and back off
// (see busyResult). So an exclusive request on a key that refused this
// Backend within the last contendedFor asks the key's leader node first
// (the same node for every client with the same nodes: the key's hash
// picks it): the contender that the leader grants goes on to the other
// nodes, and the others, refused by the holder there, stop after one
// round trip and wait for the holder's release. A request that the leader
// does not refuse that way (granted, refused by readers or a writer
// intent, failed, or not answered within the node timeout) goes on to the
// other nodes as any attempt does, the leader's answer counted among
// theirs. While some node failed or was slow within failedRest, attempts
// ask every node at once, so that an outage is reported as one and a slow
// leader delays one attempt (see askLeader). Re-entries and shared
// requests ask every node at once.
//
// A contender refused by the leader takes the loser of a split's grant
// there, undone a moment later without an announcement, for a holder: it
// waits for the next release, or its retry schedule. The splits come only
// from attempts that ask every node at once, which come back after a
// short delay (splitDelay), asking the leader first.
//
// Only an attempt that asked every node keeps a key contended (see
// askLeader): the leader's hold alone may be one that nobody holds a
// quorum with (a holder's release that did not reach the leader, a
// loser's grant whose undoing failed), and the other nodes may be down
// while the leader refuses. So attempts that keep stopping at the leader
// ask every node again within contendedFor, where they win the free
// quorum or see the outage.
func (b *Backend) leaderFor(req driver.AcquireRequest) *node {
	if len(b.nodes) < 2 || req.Mode != driver.Exclusive || req.Reentrant || req.Joining != 0 {
		return nil
	}
	now := time.Now()
	b.mu.Lock()
	at, ok := b.contended[req.Key]
	b.mu.Unlock()
	if !ok || now.Sub(at) >= contendedFor {
		return nil
	}
	for _, n := range b.nodes {
		if failed := n.failedAt.Load(); failed != 0 && now.Sub(time.Unix(0, failed)) < failedRest {
			return nil
		}
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(req.Key))
	return b.nodes[h.Sum32()%uint32(len(b.nodes))]
}

const (
	// contendedFor is how long after a refusal on a key this Backend's
	// exclusive attempts on it ask its leader node first (see leaderFor).
	contendedFor = time.Second
	// failedRest is how long after an acquire on any node failed or took
	// longer than the node timeout attempts ask every node at once.
	failedRest = 5 * time.Second
)

// contend records that an attempt on key was refused (see leaderFor).
func (b *Backend) contend(key string) {
	b.mu.Lock()
	if b.contended == nil || len(b.contended) >= maxSplitKeys {
		b.contended = make(map[string]time.Time) // forget: a key only asks every node again
	}
	b.contended[key] = time.Now()
	b.mu.Unlock()
}

// askLeader waits for the answer of the leader node lead, asked first, at
// most the node timeout. When another Client's exclusive hold refused it
// there (stopsAt), the attempt ends with done set and that refusal: the holder and
// its TTL on the leader, which a release of the holder ends. Such a
// refusal does not keep the key contended (see leaderFor). When ctx ends
// first, it ends with ctx's error. Otherwise the attempt goes on to the
// other nodes; an answer read here is put back for decide. A leader that
// has not answered within the node timeout counts as slow at once, not
// only once its call returns (up to callLimit later): meanwhile the next
// attempts would wait for it too.
func (a *attempt) askLeader(ctx context.Context, lead *node) (res driver.AcquireResult, done bool, err error) {
	timer := time.NewTimer(a.timeout)
	defer timer.Stop()
	select {
	case ans := <-a.answers:
		if ans.err == nil && a.stopsAt(ans.val) {
			a.quiet = true
			a.b.noSplit(a.req.Key) // refused by a holder: not a split
			return driver.AcquireResult{Holder: ans.val.Holder, HolderTTL: ans.val.HolderTTL}, true, nil
		}
		a.answers <- ans // room for every node's answer
	case <-timer.C:
		lead.failedAt.Store(time.Now().UnixNano())
	case <-ctx.Done():
		return driver.AcquireResult{}, true, fmt.Errorf("redlock: %w", ctx.Err())
	}
	return driver.AcquireResult{}, false, nil
}

// stopsAt reports whether the leader's refusal res ends the attempt: an
// exclusive hold of another Client than the requester's (whose own
// hold there may be a loser's, soon undone without a release to announce
// it), with a TTL, and no readers, writer intent or conflict in the way.
func (a *attempt) stopsAt(res driver.AcquireResult) bool {
	return !res.Acquired && res.Holder != "" && clientOf(res.Holder) != clientOf(a.req.Owner) && res.HolderTTL > 0 &&
		res.Shared == 0 && !res.Conflict && !res.WriterWaiting && !res.Queued
}

// clientOf returns the part of the owner description owner that names the
// dlock Client that made it ("host|pid N|" or "host|pid N client K|": see
// driver.ProcessIdentity), which stays the same from one grant to the
// next while the rest (the time, the metadata) changes; owner itself when
// a Client of this process did not make it.
func clientOf(owner string) string {
	if !driver.OfThisProcess(owner) {
		return owner
	}
	id := driver.ProcessIdentity()
	if i := strings.IndexByte(owner[len(id):], '|'); i >= 0 {
		return owner[:len(id)+i+1]
	}
	return owner
}

// attempt is one Acquire call. Each node has a goroutine that sends the
// acquire, offers the answer to decide, raises the node's fence if decide
// asks for it, and once decide is done makes the node's follow-up call
// (release or fence raise). One goroutine does all of one node's calls, in
// order, so a release never overtakes the acquire it undoes.
type attempt struct {
	b       *Backend
	bg      context.Context // the caller's context without its cancellation
	req     driver.AcquireRequest
	timeout time.Duration

	answers  chan answer[driver.AcquireResult] // every node's acquire answer
	raiseReq []chan uint64                     // per node: raise the fence to this
	raised   chan answer[bool]                 // RaiseFence answers
	decided  chan struct{}                     // closed once the fields below are set

	// Set by decide before decided is closed.
	granted bool
	quiet   bool // refused: undo grants without announcing them
	queued  bool // refused, with Queued set in the result
	fence   uint64
	reentry bool
	acts    []action // per node, when granted
}

// action is a node's follow-up after decide.
type action int

const (
	actLate     action = iota // decide did not handle the node's answer: see lateAction
	actNone                   // nothing to do
	actRaise                  // raise the node's fence to the grant's fence
	actRelease                // release the node
	actWithdraw               // withdraw the request's writer intent on the node
)

func newAttempt(b *Backend, ctx context.Context, req driver.AcquireRequest) *attempt {
	n := len(b.nodes)
	a := &attempt{
		b:        b,
		bg:       context.WithoutCancel(ctx),
		req:      req,
		timeout:  b.callTimeout(req.TTL),
		answers:  make(chan answer[driver.AcquireResult], n),
		raiseReq: make([]chan uint64, n),
		raised:   make(chan answer[bool], n),
		decided:  make(chan struct{}),
		acts:     make([]action, n),
	}
	for i := range a.raiseReq {
		a.raiseReq[i] = make(chan uint64, 1)
	}
	return a
}

// run is the goroutine of node n. Its calls do not end with the caller's
// context nor with decide's wait, only with Backend.callLimit, so that their
// outcome is known when possible and the follow-up matches it; decide
// returns at once when the caller's context ends.
func (a *attempt) run(n *node) {
	// A node whose maxmemory-policy may evict keys grants nothing, unless
	// WithEvictionAllowed. Its policy is read in the background, beside the
	// node's first acquires, so that the reading never costs a node its
	// answer within the node timeout (see redislock.EvictionError).
	var res driver.AcquireResult
	err := n.evictionRefusal()
	if err == nil {
		sent := time.Now()
		ctx, cancel := context.WithTimeout(a.bg, a.b.callLimit())
		res, err = n.b.Acquire(ctx, a.req)
		err = timedOut(ctx, err)
		cancel()
		if err != nil || time.Since(sent) > a.timeout {
			n.failedAt.Store(time.Now().UnixNano())
		}
	} else {
		n.failedAt.Store(time.Now().UnixNano())
	}
	a.answers <- answer[driver.AcquireResult]{node: n, val: res, err: err}

	select {
	case f := <-a.raiseReq[n.index]:
		ctx, cancel := context.WithTimeout(a.bg, a.b.callLimit())
		ok, err := redisnode.RaiseFence(n.b, ctx, a.req.Key, a.req.Token, f)
		err = timedOut(ctx, err)
		cancel()
		a.raised <- answer[bool]{node: n, val: ok, err: err}
		<-a.decided
	case <-a.decided:
	}

	act := actLate
	if a.granted {
		act = a.acts[n.index]
	}
	if act == actLate {
		act = a.lateAction(res, err)
	}
	if act == actNone {
		return
	}
	ctx, cancel := context.WithTimeout(a.bg, a.b.callLimit())
	defer cancel()
	switch act {
	case actRaise:
		_, _ = redisnode.RaiseFence(n.b, ctx, a.req.Key, a.req.Token, a.fence)
	case actWithdraw:
		_ = n.b.Withdraw(ctx, a.req.Key, a.req.Token)
	case actRelease:
		if a.quiet || a.granted {
			_, _ = redisnode.ReleaseQuietly(n.b, ctx, a.req.Key, a.req.Token)
		} else {
			_, _ = n.b.Release(ctx, a.req.Key, a.req.Token)
		}
	}
}

// lateAction is the follow-up for a node whose answer decide did not use.
func (a *attempt) lateAction(res driver.AcquireResult, err error) action {
	if !a.granted {
		if res.Acquired || (err != nil && !a.req.Reentrant) {
			return actRelease
		}
		if res.Queued && !a.queued {
			// A writer intent that the answer did not report: the caller
			// does not know to withdraw it when its wait ends, and it
			// would keep readers out of this node until its QueueTTL. The
			// wait's next attempt records it again.
			return actWithdraw
		}
		return actNone
	}
	if err != nil || !res.Acquired {
		return actNone
	}
	if a.reentry {
		if res.Holds > 1 && res.Fence != a.fence {
			return actRelease // a re-entry of some other grant: undo it
		}
		if res.Holds <= 1 && res.Fence > a.fence+1 {
			return actRelease // see chooseFence: this node cannot join a re-entry
		}
	}
	if res.Fence != a.fence {
		return actRaise
	}
	return actNone
}

// decide collects the nodes' answers until the outcome is known, and for a
// won quorum runs the fence round and the validity check. It sets the
// attempt's outcome fields; Acquire closes decided after it returns.
func (a *attempt) decide(ctx context.Context, start time.Time) (driver.AcquireResult, error) {
	b, key := a.b, a.req.Key
	t := tally{n: len(b.nodes), q: b.Quorum()}
	g := newGather(b, a.answers, a.timeout)
	defer g.stop()
	var wins, busy []answer[driver.AcquireResult]
	var errs []*NodeError
	// more reads the next answer; false when there is none to wait for.
	more := func() (bool, error) {
		ans, ok, err := g.next(ctx)
		if !ok {
			errs, err = g.ended(b, err, &t, errs)
			return false, err
		}
		switch {
		case ans.err != nil:
			t.fail++
			errs = append(errs, ans.node.nodeError(ans.err))
		case ans.val.Acquired:
			t.yes++
			wins = append(wins, ans)
		default:
			t.no++
			busy = append(busy, ans)
		}
		return true, nil
	}
	for t.verdict() == undecided {
		if ok, err := more(); err != nil {
			return driver.AcquireResult{}, err
		} else if !ok {
			break
		}
	}
	// A re-entry won on nodes that disagree may still become a clean one
	// with the answers to come: wait for them while they can make it so.
	for t.verdict() == won && reentryOpen(wins, a.req.Joining, t.q, t.pending()) {
		if ok, err := more(); err != nil {
			return driver.AcquireResult{}, err
		} else if !ok {
			break
		}
	}
	// With an even N, readers on N/2 nodes refuse a writer as early as
	// readers on a quorum would: wait for the answers that tell the two
	// apart (see busyResult).
	for t.verdict() == refused && a.readersOpen(busy, t) {
		if ok, err := more(); err != nil {
			return driver.AcquireResult{}, err
		} else if !ok {
			break
		}
	}
	switch t.verdict() {
	case refused:
		a.quiet = true
		b.contend(key)
		res := a.busyResult(busy, t.yes)
		a.queued = res.Queued
		return res, nil
	case won:
	default:
		if t.no > 0 && t.yes+t.no >= t.q {
			// Enough nodes answered to make a quorum, and some of them are
			// held by others: the live nodes are split between contenders
			// while failed nodes make up the rest. That is contention, not
			// an outage; an error here would end a waiting Lock, and
			// contenders retrying at once would split the nodes again.
			a.quiet = true
			b.contend(key)
			res := a.busyResult(busy, t.yes)
			a.queued = res.Queued
			return res, nil
		}
		return driver.AcquireResult{}, b.quorumError(ctx, "acquire", key, t.yes, errs)
	}

	fence, reentry, holds, err := chooseFence(wins, a.req.Joining, b.Quorum())
	if err != nil {
		return driver.AcquireResult{}, fmt.Errorf("redlock: %w", err)
	}
	a.fence, a.reentry = fence, reentry
	carry, raiseErrs, err := a.raise(ctx, wins)
	if err != nil {
		return driver.AcquireResult{}, fmt.Errorf("redlock: %w", err)
	}
	if carry < b.Quorum() {
		return driver.AcquireResult{}, b.quorumError(ctx, "acquire", key, carry, append(errs, raiseErrs...))
	}
	elapsed := time.Since(start)
	if drift := b.Drift(a.req.TTL); a.req.TTL-elapsed-drift <= 0 {
		// Transient: a quorum answered; the next attempt may be quicker.
		return driver.AcquireResult{}, driver.Transient(fmt.Errorf("quorum won after %v, TTL %v, drift %v: %w",
			elapsed.Round(time.Microsecond), a.req.TTL, drift, ErrValidityElapsed))
	}
	a.granted = true
	b.noSplit(key)
	return driver.AcquireResult{Acquired: true, Fence: fence, Holds: holds}, nil
}

// raise gives the winning nodes whose fence differs from a.fence that fence,
// concurrently, and returns how many winning nodes carry it. It sets the
// follow-up of every winning node: nothing, or another raise in the
// background for a node that did not answer in time.
//
// Why fences strictly increase: the Q nodes that carry F when the grant is
// made keep a counter of at least F. A later grant is won on Q nodes, and
// two quorums of N nodes share at least one node. On that node the later
// grant's INCR comes after this grant's raise (the raise needs this grant to
// hold the node; the later grant can take the node only once that hold is
// gone), so it draws more than F, and the later grant's fence, the highest
// of its quorum, is more than F. This needs counters that persist, holds that
// last their TTL and grants that are not used past their validity: the
// timing assumptions Redlock makes anyway (see the package documentation).
func (a *attempt) raise(ctx context.Context, wins []answer[driver.AcquireResult]) (carry int, errs []*NodeError, err error) {
	pending := make(map[int]*node)
	for _, w := range wins {
		a.acts[w.node.index] = actNone
		if w.val.Fence == a.fence {
			carry++
			continue
		}
		pending[w.node.index] = w.node
		a.raiseReq[w.node.index] <- a.fence
	}
	if len(pending) == 0 {
		return carry, nil, nil // the common case: every winning node agrees
	}
	timer := time.NewTimer(backstop(a.timeout))
	defer timer.Stop()
	for len(pending) > 0 {
		select {
		case ans := <-a.raised:
			delete(pending, ans.node.index)
			switch {
			case ans.err != nil:
				errs = append(errs, ans.node.nodeError(ans.err))
				a.acts[ans.node.index] = actRaise
			case !ans.val:
				errs = append(errs, ans.node.nodeError(errNotRaised))
			default:
				carry++
			}
		case <-ctx.Done():
			return 0, nil, ctx.Err()
		case <-timer.C:
			for i, n := range pending {
				errs = append(errs, n.nodeError(noAnswer(a.timeout)))
				a.acts[i] = actRaise
			}
			return carry, errs, nil
		}
	}
	return carry, errs, nil
}

// chooseFence picks the fence of a won quorum and says whether the result
// is a re-entry; holds is the hold count the winning nodes agree on, or 0.
// join is the fence of the grant the client re-enters (0: none).
//
// A re-entry is one only when at least q winning nodes re-entered (a hold
// count above one) the grant with fence join and agree on the hold count.
// Then the grant is still held by a quorum, so nobody can have been granted
// the lock since, and its fence stays join; a non-last Unlock leaves those q
// nodes holding. When the client re-enters but fewer than q nodes agree
// (some node's earlier outcome was unknown, or the grant expired on some
// nodes), the attempt fails with an error and is undone: the client keeps
// its leases, marks their hold count uncertain and drains it at the last
// Unlock. Otherwise the result is a fresh grant with the highest fence of
// the quorum, whatever holds a node reports: a hold the client does not know
// of is a stray of an earlier attempt whose outcome was unknown, and taking
// its fence could repeat one already granted.
func chooseFence(wins []answer[driver.AcquireResult], join uint64, q int) (fence uint64, reentry bool, holds int, err error) {
	holds = wins[0].val.Holds
	byHolds := make(map[int]int)
	reentered := 0
	for _, w := range wins {
		if w.val.Holds != holds {
			holds = 0
		}
		fence = max(fence, w.val.Fence)
		if join != 0 && w.val.Holds > 1 && w.val.Fence == join {
			byHolds[w.val.Holds]++
			reentered++
		}
	}
	for h, n := range byHolds {
		if n >= q {
			return join, true, h, nil
		}
	}
	if reentered > 0 {
		return 0, false, 0, fmt.Errorf("re-entry of the grant with fence %d confirmed alike by fewer than a quorum (%d) of nodes", join, q)
	}
	return fence, false, holds, nil
}

// reentryOpen reports whether a won quorum for a re-entry of the grant with
// fence join has not yet shown a quorum of nodes re-entering it alike, while
// the pending answers still could.
func reentryOpen(wins []answer[driver.AcquireResult], join uint64, q, pending int) bool {
	if join == 0 || pending == 0 {
		return false
	}
	byHolds := make(map[int]int)
	best := 0
	for _, w := range wins {
		if w.val.Holds > 1 && w.val.Fence == join {
			byHolds[w.val.Holds]++
			best = max(best, byHolds[w.val.Holds])
		}
	}
	return best < q && best+pending >= q
}

// checkRequest refuses what Redlock does not offer: semaphores and fair
// locks (see Backend.Supports), and shared requests with the options of
// exclusive ones.
func checkRequest(req driver.AcquireRequest) error {
	switch {
	case req.Mode != driver.Exclusive && req.Mode != driver.Shared:
		return fmt.Errorf("unknown mode %v: %w", req.Mode, driver.ErrInvalid)
	case req.Fair:
		return fmt.Errorf("%v are not supported on a quorum of nodes: %w: %w", driver.CapFair, driver.ErrInvalid, driver.ErrUnsupported)
	case req.Mode == driver.Shared && req.Limit != 0:
		return fmt.Errorf("%v are not supported on a quorum of nodes: %w: %w", driver.CapSemaphore, driver.ErrInvalid, driver.ErrUnsupported)
	case req.Mode == driver.Shared && (req.Reentrant || req.LockDelay > 0 || req.Joining != 0):
		return fmt.Errorf("a shared hold cannot be reentrant nor have a lock-delay: %w", driver.ErrInvalid)
	}
	return nil
}
