package redlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/ctxend"
	"github.com/dlock-go/dlock/redislock"
)

var (
	_ driver.Backend      = (*Backend)(nil)
	_ driver.Notifier     = (*Backend)(nil)
	_ driver.BatchRenewer = (*Backend)(nil)
	_ driver.Inspector    = (*Backend)(nil)
	_ driver.Drifter      = (*Backend)(nil)
	_ driver.Capabler     = (*Backend)(nil)
)

// Backend is a dlock store on N independent Redis nodes that grants a lock
// only when a quorum of N/2+1 nodes grant it (the Redlock algorithm). It is
// safe for concurrent use. It does not own the clients: close them after the
// dlock client that uses the Backend is closed.
//
// Calls to the nodes go out concurrently, one goroutine per node. Acquire
// and Renew wait for a node's answer at most the node timeout, but the
// call itself may run for a few node timeouts (callLimit): an answer that
// comes after the decision is still read, so the connection it came on is
// kept, and a connection that a call must first open is not cut short by
// the node timeout. Goroutines of nodes that have not answered when a call
// has decided, and the clean-ups that follow them, keep running in the
// background for up to a few node timeouts, then end on their own.
type Backend struct {
	nodes []*node
	opts  options

	mu sync.Mutex
	// queues orders each token's calls on each key, node by node.
	queues map[string]*queue
	// running counts the Backend's goroutines; idle is broadcast when it
	// drops to zero (tests wait on it).
	running int
	idle    *sync.Cond
	// splits counts, by key, this Backend's attempts in a row that found
	// the nodes split between contenders (see splitDelay).
	splits map[string]int
	// contended is, by key, when an attempt of this Backend on it was last
	// refused (see leaderFor).
	contended map[string]time.Time
}

// node is one Redis node.
type node struct {
	index int
	addr  string
	rdb   redis.UniversalClient
	b     *redislock.Backend
	// allowEviction is WithEvictionAllowed.
	allowEviction bool
	// failedAt is when an acquire on the node last failed or took longer
	// than the node timeout (UnixNano; 0: never; see leaderFor).
	failedAt atomic.Int64
}

// evictionRefusal is the node's refusal to grant because its Redis may
// evict keys, known so far (redislock.Backend.EvictionRefusal), or nil.
func (n *node) evictionRefusal() error {
	if n.allowEviction {
		return nil
	}
	return n.b.EvictionRefusal()
}

// New returns a Backend on the given nodes, each an independent Redis
// master (not replicas of each other, nor of one Cluster). It does no I/O.
// It returns an error wrapping driver.ErrInvalid, not a panic, when nodes is
// empty, a node is nil or an option is invalid.
func New(nodes []redis.UniversalClient, opts ...Option) (*Backend, error) {
	o := defaultOptions()
	for _, opt := range opts {
		if opt != nil {
			opt.apply(&o)
		}
	}
	if o.err != nil {
		return nil, o.err
	}
	if len(nodes) == 0 {
		return nil, fmt.Errorf("redlock: new: no nodes: %w", driver.ErrInvalid)
	}
	b := &Backend{opts: o, queues: make(map[string]*queue)}
	b.idle = sync.NewCond(&b.mu)
	for i, c := range nodes {
		if isNil(c) {
			return nil, fmt.Errorf("redlock: new: node %d is nil: %w", i, driver.ErrInvalid)
		}
		ns := o.namespace
		if ns == "" {
			ns = redislock.DefaultNamespace
		}
		b.nodes = append(b.nodes, &node{
			index: i,
			addr:  addrOf(c),
			rdb:   c,
			// The node's own Backend grants on any policy: the node checks
			// it without waiting (evictionRefusal).
			b:             redislock.New(c, append([]redislock.Option{redislock.WithNamespace(ns), redislock.WithEvictionAllowed()}, o.node...)...),
			allowEviction: o.allowEviction,
		})
	}
	return b, nil
}

// isNil reports whether c is nil or a nil pointer of a go-redis client type.
func isNil(c redis.UniversalClient) bool {
	switch c := c.(type) {
	case nil:
		return true
	case *redis.Client:
		return c == nil
	case *redis.ClusterClient:
		return c == nil
	case *redis.Ring:
		return c == nil
	}
	return false
}

// addrOf returns the address in a client's options, for error messages.
func addrOf(c redis.UniversalClient) string {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().Addr
	case *redis.ClusterClient:
		return strings.Join(c.Options().Addrs, ",")
	case *redis.Ring:
		var addrs []string
		for _, a := range c.Options().Addrs {
			addrs = append(addrs, a)
		}
		slices.Sort(addrs)
		return strings.Join(addrs, ",")
	}
	return ""
}

// Nodes returns the number of nodes.
func (b *Backend) Nodes() int { return len(b.nodes) }

// Quorum returns how many nodes must agree: N/2+1.
func (b *Backend) Quorum() int { return len(b.nodes)/2 + 1 }

// Drift returns the clock drift allowance for a grant of ttl:
// ttl×factor + extra (WithClockDrift; 1% + 2ms by default). The dlock client
// ends every grant and renewal this much before send time + ttl, and Acquire
// refuses a grant whose quorum took longer than ttl − Drift(ttl).
func (b *Backend) Drift(ttl time.Duration) time.Duration {
	return time.Duration(float64(ttl)*b.opts.driftFactor) + b.opts.driftExtra
}

// Supports reports true for driver.CapShared and driver.CapLockDelay. Each
// node keeps the lock-delay of its grant, so the lock stays out of reach on
// a quorum until the delay has run out there. Read-write locks are
// sound on a quorum (a reader and a writer each need a majority, and two
// majorities share a node, where they exclude each other). Semaphores are
// not: majorities that are each under the limit do not bound the total, so
// Limit+1 holders could each win a different majority. Fair locks are not
// either: each node orders its waiters by arrival there, and the nodes'
// orders differ. See docs/REDLOCK.md.
func (b *Backend) Supports(c driver.Capability) bool {
	return c == driver.CapShared || c == driver.CapLockDelay
}

// callTimeout is how long acquire and renew wait for a node's answer, for
// ttl: the node timeout, at most ttl/10.
func (b *Backend) callTimeout(ttl time.Duration) time.Duration {
	return max(min(b.opts.nodeTimeout, ttl/10), time.Millisecond)
}

// callLimit bounds every call to a node, and how long release, inspection
// and ping wait for its answer: four node timeouts, at most a second, but
// never less than one node timeout.
//
// An acquire or renewal that has not answered within callTimeout does not
// count, but it is not cut short there either. go-redis drops a connection
// whose read ended with the call's context (the answer still on its way
// would be read as the next command's), so cutting every late call at the
// node timeout would make the next call to that node dial first, within
// its own node timeout; on a loaded machine it misses that too, and so
// would every later one, on nodes that are merely slow to be scheduled.
func (b *Backend) callLimit() time.Duration {
	return max(b.opts.nodeTimeout, min(4*b.opts.nodeTimeout, time.Second))
}

// splitDelay is a random wait after an attempt on key that found the nodes
// split between contenders: in [nodeTimeout/5, nodeTimeout), at least 1ms,
// after the first split in a row, and twice as long after each further one,
// up to 8 times. Contenders that keep colliding (every live node needed for
// a quorum, all of them waiting for the same release) spread out further
// each time instead of splitting the nodes again and again.
func (b *Backend) splitDelay(key string) time.Duration {
	b.mu.Lock()
	if b.splits == nil || len(b.splits) >= maxSplitKeys {
		b.splits = make(map[string]int) // forget: a key is only slower to back off
	}
	b.splits[key]++
	n := b.splits[key]
	b.mu.Unlock()
	lo := max(b.opts.nodeTimeout/5, time.Millisecond)
	d := lo + rand.N(max(b.opts.nodeTimeout-lo, time.Millisecond))
	return d << min(n-1, 3)
}

// maxSplitKeys bounds the keys splitDelay remembers.
const maxSplitKeys = 4096

// noSplit forgets the splits in a row of key: an attempt on it was granted,
// or refused by a holder.
func (b *Backend) noSplit(key string) {
	b.mu.Lock()
	delete(b.splits, key)
	b.mu.Unlock()
}

// listTimeout bounds one node's walk in List, which may take many pages.
const listTimeout = 10 * time.Second

// nodeError wraps err as the failure of n. A node's error that may heal
// (driver.IsTransient, the node's own timeout, a grant that expired before
// its fence was raised) is recorded as such, without its mark: the
// QuorumError says whether the whole miss is transient.
func (n *node) nodeError(err error) *NodeError {
	transient := driver.IsTransient(err) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, errNotRaised)
	if u := errors.Unwrap(err); u != nil && driver.IsTransient(err) && !driver.IsTransient(u) {
		err = u // the mark is outermost (redislock puts it there)
	}
	return &NodeError{Node: n.index, Addr: n.addr, Err: err, transient: transient}
}

// timedOut marks err, the failure of a node call made with nctx, as
// transient when nctx had ended: the node did not answer within its own
// timeout (a caller's context that ended is told apart by quorumError).
func timedOut(nctx context.Context, err error) error {
	if err != nil && ctxend.Err(nctx) != nil {
		return driver.Transient(err)
	}
	return err
}

// quorumError builds the QuorumError of op on key, called with ctx, from
// the failed nodes. It is transient when ctx is live and the nodes whose
// failure will not heal leave a quorum that could still agree.
func (b *Backend) quorumError(ctx context.Context, op, key string, ok int, errs []*NodeError) *QuorumError {
	slices.SortFunc(errs, func(x, y *NodeError) int { return x.Node - y.Node })
	e := &QuorumError{Op: op, Key: key, Nodes: len(b.nodes), Quorum: b.Quorum(), OK: ok}
	lasting := 0
	for _, err := range errs {
		e.Errs = append(e.Errs, err)
		if !err.transient {
			lasting++
		}
	}
	e.transient = len(errs) > 0 && ctxend.Err(ctx) == nil && len(b.nodes)-lasting >= b.Quorum()
	return e
}

// goBackground runs fn in a goroutine counted by the Backend.
func (b *Backend) goBackground(fn func()) {
	b.mu.Lock()
	b.running++
	b.mu.Unlock()
	go func() {
		defer func() {
			b.mu.Lock()
			b.running--
			if b.running == 0 {
				b.idle.Broadcast()
			}
			b.mu.Unlock()
		}()
		fn()
	}()
}

// waitIdle waits until none of the Backend's goroutines is running.
func (b *Backend) waitIdle() {
	b.mu.Lock()
	for b.running > 0 {
		b.idle.Wait()
	}
	b.mu.Unlock()
}

// answer is one node's answer to a call.
type answer[T any] struct {
	node *node
	val  T
	err  error
}

// fanOut calls call on every node concurrently, each with a context bounded
// by limit, and returns a channel that receives every node's answer. The
// channel is buffered, so the caller may stop reading once it has decided;
// the goroutines end on their own within limit.
func fanOut[T any](b *Backend, ctx context.Context, limit time.Duration, call func(ctx context.Context, n *node) (T, error)) <-chan answer[T] {
	ch := make(chan answer[T], len(b.nodes))
	for _, n := range b.nodes {
		b.goBackground(func() {
			nctx, cancel := context.WithTimeout(ctx, limit)
			v, err := call(nctx, n)
			err = timedOut(nctx, err)
			cancel()
			ch <- answer[T]{node: n, val: v, err: err}
		})
	}
	return ch
}

// gather reads the answers of a fanOut until the caller has decided, ctx is
// done, or a backstop a little after the given timeout passes: a node whose
// client ignores its deadline, or a goroutine that is scheduled late on a
// loaded machine, must not hold the caller up, but an answer read in time
// is not lost to the scheduling.
type gather[T any] struct {
	ch       <-chan answer[T]
	timeout  time.Duration
	timer    *time.Timer
	deadline time.Time // when timer fires
	seen     []bool
}

func newGather[T any](b *Backend, ch <-chan answer[T], timeout time.Duration) *gather[T] {
	d := backstop(timeout)
	return &gather[T]{ch: ch, timeout: timeout, timer: time.NewTimer(d), deadline: time.Now().Add(d), seen: make([]bool, len(b.nodes))}
}

// backstop is how long after timeout a caller stops waiting.
func backstop(timeout time.Duration) time.Duration { return timeout + timeout/2 + 5*time.Millisecond }

// next returns the next answer; ok is false when ctx is done (err is then
// ctx's error) or the backstop passed (err is nil: the unseen nodes did not
// answer in time).
func (g *gather[T]) next(ctx context.Context) (a answer[T], ok bool, err error) {
	select {
	case a := <-g.ch:
		g.seen[a.node.index] = true
		return a, true, nil
	case <-ctx.Done():
		return a, false, ctx.Err()
	case <-g.timer.C:
		return a, false, nil
	}
}

// unanswered returns a NodeError for each node not seen yet.
func (g *gather[T]) unanswered(b *Backend) []*NodeError {
	var errs []*NodeError
	for i, seen := range g.seen {
		if !seen {
			errs = append(errs, b.nodes[i].nodeError(noAnswer(g.timeout)))
		}
	}
	return errs
}

func (g *gather[T]) stop() { g.timer.Stop() }

// ended handles the end of the answers of a quorum decision (next's !ok):
// ctx's error, wrapped, or else the nodes that never answered, counted as
// failures in t and added to errs.
func (g *gather[T]) ended(b *Backend, err error, t *tally, errs []*NodeError) ([]*NodeError, error) {
	if err != nil {
		return errs, fmt.Errorf("redlock: %w", err)
	}
	missing := g.unanswered(b)
	t.fail += len(missing)
	return append(errs, missing...), nil
}

// collect reads answers until every node has answered, ctx ends or the
// backstop passes. It calls ok, when not nil, with each successful answer
// and the number of successes so far, and returns that number and a
// NodeError for each node that failed or did not answer.
func (g *gather[T]) collect(ctx context.Context, b *Backend, ok func(a answer[T], answered int)) (int, []*NodeError) {
	var errs []*NodeError
	answered := 0
	for range b.nodes {
		ans, more, err := g.next(ctx)
		if !more {
			for _, ne := range g.unanswered(b) {
				if err != nil {
					ne.Err = err
				}
				errs = append(errs, ne)
			}
			break
		}
		if ans.err != nil {
			errs = append(errs, ans.node.nodeError(ans.err))
			continue
		}
		answered++
		if ok != nil {
			ok(ans, answered)
		}
	}
	return answered, errs
}

// shorten makes next give up d from now, if that is sooner than before.
func (g *gather[T]) shorten(d time.Duration) {
	if d < time.Until(g.deadline) {
		g.timer.Reset(d)
		g.deadline = time.Now().Add(d)
	}
}

// tally counts the answers of a quorum call: yes answers (granted, renewed),
// no answers (held by another, not held) and failures.
type tally struct {
	n, q          int
	yes, no, fail int
}

// verdict is where a tally stands.
type verdict int

const (
	undecided verdict = iota
	won               // a quorum said yes
	refused           // the no answers alone make a quorum impossible
	failed            // failures make a quorum impossible, and the no answers cannot make it a refusal
)

func (t *tally) pending() int { return t.n - t.yes - t.no - t.fail }

// verdict decides as early as the answers allow. A call lost partly to
// failures waits for the nodes still pending while their "no" could still
// make the loss a plain refusal, so that a waiter with one dead node sees
// "held by another" rather than an error.
func (t *tally) verdict() verdict {
	switch {
	case t.yes >= t.q:
		return won
	case t.no >= t.n-t.q+1:
		return refused
	case t.yes+t.pending() < t.q && t.no+t.pending() < t.n-t.q+1:
		return failed
	}
	return undecided
}

// queue orders the calls that one token makes on one key, node by node: an
// acquire attempt's calls on a node (acquire, fence raise, clean-up) and
// releases go out in the order they were made, each after the one before it
// on that node has returned. Calls on different connections could otherwise
// overtake each other, and a release could reach a node before the late
// acquire it was meant to undo.
type queue struct {
	tails []chan struct{} // per node: closed when the last call queued there is done
	users int             // calls queued and not done
}

// enqueue queues a call of token on key on node i. The call must wait for
// ahead (nil when nothing is ahead) before it sends anything, and call done
// when it, and whatever follows it on the node, is finished.
func (b *Backend) enqueue(key, token string, i int) (ahead <-chan struct{}, done func()) {
	k := key + "\x00" + token
	b.mu.Lock()
	defer b.mu.Unlock()
	q := b.queues[k]
	if q == nil {
		q = &queue{tails: make([]chan struct{}, len(b.nodes))}
		b.queues[k] = q
	}
	ahead = q.tails[i]
	mine := make(chan struct{})
	q.tails[i] = mine
	q.users++
	return ahead, func() {
		close(mine)
		b.mu.Lock()
		defer b.mu.Unlock()
		if q.users--; q.users == 0 {
			delete(b.queues, k)
		}
	}
}
