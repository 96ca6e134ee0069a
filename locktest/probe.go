package locktest

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// probe wraps a backend for the cases on lock kinds: it records every
// acquire attempt, and can pause the process (calls wait until resumed) or
// kill it (calls fail from then on, as if the process had died with its
// records left on the store). It keeps the inner backend's capabilities and,
// through backend, its notifications.
type probe struct {
	inner driver.Backend

	mu       sync.Mutex
	idle     *sync.Cond    // signalled when no call is in flight
	inflight int           // calls on their way to the inner backend
	paused   chan struct{} // non-nil while paused; closed by resume
	dead     bool
	deaf     bool // hears no announcement of a direct handoff (driver.Handoff)
	attempts []attempt
	// confirmed is when a Subscribe of the process first returned
	// confirmed (zero before): until then, the process's waiters poll.
	confirmed time.Time
	// stalled counts the acquires held back because their context carries
	// stallKey: they wait for their context to end and never reach the
	// store, like a call waiting for a pooled connection.
	stalled int
}

// stallKey marks a context whose Acquire calls the probe holds back until
// the context ends (see probe.stalled).
type stallKey struct{}

// stalling returns ctx marked so that the probe holds its acquires back.
func stalling(ctx context.Context) context.Context {
	return context.WithValue(ctx, stallKey{}, true)
}

// waitStalled waits until n acquires are held back.
func (p *probe) waitStalled(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.stalled < n {
		p.idle.Wait()
	}
}

// attempt is one Acquire call that the store answered.
type attempt struct {
	token    string
	at       time.Time // when the call was made
	acquired bool
}

var _ driver.Capabler = (*probe)(nil)

// errDead is the answer of every call of a killed probe.
var errDead = errors.New("locktest: the process is dead (simulated)")

func newProbe(inner driver.Backend) *probe {
	p := &probe{inner: inner}
	p.idle = sync.NewCond(&p.mu)
	return p
}

// backend returns the probe as a backend, a driver.Notifier when the inner
// backend is one.
func (p *probe) backend() driver.Backend {
	if _, ok := p.inner.(driver.Notifier); ok {
		return notifyingProbe{p}
	}
	return p
}

// pause makes calls from now on wait until resume, and returns once the
// calls in flight have returned: from then on the process does nothing.
func (p *probe) pause() {
	p.mu.Lock()
	if p.paused == nil {
		p.paused = make(chan struct{})
	}
	for p.inflight > 0 {
		p.idle.Wait()
	}
	p.mu.Unlock()
}

func (p *probe) resume() {
	p.mu.Lock()
	if p.paused != nil {
		close(p.paused)
		p.paused = nil
	}
	p.mu.Unlock()
}

// deafen makes the process miss every announcement of a direct handoff
// from now on, as if each were lost on its way.
func (p *probe) deafen() {
	p.mu.Lock()
	p.deaf = true
	p.mu.Unlock()
}

// kill makes every call from now on fail, paused calls too, and returns
// once the calls in flight have returned.
func (p *probe) kill() {
	p.mu.Lock()
	p.dead = true
	if p.paused != nil {
		close(p.paused)
		p.paused = nil
	}
	for p.inflight > 0 {
		p.idle.Wait()
	}
	p.mu.Unlock()
}

// enter waits while the probe is paused and fails once it is dead. A call
// that enters is in flight until it calls the returned function.
func (p *probe) enter(ctx context.Context) (exit func(), err error) {
	p.mu.Lock()
	for p.paused != nil && !p.dead {
		paused := p.paused
		p.mu.Unlock()
		select {
		case <-paused:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		p.mu.Lock()
	}
	if p.dead {
		p.mu.Unlock()
		return nil, errDead
	}
	p.inflight++
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		if p.inflight--; p.inflight == 0 {
			p.idle.Broadcast()
		}
		p.mu.Unlock()
	}, nil
}

// recorded returns the attempts so far, in the order they were made.
func (p *probe) recorded() []attempt {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]attempt(nil), p.attempts...)
}

func (p *probe) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	if ctx.Value(stallKey{}) != nil {
		p.mu.Lock()
		p.stalled++
		p.idle.Broadcast()
		p.mu.Unlock()
		<-ctx.Done()
		return driver.AcquireResult{}, ctx.Err()
	}
	exit, err := p.enter(ctx)
	if err != nil {
		return driver.AcquireResult{}, err
	}
	defer exit()
	at := time.Now()
	res, err := p.inner.Acquire(ctx, req)
	if err == nil {
		p.mu.Lock()
		p.attempts = append(p.attempts, attempt{token: req.Token, at: at, acquired: res.Acquired})
		p.mu.Unlock()
	}
	return res, err
}

func (p *probe) Renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	exit, err := p.enter(ctx)
	if err != nil {
		return false, err
	}
	defer exit()
	return p.inner.Renew(ctx, key, token, ttl)
}

func (p *probe) Release(ctx context.Context, key, token string) (driver.ReleaseResult, error) {
	exit, err := p.enter(ctx)
	if err != nil {
		return driver.ReleaseResult{}, err
	}
	defer exit()
	return p.inner.Release(ctx, key, token)
}

func (p *probe) Supports(c driver.Capability) bool {
	cb, ok := p.inner.(driver.Capabler)
	return ok && cb.Supports(c)
}

// notifyingProbe is a probe on a backend with notifications.
type notifyingProbe struct{ *probe }

var _ driver.Notifier = notifyingProbe{}

func (p notifyingProbe) Listen(ctx context.Context, fn func(key, next string)) (driver.Listener, error) {
	exit, err := p.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer exit()
	l, err := p.inner.(driver.Notifier).Listen(ctx, p.hear(fn))
	if err != nil {
		return nil, err
	}
	return probeListener{l, p.probe}, nil
}

// hear wraps a listener's fn as the process would hear: a dead process
// hears nothing, a paused one hears what came meanwhile once it resumes.
func (p *probe) hear(fn func(key, next string)) func(key, next string) {
	return func(key, next string) {
		p.mu.Lock()
		dead, paused := p.dead, p.paused
		deaf := p.deaf
		p.mu.Unlock()
		if _, fence := driver.ParseNext(next); deaf && fence > 0 {
			return // lost on its way
		}
		switch {
		case dead:
		case paused != nil:
			go func() {
				<-paused
				p.mu.Lock()
				dead := p.dead
				p.mu.Unlock()
				if !dead {
					fn(key, next)
				}
			}()
		default:
			fn(key, next)
		}
	}
}

// probeListener fails subscriptions of a dead probe.
type probeListener struct {
	driver.Listener
	p *probe
}

func (l probeListener) Subscribe(ctx context.Context, key string) error {
	exit, err := l.p.enter(ctx)
	if err != nil {
		return err
	}
	defer exit()
	err = l.Listener.Subscribe(ctx, key)
	if err == nil {
		l.p.mu.Lock()
		if l.p.confirmed.IsZero() {
			l.p.confirmed = time.Now()
		}
		l.p.mu.Unlock()
	}
	return err
}

// subscribedAt returns when a Subscribe of the process was first
// confirmed, or the zero time.
func (p *probe) subscribedAt() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.confirmed
}

func (p *probe) Withdraw(ctx context.Context, key, token string) error {
	w, ok := p.inner.(driver.Withdrawer)
	if !ok {
		return driver.ErrUnsupported
	}
	exit, err := p.enter(ctx)
	if err != nil {
		return err
	}
	defer exit()
	return w.Withdraw(ctx, key, token)
}
