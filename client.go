// The Client: making one, its lifecycle (calls in progress, Close), and the
// services it gives its handles and grants (releases, clean-ups, background
// work, logging).

package dlock

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// Client makes locks on one backend. It owns one renewal goroutine that
// serves all of its leases, and at most one notification stream that serves
// all of its waiters. A Client is safe for concurrent use; Close stops its
// goroutines.
type Client struct {
	backend driver.Backend
	drift   func(ttl time.Duration) time.Duration // nil when the backend has no drift allowance
	opts    options
	log     *slog.Logger
	err     error // set by New for a nil backend or invalid options

	renewer *renewer
	hub     *waitHub
	rides   *rides     // nil when the backend cannot carry an acquire with a release
	obs     *observer  // nil without WithObserver
	owners  ownerCache // the owner string of the current second

	mu     sync.Mutex
	cond   *sync.Cond
	closed bool
	active int // calls in progress, waited for by Close
	// closingCtx is cancelled when Close begins. A wait's context follows
	// it through context.AfterFunc, which costs no goroutine for a context
	// made by the context package (it would for a context type of ours).
	closingCtx    context.Context
	cancelClosing context.CancelFunc
	closeDone     chan struct{} // closed when Close has finished
	bgClosed      bool          // no more background work may start
	bg            sync.WaitGroup

	ctx    context.Context // cancelled at the end of Close
	cancel context.CancelFunc
}

// New returns a Client that keeps its locks in backend. The options are the
// defaults of every lock the Client makes. A nil backend or an invalid option
// does not panic: every call on the Client then returns ErrInvalid.
func New(backend driver.Backend, opts ...Option) *Client {
	c := &Client{backend: backend, opts: defaultOptions(), closeDone: make(chan struct{})}
	c.cond = sync.NewCond(&c.mu)
	c.owners.identity = clientIdentity(clients.Add(1))
	c.closingCtx, c.cancelClosing = context.WithCancel(context.Background())
	for _, o := range opts {
		if o != nil {
			o.apply(&c.opts)
		}
	}
	c.log = c.opts.logger
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if d, ok := backend.(driver.Drifter); ok {
		c.drift = d.Drift
	}
	switch {
	case backend == nil:
		c.err = invalid("backend: nil")
	default:
		// Check the defaults with a placeholder name, so that a bad TTL is
		// reported at once rather than by every lock.
		if err := c.opts.validate("x"); err != nil {
			c.err = err
		} else if err := c.checkBackend(&c.opts); err != nil {
			c.err = err
		}
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	store := ""
	if sn, ok := backend.(driver.StoreNamer); ok {
		store = sn.StoreName()
	}
	c.obs = newObserver(c.opts.observer, c.opts.keyPrefix, c.owners.identity, store)
	c.renewer = newRenewer(backend, c.log, c.obs)
	notifier, _ := backend.(driver.Notifier)
	c.hub = newWaitHub(notifier, c.log, c.ctx)
	c.rides = newRides(backend)
	return c
}

// checkBackend checks the options the backend must support.
func (c *Client) checkBackend(o *options) error {
	if c.drift != nil {
		if d := c.drift(o.ttl); o.ttl-d-o.safetyMargin() <= 0 {
			return invalid("ttl: %v leaves nothing after the backend's drift allowance (%v) and the safety margin (%v)", o.ttl, d, o.safetyMargin())
		}
	}
	if o.lockDelay > 0 {
		if err := c.need(driver.CapLockDelay); err != nil {
			return err
		}
	}
	if o.fair {
		return c.need(driver.CapFair)
	}
	return nil
}

// validFor returns how long after its send time a grant or renewal of ttl
// is valid: ttl, less the backend's drift allowance.
func (c *Client) validFor(ttl time.Duration) time.Duration {
	if c.drift == nil {
		return ttl
	}
	return ttl - c.drift(ttl)
}

// Close releases every lease the Client still holds (their Err becomes a
// *LostError with reason LostClosed; the releases are sent in parallel and
// given at most CloseTimeout together), ends waits in progress with
// ErrClosed, waits for Unlock calls in progress, and stops the Client's
// goroutines before it returns. Calls after Close return ErrClosed. Close
// returns the first error from releasing leases; a second Close waits for
// the first and returns nil.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		<-c.closeDone
		return nil
	}
	c.closed = true
	c.cancelClosing()
	for c.active > 0 {
		c.cond.Wait()
	}
	c.mu.Unlock()

	err := c.renewer.close()
	c.hub.close()
	c.mu.Lock()
	c.bgClosed = true
	c.mu.Unlock()
	c.bg.Wait() // clean-ups in flight finish before their context goes
	c.cancel()
	close(c.closeDone)
	return err
}

// CloseTimeout bounds how long Client.Close spends releasing leases.
const CloseTimeout = 5 * time.Second

// enter registers a call in progress; it fails once the Client is closed.
func (c *Client) enter() error {
	if c.err != nil {
		return c.err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	c.active++
	return nil
}

func (c *Client) exit() {
	c.mu.Lock()
	c.active--
	if c.active == 0 {
		c.cond.Broadcast()
	}
	c.mu.Unlock()
}

// owner returns the owner string of an acquire sent at sent.
func (c *Client) owner(sent time.Time, metadata string) string {
	return c.owners.get(sent, metadata)
}

// logLoss logs a loss and a failed renewal; call it without holding a
// grant's mu, since a log handler may call back into the lease.
func (c *Client) logLoss(g *grant, lost *LostError, failed error) {
	c.renewer.logLoss(g, lost, failed)
}

// logLoss logs a loss and a failed renewal to log.
func logLoss(log *slog.Logger, g *grant, lost *LostError, failed error) {
	if failed != nil {
		log.Warn("dlock: renewal failed", "lock", g.name, "fence", g.fence, "err", failed)
	}
	if lost != nil {
		log.Warn("dlock: lease lost", "lock", g.name, "fence", g.fence, "reason", lost.Reason.String(), "err", lost.Cause)
	}
}

// background runs fn in a goroutine that Close waits for, with a context
// that ends after timeout. Once Close no longer waits, fn runs in the caller.
func (c *Client) background(timeout time.Duration, fn func(ctx context.Context)) {
	c.mu.Lock()
	if c.bgClosed {
		c.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		fn(ctx)
		return
	}
	c.bg.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.bg.Done()
		ctx, cancel := context.WithTimeout(c.ctx, timeout)
		defer cancel()
		fn(ctx)
	}()
}

// closeAware returns ctx, also cancelled with ErrClosed when Close begins, so
// that a wait never holds Close up.
func (c *Client) closeAware(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(c.closingCtx, func() { cancel(ErrClosed) })
	return ctx, func() {
		stop()
		cancel(nil)
	}
}
