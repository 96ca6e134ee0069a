// The write gate of a SQLiteBackend: a wait for SQLite's write lock that
// is woken when the lock frees, between the processes of the host.

package sqllock

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// maxGateWait bounds a wait for the gate, as does half the time left to
// the operation's context. Past it the operation goes ahead without the
// gate, and SQLite's busy handler waits as it would without one, and the
// Backend's next operations skip the gate until that wait ends (stalled): a
// process stopped while it holds the gate, between two statements, delays
// another by this much once, not on every operation. A gate held for a
// write takes well under a millisecond.
const maxGateWait = 200 * time.Millisecond

// gateFile is the gate's file in the directory of the wake-up sockets.
const gateFile = "write.gate"

// writeGate serializes some lock operations of the SQLiteBackends of the
// host that use one database file before SQLite's write lock does: each
// holds an exclusive flock(2) on a file beside the sockets while it runs.
// A statement that finds SQLite's write lock taken sleeps in SQLite's busy
// handler, 1, 2, 5, … up to 100 ms a step, and who writes next is whoever
// wakes first, while the lock may sit free; a process blocked in flock is
// woken by the kernel the moment the holder lets go.
//
// The operations that go through the gate are those a wait hangs on: fair
// requests (the queue's head, woken by the release that freed the lock for
// it), releases, withdrawals, renewals and BreakIf. Plain requests do not:
// their waiters all race at each release, and the holder's next request
// with them, so that served at once they cost more statements than the
// sleeps they save. On the hot key of docs/PERFORMANCE.md the gate took a
// fair Mutex from about 300 to 450 grants/s and its blocked-wait p99 from
// 90–120 ms to about 20 ms; through the gate too, plain requests made a
// Jain of 0.99 at a third of the grants.
//
// The gate is a pace, never a guarantee: every operation is safe without
// it (SQLite's own locking decides), and whatever stops it from working (an
// in-memory database, a directory that cannot be made or trusted, a system
// without flock) leaves the operations to SQLite's busy handler alone.
//
// One operation of a Backend at a time waits in flock, the others of the
// same Backend wait for it in turn (sem): a blocked flock holds a thread.
// A holder's operations (renewals, the release of a grant, BreakIf) go
// before waiters' (fair requests, withdrawals, clean-ups) in that turn: a
// Client whose goroutines wait for a lock must not make its own holders
// lose their leases.
// A wait that gave up stays blocked in flock until the holder lets go: while
// a process holding the gate is stopped (SIGSTOP), each Backend that waited
// for it keeps one goroutine, and its thread, there until the process is
// continued or dies.
type writeGate struct {
	wake    *localWake
	maxWait time.Duration // maxGateWait; tests of the gate's turns lengthen it
	sem     turnstile     // held from the wait for the flock to its release
	stalled atomic.Bool   // a wait gave up and still waits: skip the gate

	mu  sync.Mutex
	f   *os.File // the gate's file, once opened
	off bool     // the gate cannot work here: operations go without it
}

// newWriteGate returns the gate of the Backend whose wake-ups w sends, or
// nil on a system without flock.
func newWriteGate(w *localWake) *writeGate {
	if !gateWorks {
		return nil
	}
	return &writeGate{wake: w, maxWait: maxGateWait}
}

// enter waits for the gate, within ctx and maxGateWait, and returns the
// function that leaves it; a holder's operation (urgent) goes before the
// Backend's other ones. When the wait fails or gives up, the returned
// function does nothing and the operation runs without the gate.
func (g *writeGate) enter(ctx context.Context, urgent bool) (leave func()) {
	if g == nil || g.stalled.Load() {
		return noLeave
	}
	budget := g.maxWait
	if d, ok := ctx.Deadline(); ok {
		budget = min(budget, time.Until(d)/2)
	}
	giveUp := time.NewTimer(budget)
	defer giveUp.Stop()
	if !g.sem.enter(ctx, urgent, giveUp.C) {
		return noLeave
	}
	f := g.file(ctx)
	if f == nil {
		g.sem.leave()
		return noLeave
	}
	release := func() {
		_ = unlockFile(f)
		g.sem.leave()
	}
	if lockFileNow(f) {
		return release
	}
	// Taken: wait in flock on a goroutine of its own, which, when this
	// caller gives up first, lets go of the flock and of sem once it has
	// them.
	var (
		mu      sync.Mutex
		got     bool
		gaveUp  bool
		granted = make(chan struct{})
	)
	go func() {
		err := lockFile(f)
		mu.Lock()
		defer mu.Unlock()
		if gaveUp {
			if err == nil {
				_ = unlockFile(f)
			}
			g.stalled.Store(false)
			g.sem.leave()
			return
		}
		got = err == nil
		close(granted)
	}()
	select {
	case <-granted:
	case <-ctx.Done():
	case <-giveUp.C:
	}
	mu.Lock()
	defer mu.Unlock()
	select {
	case <-granted:
		if got {
			return release
		}
		g.sem.leave()
		return noLeave
	default:
		gaveUp = true // the goroutine lets go of sem
		g.stalled.Store(true)
		return noLeave
	}
}

func noLeave() {}

// turnstile lets one holder in at a time; urgent waiters go before the
// others, each kind in the order it came. The zero value is open.
type turnstile struct {
	mu             sync.Mutex
	held           bool
	urgent, normal []chan struct{} // waiters, closed when it is their turn
}

// enter waits for the turnstile until ctx ends or giveUp fires, and
// reports whether it holds it.
func (s *turnstile) enter(ctx context.Context, urgent bool, giveUp <-chan time.Time) bool {
	s.mu.Lock()
	if !s.held {
		s.held = true
		s.mu.Unlock()
		return true
	}
	turn := make(chan struct{})
	if urgent {
		s.urgent = append(s.urgent, turn)
	} else {
		s.normal = append(s.normal, turn)
	}
	s.mu.Unlock()
	select {
	case <-turn:
		return true
	case <-ctx.Done():
	case <-giveUp:
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-turn: // its turn came meanwhile: passed on
		s.pass()
	default:
		s.urgent = slices.DeleteFunc(s.urgent, func(c chan struct{}) bool { return c == turn })
		s.normal = slices.DeleteFunc(s.normal, func(c chan struct{}) bool { return c == turn })
	}
	return false
}

// leave lets the next waiter in.
func (s *turnstile) leave() {
	s.mu.Lock()
	s.pass()
	s.mu.Unlock()
}

// pass hands the turnstile to the next waiter, urgent ones first, or
// opens it; the caller holds mu.
func (s *turnstile) pass() {
	var next chan struct{}
	switch {
	case len(s.urgent) > 0:
		next, s.urgent = s.urgent[0], s.urgent[1:]
	case len(s.normal) > 0:
		next, s.normal = s.normal[0], s.normal[1:]
	default:
		s.held = false
		return
	}
	close(next)
}

// file returns the gate's file, opened (and its directory made) the first
// time, or nil when the gate cannot work here. It opens the file again when
// the one it has is no longer at its path (the directory was removed, as a
// tmp cleaner does: processes that open the gate since would lock another
// file than this one). The caller holds sem: nobody uses g.f meanwhile.
func (g *writeGate) file(ctx context.Context) *os.File {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.off {
		return nil
	}
	if g.f != nil {
		if atPath(g.f) {
			return g.f
		}
		_ = g.f.Close()
		g.f = nil
	}
	dir, err := g.wake.directory(ctx)
	if err != nil {
		if ctx.Err() == nil {
			g.off = true
		}
		return nil
	}
	if os.MkdirAll(dir, 0o700) != nil || wakeDirTrusted(dir) != nil {
		g.off = true
		return nil
	}
	f, err := os.OpenFile(filepath.Join(dir, gateFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		g.off = true
		return nil
	}
	g.f = f
	return f
}

// atPath reports whether f is still the file at its path, which one stat
// of each tells: a removed or replaced file is not.
func atPath(f *os.File) bool {
	here, err := f.Stat()
	if err != nil {
		return false
	}
	there, err := os.Stat(f.Name())
	return err == nil && os.SameFile(here, there)
}
