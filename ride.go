// Rides: a waiter's attempt carried by its own Client's release of the key
// (driver.ReleaseAcquirer), so that a hand-over between goroutines of one
// Client costs no round trip beyond the release.

package dlock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// rides are a Client's parked attempts. While the Client holds a key
// exclusively, a waiter of the same Client on that key that does not queue
// (a request without Fair) has nothing to learn from the store: the lock
// stays taken until this Client releases it. So the waiter's attempt parks, and the Client's next release of the key
// sends it in the same round trip, after the release (storeRelease). A
// parked attempt that no release takes goes out by itself once the holding
// lease ends without one (a loss, an Unlock that leaves the release to the
// background), or the wait's context or the Client ends.
//
// The store sees the attempt as it would see one sent by the waiter the
// moment the release was answered, which is what a waiter woken by the
// release would send: the same request, a round trip earlier. The release
// waits for the waiter to take in the answer (ride.ack), so that a grant
// the attempt brought is the Client's holding lease by the time Unlock
// returns, for the next Lock of the key to park on.
//
// Its own mutex is taken after a lease's (a lease calls unhold as it ends)
// and never before one.
type rides struct {
	ra driver.ReleaseAcquirer

	mu sync.Mutex
	// holders is the Client's latest exclusive lease on each key, while no
	// other Client was known to wait for the key when it was granted (see
	// handle.holding).
	holders map[string]*Lease
	parked  map[string]*ride // at most one attempt per key
}

// ride is one parked attempt.
type ride struct {
	req      driver.AcquireRequest
	metadata string        // for the owner string, made as the ride goes out
	done     chan struct{} // closed once a release sent the attempt and has its answer
	ack      chan struct{} // closed by the waiter once it has dealt with the answer
	// state is rideOut while a release carries the attempt, then
	// rideAnswered, or rideGone when the waiter stopped waiting for the
	// answer first (see send): the release then gives back what the
	// attempt got.
	state atomic.Int32
	// Set before done is closed: when the attempt went out, its answer.
	sent time.Time
	res  driver.AcquireResult
	err  error
}

// The states of a taken ride.
const (
	rideOut int32 = iota
	rideAnswered
	rideGone
)

// rideEnded is the error of a parked attempt whose wait ended: it never
// went out, or the release that carried it gives back what it got (see
// releaseWith). Either way its caller has nothing to clean up.
type rideEnded struct{ error }

func (e rideEnded) Unwrap() error { return e.error }

// rideDropped reports whether err is a rideEnded, which leaves its caller
// nothing to clean up.
func rideDropped(err error) bool {
	var e rideEnded
	return errors.As(err, &e)
}

// newRides returns the rides of a Client on backend, or nil when the
// backend cannot carry an acquire with a release.
func newRides(backend driver.Backend) *rides {
	ra, ok := backend.(driver.ReleaseAcquirer)
	if !ok {
		return nil
	}
	return &rides{ra: ra, holders: make(map[string]*Lease), parked: make(map[string]*ride)}
}

// hold records l as the Client's exclusive lease on key.
func (r *rides) hold(key string, l *Lease) {
	r.mu.Lock()
	r.holders[key] = l
	r.mu.Unlock()
}

// holds reports whether l is the lease the Client's waiters on key park
// their attempts on (false on a nil rides).
func (r *rides) holds(key string, l *Lease) bool {
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.holders[key] == l
}

// unhold forgets l as the Client's lease on key, as l ends (nothing on a
// nil rides). It is called with l's mutex held.
func (r *rides) unhold(key string, l *Lease) {
	if r == nil {
		return
	}
	r.mu.Lock()
	if r.holders[key] == l {
		delete(r.holders, key)
	}
	r.mu.Unlock()
}

// park parks req while the Client holds key, and returns the ride and the
// holding lease; nil when the Client does not hold key or another attempt
// is parked on it.
func (r *rides) park(key string, req driver.AcquireRequest, metadata string) (*ride, *Lease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.holders[key]
	if l == nil || r.parked[key] != nil {
		return nil, nil
	}
	rd := &ride{req: req, metadata: metadata, done: make(chan struct{}), ack: make(chan struct{})}
	r.parked[key] = rd
	return rd, l
}

// unpark takes rd back for its waiter; false when a release took it.
func (r *rides) unpark(key string, rd *ride) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.parked[key] != rd {
		return false
	}
	delete(r.parked, key)
	return true
}

// holder returns the Client's exclusive lease on key when an attempt may
// park for its release: nil when the Client does not hold key or another
// attempt is parked on it.
func (r *rides) holder(key string) *Lease {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.parked[key] != nil {
		return nil
	}
	return r.holders[key]
}

// take takes the attempt parked on key, if any, for a release to carry.
func (r *rides) take(key string) *ride {
	r.mu.Lock()
	defer r.mu.Unlock()
	rd := r.parked[key]
	if rd != nil {
		delete(r.parked, key)
	}
	return rd
}

// errCarrierEnded is the error of an attempt whose release's context ended
// while they were on their way.
var errCarrierEnded = driver.Transient(errors.New("dlock: the release that carried the attempt was cut short; its outcome is unknown"))

// releaseWith sends the release of token on key (tied to fence when not 0)
// and rd's attempt in one round trip, hands rd its answer and waits until
// its waiter has dealt with it.
func (c *Client) releaseWith(ctx context.Context, rd *ride, key, token string, fence uint64) (driver.ReleaseResult, error) {
	rd.sent = time.Now()
	rd.req.Owner = c.owner(rd.sent, rd.metadata)
	res, err := c.rides.ra.ReleaseAcquire(ctx, key, token, fence, rd.req)
	rd.res, rd.err = res.Acquire, res.AcquireErr
	if err != nil && rd.err == nil {
		rd.err = err
	}
	if rd.err != nil && ctx.Err() != nil && !driver.IsTransient(rd.err) {
		// Cut short by the release's context, not the waiter's: for the
		// waiter, an attempt of unknown outcome, to try again.
		rd.err = errCarrierEnded
	}
	if rd.state.CompareAndSwap(rideOut, rideAnswered) {
		close(rd.done)
		<-rd.ack
	} else {
		// The waiter is gone: whatever the attempt got, or may have got
		// (a grant, a queue entry, a writer intent), goes back now that
		// it cannot land later.
		c.background(rd.req.TTL, c.cleanupRelease(key, rd.req.Token))
	}
	return res.Release, err
}

// send sends req, an attempt made at sent. With ride (a waiting attempt of
// a handle that may park; see handle.try), a request with a token of its
// own (a writer's or a reader's, a permit's) and without Fair parks while
// the Client holds the key exclusively, for the Client's release of the
// key to carry (see rides). It returns the answer, when the request went
// out and, when a release carried it, the ride, whose ack the caller
// closes once it has dealt with the answer.
func (h *handle) send(ctx context.Context, req driver.AcquireRequest, sent time.Time, ride bool) (driver.AcquireResult, time.Time, *ride, error) {
	rs := h.c.rides
	if !ride || rs == nil || !req.Wait || req.Fair || h.token != "" {
		// A fair request takes its place in the queue as it arrives: parked,
		// it would arrive only at the release, behind the waiters of other
		// Clients that came after it.
		res, err := h.backend.Acquire(ctx, req)
		return res, sent, nil, err
	}
	if holder := rs.holder(h.key); holder != nil {
		// The lock is held, by this Client: the caller hears it as it
		// would hear it from the store (WithOnBusy), before the attempt
		// parks, since fn may release the hold, which would wait for a
		// parked attempt's waiter. The owner takes the grant's mutex,
		// which an ending lease holds before it takes the rides' (see
		// Lease.finish).
		h.busy(driver.AcquireResult{Holder: holder.g.ownerNow(), HolderTTL: max(time.Until(holder.g.deadlineNow()), 0)})
	}
	if rd, holder := rs.park(h.key, req, h.opts.metadata); rd != nil {
		held := holder.Done() // takes the lease's mutex, as the owner above
		select {
		case <-rd.done:
		case <-held:
		case <-ctx.Done():
		case <-h.c.closingCtx.Done():
		}
		if !rs.unpark(h.key, rd) {
			// A release took it: the answer comes with the release's.
			select {
			case <-rd.done:
				return rd.res, rd.sent, rd, rd.err
			case <-ctx.Done():
				if rd.state.CompareAndSwap(rideOut, rideGone) {
					// On its way: the release gives back what it gets.
					return driver.AcquireResult{}, sent, rd, rideEnded{ctx.Err()}
				}
				<-rd.done // answered meanwhile
				return rd.res, rd.sent, rd, rd.err
			}
		}
		if err := ctx.Err(); err != nil {
			// Never sent: nothing to clean up on the store.
			return driver.AcquireResult{}, sent, nil, rideEnded{err}
		}
		// The holding lease ended with no release to carry the attempt, or
		// the Client is closing: it goes out by itself.
		sent = time.Now()
		req.Owner = h.c.owner(sent, h.opts.metadata)
	}
	res, err := h.backend.Acquire(ctx, req)
	return res, sent, nil, err
}
