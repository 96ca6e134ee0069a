// The renewer: a Client's one goroutine that renews its grants in batches
// and ends those whose safety deadline has passed.

package dlock

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// renewer is the one goroutine per Client that renews leases and ends those
// whose local deadline has passed. Its heap holds every live grant ordered by
// the time of its next event: a renewal (every TTL/3) or the safety deadline
// (Deadline minus the safety margin). Renewals that fall due together are sent
// as one batch in a goroutine of their own, so that a store that does not
// answer can never delay the safety deadline of any lease.
type renewer struct {
	backend driver.Backend
	batcher driver.BatchRenewer // nil when the backend has no batch renewal
	// granter ties renewals to their grant's fence (driver.GrantRenewer),
	// or is nil.
	granter driver.GrantRenewer
	log     *slog.Logger
	obs     *observer // nil without WithObserver

	mu     sync.Mutex
	h      grantHeap
	wakeAt time.Time     // when the loop's timer fires next, guarded by mu
	wakeup chan struct{} // capacity 1: a grant falls due before wakeAt
	stop   chan struct{}
	done   chan struct{}
	ctx    context.Context // cancelled at close, for batches in flight
	cancel context.CancelFunc
	calls  sync.WaitGroup // batches in flight

	once    sync.Once
	started bool // set inside once
}

func newRenewer(backend driver.Backend, log *slog.Logger, obs *observer) *renewer {
	r := &renewer{
		backend: backend,
		log:     log,
		obs:     obs,
		wakeup:  make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	r.batcher, _ = backend.(driver.BatchRenewer)
	r.granter, _ = backend.(driver.GrantRenewer)
	r.ctx, r.cancel = context.WithCancel(context.Background())
	return r
}

// start runs the loop on first use, so that a Client that never holds a lease
// (or was made with bad arguments) has no goroutine.
func (r *renewer) start() {
	r.once.Do(func() {
		r.started = true
		go r.loop()
	})
}

// reschedule moves g after its times changed and wakes the loop when g is
// now first. The caller holds g.mu.
func (r *renewer) reschedule(g *grant) {
	if r.push(g) {
		r.kick()
	}
}

// push (re)places g in the heap and reports whether the loop must wake
// for it: when it is now first and falls due before the loop's timer fires.
// A lock taken while no other lease is held usually falls due after the
// timer left by the last one, and then costs the loop no wake-up. The
// caller holds g.mu.
//
// When it wakes the loop, push moves wakeAt to g's time at once: the loop,
// woken, sets its timer from the heap, or, when g was released meanwhile
// (an uncontended Lock+Unlock is over long before the loop runs), keeps
// wakeAt. Left at its old value (an hour away after an idle turn), every
// later lock would wake the loop again until one happened to be held while
// it ran.
func (r *renewer) push(g *grant) bool {
	r.start()
	r.mu.Lock()
	g.at = g.nextEvent()
	if g.index >= 0 {
		heap.Fix(&r.h, g.index)
	} else {
		heap.Push(&r.h, g)
	}
	wake := g.index == 0 && g.at.Before(r.wakeAt)
	if wake {
		r.wakeAt = g.at
	}
	r.mu.Unlock()
	return wake
}

// remove unschedules g. The caller holds g.mu.
func (r *renewer) remove(g *grant) {
	r.mu.Lock()
	if g.index >= 0 {
		heap.Remove(&r.h, g.index)
	}
	r.mu.Unlock()
}

func (r *renewer) kick() {
	select {
	case r.wakeup <- struct{}{}:
	default:
	}
}

func (r *renewer) loop() {
	defer close(r.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var due []*grant
	for {
		now := time.Now()
		r.mu.Lock()
		due = due[:0]
		for len(r.h) > 0 && !r.h[0].at.After(now) {
			due = append(due, heap.Pop(&r.h).(*grant))
		}
		// When something falls due, take along the grants whose renewal
		// falls due a little later, so that leases taken one after the
		// other share a batch instead of going out one loop turn apart.
		nDue := len(due)
		if nDue > 0 {
			for len(r.h) > 0 && !r.h[0].at.After(now.Add(coalesceWindow)) {
				due = append(due, heap.Pop(&r.h).(*grant))
			}
		}
		r.mu.Unlock()

		var batch []*grant
		for i, g := range due {
			at := now
			if i >= nDue { // taken along: renew up to its slack earlier still
				at = now.Add(min(g.renewSlack(), coalesceWindow))
			}
			renew, lost := g.tick(now, at)
			if renew {
				batch = append(batch, g)
			}
			r.logLoss(g, lost, nil)
		}
		switch len(batch) {
		case 0:
		case 1:
			r.calls.Add(1)
			go r.renewBatch(batch)
		default:
			for _, part := range splitBatch(batch, now) {
				r.calls.Add(1)
				go r.renewBatch(part)
			}
		}

		r.mu.Lock()
		now = time.Now()
		var next time.Time
		switch {
		case len(r.h) > 0:
			next = r.h[0].at
		case r.wakeAt.After(now):
			// Nothing is held: keep the timer of the last lease rather
			// than push it an hour away, so that the next lease, which
			// falls due later, need not wake the loop (see push). It
			// costs one idle turn.
			next = r.wakeAt
		default:
			next = now.Add(time.Hour)
		}
		r.wakeAt = next
		r.mu.Unlock()
		timer.Reset(max(next.Sub(now), 0))
		select {
		case <-timer.C:
		case <-r.wakeup:
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
		case <-r.stop:
			return
		}
	}
}

// coalesceWindow is how far ahead the renewer looks for renewals to add to
// a batch that goes out now.
const coalesceWindow = 50 * time.Millisecond

// splitBatch splits the grants of a batch by their time left: a call gives
// up at the earliest safety deadline of its batch (see renewBatch), so a
// grant near its own (a renewal retried with little time left) would cut
// short the call of grants that have far more, which would then fail and
// retry for nothing. Each part holds grants whose time left is at most
// twice that of the part's most pressed one.
func splitBatch(batch []*grant, now time.Time) [][]*grant {
	least, most := time.Duration(1<<63-1), time.Duration(-1<<63)
	for _, g := range batch {
		left := g.safeDeadline().Sub(now)
		least, most = min(least, left), max(most, left)
	}
	if most <= 2*max(least, 10*time.Millisecond) {
		return [][]*grant{batch} // the usual case: one part
	}
	type timed struct {
		g    *grant
		left time.Duration
	}
	ts := make([]timed, len(batch))
	for i, g := range batch {
		ts[i] = timed{g, g.safeDeadline().Sub(now)}
	}
	slices.SortFunc(ts, func(a, b timed) int { return cmp.Compare(a.left, b.left) })
	var parts [][]*grant
	var part []*grant
	var first time.Duration
	for _, t := range ts {
		if len(part) > 0 && t.left > 2*max(first, 10*time.Millisecond) {
			parts = append(parts, part)
			part = nil
		}
		if len(part) == 0 {
			first = t.left
		}
		part = append(part, t.g)
	}
	return append(parts, part)
}

// renewBatch renews the grants of one batch in one round trip when the
// backend can, and applies the results.
func (r *renewer) renewBatch(batch []*grant) {
	defer r.calls.Done()
	sent := time.Now()
	// Give up on the call when the first lease of the batch reaches its safety
	// deadline: by then the answer no longer matters for it.
	limit := time.Duration(1<<63 - 1)
	reqs := make([]driver.RenewRequest, len(batch))
	for i, g := range batch {
		limit = min(limit, g.safeDeadline().Sub(sent))
		reqs[i] = driver.RenewRequest{Key: g.key, Token: g.token, TTL: g.ttl}
		if r.granter != nil {
			reqs[i].Fence = g.fence
		}
	}
	ctx, cancel := context.WithTimeout(r.ctx, max(limit, 10*time.Millisecond))
	defer cancel()

	results := make([]driver.RenewResult, len(batch))
	if r.batcher != nil && len(batch) > 1 {
		results = r.batcher.RenewBatch(ctx, reqs)
	} else {
		for i, g := range batch {
			results[i].Held, results[i].Err = r.renewOne(ctx, g)
		}
	}
	nFailed := 0
	for i, g := range batch {
		res := driver.RenewResult{Err: errors.New("dlock: backend returned too few renew results")}
		if i < len(results) {
			res = results[i]
		}
		if res.Err != nil || !res.Held {
			nFailed++
		}
		lost, failed := g.finishRenewal(sent, res.Held, res.Err)
		r.logLoss(g, lost, failed)
	}
	r.obs.renewed(len(batch), nFailed, sent)
}

// logLoss logs a loss and a failed renewal of g, and reports the loss to
// the observer.
func (r *renewer) logLoss(g *grant, lost *LostError, failed error) {
	logLoss(r.log, g, lost, failed)
	r.obs.lost(g, lost)
}

// renewOne renews g alone, tied to its grant where the backend can (a
// token that outlives one Lock call may hold a newer grant: see
// driver.GrantRenewer).
func (r *renewer) renewOne(ctx context.Context, g *grant) (bool, error) {
	if r.granter != nil {
		return r.granter.RenewGrant(ctx, g.key, g.token, g.fence, g.ttl)
	}
	return r.backend.Renew(ctx, g.key, g.token, g.ttl)
}

// close stops the loop, waits for batches in flight, and releases what is
// still held.
func (r *renewer) close() error {
	r.once.Do(func() {}) // no start after close
	close(r.stop)
	if r.started {
		<-r.done
	}
	r.cancel()
	r.calls.Wait()

	r.mu.Lock()
	grants := append([]*grant(nil), r.h...)
	r.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), CloseTimeout)
	defer cancel()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		slots = make(chan struct{}, 16) // releases in flight at once
	)
	for _, g := range grants {
		holds, lost := g.closing()
		if lost == nil {
			continue
		}
		r.logLoss(g, lost, nil)
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			for range holds {
				res, err := g.c.storeRelease(ctx, g.key, g.token, g.fence, 0)
				if err != nil {
					mu.Lock()
					if first == nil {
						first = wrapStore("release", g.name, err)
					}
					mu.Unlock()
					return
				}
				if !res.Held || res.Remaining == 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// grantHeap orders grants by their next event.
type grantHeap []*grant

func (h grantHeap) Len() int           { return len(h) }
func (h grantHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h grantHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *grantHeap) Push(x any) {
	g := x.(*grant)
	g.index = len(*h)
	*h = append(*h, g)
}
func (h *grantHeap) Pop() any {
	old := *h
	n := len(old)
	g := old[n-1]
	old[n-1] = nil
	g.index = -1
	*h = old[:n-1]
	return g
}
