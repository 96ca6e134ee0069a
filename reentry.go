// The reentry lock of a reentrant handle: its acquires against its last release.

package dlock

import (
	"context"
	"sync"
)

// reentryLock is a reader-writer lock whose waits end with a context or
// with the Client's Close. A reentrant handle's acquires hold it shared,
// from the moment they look for the grant to join until they have made
// their lease; each Unlock holds it exclusively, from taking its lease off
// the grant through the last release and its drain. So the holds a last
// release counts and drains are its grant's own: a Lock of the handle
// cannot add one under the same fence meanwhile. A waiting Unlock keeps
// new acquires out, so that a stream of re-entries cannot starve it.
type reentryLock struct {
	mu      sync.Mutex
	readers int
	writer  bool
	waiting int           // Unlocks waiting for the lock
	changed chan struct{} // closed (and dropped) when the lock opens; nil when no one waits
}

// enter takes the lock, shared or exclusive, or gives up when ctx ends
// (its error) or the Client closes (ErrClosed).
func (g *reentryLock) enter(ctx context.Context, closing <-chan struct{}, exclusive bool) error {
	counted := false
	defer func() {
		if counted {
			g.mu.Lock()
			g.waiting--
			if g.changed != nil { // acquires that waited behind this Unlock may go
				close(g.changed)
				g.changed = nil
			}
			g.mu.Unlock()
		}
	}()
	for {
		g.mu.Lock()
		if !g.writer && (exclusive && g.readers == 0 || !exclusive && g.waiting == 0) {
			if exclusive {
				g.writer = true
			} else {
				g.readers++
			}
			g.mu.Unlock()
			return nil
		}
		if exclusive && !counted {
			g.waiting++
			counted = true
		}
		if g.changed == nil {
			g.changed = make(chan struct{})
		}
		ch := g.changed
		g.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-closing:
			return ErrClosed
		}
	}
}

// exit gives the lock back.
func (g *reentryLock) exit(exclusive bool) {
	g.mu.Lock()
	if exclusive {
		g.writer = false
	} else {
		g.readers--
	}
	if g.changed != nil {
		close(g.changed)
		g.changed = nil
	}
	g.mu.Unlock()
}
