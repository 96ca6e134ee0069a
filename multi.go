// Multi: locks on several names at once, all or nothing, and the
// MultiLease that holds them together.

package dlock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Multi is a handle on the locks of several names, taken all or nothing:
// Lock and TryLock return a MultiLease that holds every name, one lease
// (and one fence) per name, or hold none of them. The names are taken one
// by one in the order of their keys, the same for every Multi, so two
// callers that ask for overlapping sets in different orders cannot
// deadlock: whoever gets the first name they share goes first. A wait
// that fails, and a TryLock that finds a name held, release the names
// already taken: before they return, or, when the store is slow to answer,
// in the background (Client.Close waits for it). A Multi is safe for
// concurrent use.
//
// Each name is a plain lock (the Mutex of that name): a Mutex or another
// Multi on one of the names excludes it. The cost is that of one Lock per
// name, in turn; on Redis the names' renewals go in the batches of the
// Client's renewal goroutine, one round trip for the names due together.
// A waiting Lock holds the names before the one it waits for; a Multi made
// by MultiAtOnce holds none while it waits.
type Multi struct {
	c     *Client
	names []string // in lock order: by key
	ms    []*Mutex // the names' handles, in lock order
	wait  time.Duration
	err   error
	// atOnce: made by MultiAtOnce; every attempt takes all names in one
	// atomic step (multiatonce.go).
	atOnce bool
}

// Multi returns a handle on the locks of names, all or nothing. The
// options are a Mutex's and apply to every name (WithTTL, Fair,
// WithMetadata, ...); WithWait bounds the whole wait, for all names
// together. Reentrant is refused (ErrInvalid), and so are an empty list
// and a name given twice. Making it touches no store.
func (c *Client) Multi(names []string, opts ...Option) *Multi {
	mm := &Multi{c: c}
	if c == nil {
		mm.err = invalid("client: nil")
		return mm
	}
	if len(names) == 0 {
		mm.err = invalid("names: none")
		return mm
	}
	o := c.opts
	for _, op := range opts {
		if op != nil {
			op.apply(&o)
		}
	}
	if o.reentrant {
		mm.err = invalid("Reentrant: not supported by Multi")
		return mm
	}
	mm.wait = o.wait
	own := append(opts[:len(opts):len(opts)], WithWait(0)) // the Multi bounds the wait
	for _, name := range names {
		m := c.Mutex(name, own...)
		if m.h.err != nil {
			mm.err = m.h.err
			return mm
		}
		mm.ms = append(mm.ms, m)
	}
	slices.SortFunc(mm.ms, func(a, b *Mutex) int { return cmp.Compare(a.h.key, b.h.key) })
	for i, m := range mm.ms {
		if i > 0 && mm.ms[i-1].h.key == m.h.key {
			mm.err = invalid("names: %q given twice", m.h.name)
			return mm
		}
		mm.names = append(mm.names, m.h.name)
	}
	return mm
}

// Names returns the names, in the order they are taken (by key).
func (mm *Multi) Names() []string {
	if mm == nil {
		return nil
	}
	return slices.Clone(mm.names)
}

// TryLock makes one attempt at each name, in turn. When one is held, it
// releases the names it took and returns the *NotObtainedError of that
// name (errors.Is(err, ErrNotObtained)); its other errors are
// Mutex.TryLock's, after the same clean-up.
func (mm *Multi) TryLock(ctx context.Context) (*MultiLease, error) {
	return mm.lock(ctx, false)
}

// Lock obtains every name, waiting for each in turn as Mutex.Lock does,
// for as long as ctx and WithWait allow. When the wait ends first, or a
// name taken already is lost meanwhile, it releases the names it took and
// returns errors.Join(*NotObtainedError, cause) for the name it waited
// for (the cause: ctx's error, or the *LostError of the lost name). Its
// other errors are Mutex.Lock's, after the same clean-up.
func (mm *Multi) Lock(ctx context.Context) (*MultiLease, error) {
	return mm.lock(ctx, true)
}

func (mm *Multi) lock(ctx context.Context, wait bool) (*MultiLease, error) {
	if mm == nil {
		return nil, invalid("multi: nil")
	}
	if mm.err != nil {
		return nil, mm.err
	}
	if mm.atOnce {
		return mm.lockAtOnce(ctx, wait)
	}
	if wait && mm.wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, mm.wait)
		defer cancel()
	}
	// The wait for a name ends, too, when a name taken already is lost.
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var stops []func() bool
	defer func() {
		for _, stop := range stops {
			stop()
		}
	}()
	leases := make([]*Lease, 0, len(mm.ms))
	for _, m := range mm.ms {
		var l *Lease
		var err error
		if wait {
			l, err = m.Lock(wctx)
		} else {
			l, err = m.TryLock(wctx)
		}
		if err != nil {
			mm.giveBack(leases)
			return nil, err
		}
		leases = append(leases, l)
		lctx := l.Context()
		stops = append(stops, context.AfterFunc(lctx, func() { cancel(context.Cause(lctx)) }))
	}
	for _, l := range leases {
		if err := l.Err(); err != nil { // lost after the last wait
			mm.giveBack(leases)
			return nil, errors.Join(&NotObtainedError{Name: l.Name()}, err)
		}
	}
	return newMultiLease(mm.c, leases), nil
}

// giveBack releases the leases of an attempt that failed, last taken
// first, within a TTL, whether or not ctx has ended. It returns once they
// are released, or after the settle bound when the store is slow to
// answer: the releases then go on in the background (Close waits for
// them), so that a caller's deadline holds even when the store cannot be
// reached.
func (mm *Multi) giveBack(leases []*Lease) {
	if len(leases) == 0 {
		return
	}
	mm.c.settle(mm.ms[0].h.opts.ttl, func(uctx context.Context) {
		for i := len(leases) - 1; i >= 0; i-- {
			_ = leases[i].Unlock(uctx)
		}
	})
}

// MultiLease holds the locks of several names together (see Multi): one
// lease, and one fence, per name. Its Context ends, and Done is closed,
// when any of the leases ends: at Unlock, or when one is lost (or is
// unlocked on its own). Then the others are released too, in the
// background: the names are held together and lost together. A
// MultiLease is safe for concurrent use. Only Multi makes one: the
// methods of a nil MultiLease return ErrInvalid or act as if it had ended.
type MultiLease struct {
	c      *Client
	leases []*Lease // in lock order
	stops  []func() bool
	done   chan struct{}
	ctx    context.Context
	held   *heldContext // ctx as Context returns it
	cancel context.CancelCauseFunc

	mu        sync.Mutex
	err       error
	unlocking bool
}

func newMultiLease(c *Client, leases []*Lease) *MultiLease {
	ml := &MultiLease{c: c, leases: leases, done: make(chan struct{})}
	ml.ctx, ml.cancel = context.WithCancelCause(withHold(context.WithValue(context.Background(), multiKey{}, ml), &heldLeases{ml: ml}, false))
	ml.held = &heldContext{Context: ml.ctx, sync: ml.sync}
	for _, l := range leases {
		lctx := l.Context()
		ml.stops = append(ml.stops, context.AfterFunc(lctx, func() { ml.ended(l) }))
	}
	return ml
}

// ended is called when lease l ends: the MultiLease ends with l's Err, and
// the other leases are released in the background, unless Unlock is under
// way.
func (ml *MultiLease) ended(l *Lease) {
	err := l.Err()
	ml.mu.Lock()
	if ml.err != nil || ml.unlocking {
		ml.mu.Unlock()
		return
	}
	ml.finishLocked(err)
	ml.mu.Unlock()
	var lost *LostError
	if errors.As(err, &lost) {
		if lost.Reason == LostClosed {
			return // Close releases the others itself
		}
		ml.c.log.Warn("dlock: a name of a multi-lock was lost; releasing the others", "lock", l.Name(), "fence", l.Fence(), "err", err)
	}
	ml.c.background(ml.leases[0].g.ttl, func(ctx context.Context) {
		for i := len(ml.leases) - 1; i >= 0; i-- {
			if o := ml.leases[i]; o != l {
				_ = o.Unlock(ctx)
			}
		}
	})
}

// finishLocked ends the MultiLease with err; ml.mu is held.
func (ml *MultiLease) finishLocked(err error) {
	ml.err = err
	close(ml.done)
	ml.cancel(err)
}

// multiKey is the context key under which a MultiLease's Context finds
// it.
type multiKey struct{}

// MultiLeaseFromContext returns the MultiLease that ctx carries: a
// MultiLease's own Context and the contexts made from it. ok is false for
// a context that carries none. LeaseFromContextByName gives the lease of
// each of its names.
func MultiLeaseFromContext(ctx context.Context) (ml *MultiLease, ok bool) {
	ml, ok = ctx.Value(multiKey{}).(*MultiLease)
	return ml, ok && ml != nil
}

// Names returns the names held, in the order they were taken.
func (ml *MultiLease) Names() []string {
	if ml == nil {
		return nil
	}
	names := make([]string, len(ml.leases))
	for i, l := range ml.leases {
		names[i] = l.Name()
	}
	return names
}

// Leases returns the leases, one per name, in the order they were taken.
func (ml *MultiLease) Leases() []*Lease {
	if ml == nil {
		return nil
	}
	return slices.Clone(ml.leases)
}

// Lease returns the lease of name, or nil when the MultiLease does not
// hold that name.
func (ml *MultiLease) Lease(name string) *Lease {
	if ml == nil {
		return nil
	}
	for _, l := range ml.leases {
		if l.Name() == name {
			return l
		}
	}
	return nil
}

// Fence returns the fencing token of name's lease; ok is false when the
// MultiLease does not hold that name (a misspelt name), so that no fence 0
// reaches a resource unnoticed. Each name has a fence of its own: give
// each resource the fence of the name that guards it.
func (ml *MultiLease) Fence(name string) (fence uint64, ok bool) {
	l := ml.Lease(name)
	if l == nil {
		return 0, false
	}
	return l.Fence(), true
}

// Context returns a context that is cancelled when the MultiLease ends;
// its context.Cause is Err. Run the work the locks protect under it. Its
// Err and Done read the leases' safe deadlines when called, as Err does.
func (ml *MultiLease) Context() context.Context {
	if ml == nil || ml.ctx == nil {
		return (*Lease)(nil).Context()
	}
	ml.sync()
	return ml.held
}

// Done returns a channel that is closed when the MultiLease ends.
func (ml *MultiLease) Done() <-chan struct{} {
	if ml == nil || ml.done == nil {
		return closedChan
	}
	ml.sync()
	return ml.done
}

// Err returns nil while every name is held, ErrReleased after Unlock (or
// when one of the leases was unlocked on its own), and the *LostError of
// the first name lost (errors.Is(err, ErrLost)). Like Lease.Err, it reads
// the safe deadlines when called.
func (ml *MultiLease) Err() error {
	if ml == nil || ml.ctx == nil {
		return invalid("multi lease: nil or not made by a Multi")
	}
	ml.sync()
	ml.mu.Lock()
	defer ml.mu.Unlock()
	return ml.err
}

// sync ends ml at once when one of its leases has ended, rather than when
// the goroutine that watches that lease's context gets to it: a caller
// that saw a lease end must not find ml still held.
func (ml *MultiLease) sync() {
	for _, l := range ml.leases {
		if l.Err() != nil {
			ml.ended(l)
			return
		}
	}
}

// Deadline returns the earliest of the leases' local validity deadlines
// (see Lease.Deadline).
func (ml *MultiLease) Deadline() time.Time {
	if ml == nil {
		return time.Time{}
	}
	var d time.Time
	for _, l := range ml.leases {
		if ld := l.Deadline(); d.IsZero() || ld.Before(d) {
			d = ld
		}
	}
	return d
}

// Unlock releases every name, the last taken first. It returns nil when
// all were held and released, and otherwise the errors of the leases'
// Unlocks joined (each names its lock: ErrNotHeld for a name that had been
// lost, the store's error), or ErrReleased (wrapped) when the MultiLease
// had ended already and its leases were released. In every case the
// MultiLease has ended when Unlock returns.
func (ml *MultiLease) Unlock(ctx context.Context) error {
	if ml == nil || ml.ctx == nil {
		return invalid("multi lease: nil or not made by a Multi")
	}
	ml.sync()
	ml.mu.Lock()
	ended := ml.err
	ml.unlocking = true
	ml.mu.Unlock()
	var errs []error
	for i := len(ml.leases) - 1; i >= 0; i-- {
		if err := ml.leases[i].Unlock(ctx); err != nil && !(ended != nil && errors.Is(err, ErrReleased)) {
			errs = append(errs, err)
		}
	}
	for _, stop := range ml.stops {
		stop()
	}
	ml.mu.Lock()
	if ml.err == nil {
		ml.finishLocked(ErrReleased)
	}
	ml.mu.Unlock()
	if len(errs) == 0 && errors.Is(ended, ErrReleased) {
		return fmt.Errorf("dlock: unlock %q: %w", ml.Names(), ErrReleased)
	}
	return errors.Join(errs...)
}
