// The lock kinds a workload can take beside the Mutex: a read-write lock
// with some workers writing, and a counting semaphore. The worker
// interfaces that take them, and how a run picks each worker's call.

package bench

import (
	"context"
	"errors"
	"fmt"
)

// Workload kinds (Workload.Kind).
const (
	// KindMutex is the exclusive lock (the empty Kind).
	KindMutex = ""
	// KindRW is a read-write lock: Workload.Writers of the workers write,
	// the others read.
	KindRW = "rw"
	// KindSemaphore is a counting semaphore of Workload.Permits permits.
	KindSemaphore = "semaphore"
)

// ErrKindUnsupported is the error (wrapped) of a Run whose subject's
// workers do not take the workload's kind of lock; callers skip that
// subject for that workload.
var ErrKindUnsupported = errors.New("bench: the subject's workers do not take this kind of lock")

// RWLocker takes the two sides of a read-write lock.
type RWLocker interface {
	// RLock blocks until a read (shared) hold of the RWMutex named name is
	// granted, or ctx ends.
	RLock(ctx context.Context, name string) (Held, error)
	// WLock blocks until the write (exclusive) hold of name is granted, or
	// ctx ends.
	WLock(ctx context.Context, name string) (Held, error)
}

// PermitAcquirer takes permits of counting semaphores.
type PermitAcquirer interface {
	// AcquirePermit blocks until one of the permits of the semaphore named
	// name is granted, or ctx ends.
	AcquirePermit(ctx context.Context, name string, permits int) (Held, error)
}

// RWWorker is a worker that takes read-write locks: Run needs it for
// KindRW.
type RWWorker interface {
	Worker
	RWLocker
}

// SemaphoreWorker is a worker that takes semaphore permits: Run needs it
// for KindSemaphore.
type SemaphoreWorker interface {
	Worker
	PermitAcquirer
}

// WithKinds returns w with the methods of rw and sem, those that are not
// nil: a RWWorker, a SemaphoreWorker, both, or w itself. Wrappers of
// workers use it to keep the kinds of what they wrap.
func WithKinds(w Worker, rw RWLocker, sem PermitAcquirer) Worker {
	switch {
	case rw != nil && sem != nil:
		return kindsBoth{w, rw, sem}
	case rw != nil:
		return kindsRW{w, rw}
	case sem != nil:
		return kindsSem{w, sem}
	}
	return w
}

type kindsRW struct {
	Worker
	RWLocker
}

type kindsSem struct {
	Worker
	PermitAcquirer
}

type kindsBoth struct {
	Worker
	RWLocker
	PermitAcquirer
}

// writer reports whether worker id writes in an rw workload: the Writers
// writers are spread evenly over the ids (0 and 4 of 8 for 2).
func (w Workload) writer(id int) bool {
	if w.Kind != KindRW {
		return false
	}
	for i := range w.Writers {
		if i*w.Workers/w.Writers == id {
			return true
		}
	}
	return false
}

// lockFunc returns what worker id of wk calls to lock in workload w, and
// whether its holds are shared; an error wrapping ErrKindUnsupported when
// wk does not take w's kind.
func (w Workload) lockFunc(wk Worker, id int) (func(context.Context, string) (Held, error), bool, error) {
	switch w.Kind {
	case KindRW:
		rw, ok := wk.(RWLocker)
		if !ok {
			return nil, false, fmt.Errorf("%w: no read-write locks (%T)", ErrKindUnsupported, wk)
		}
		if w.writer(id) {
			return rw.WLock, false, nil
		}
		return rw.RLock, true, nil
	case KindSemaphore:
		sem, ok := wk.(PermitAcquirer)
		if !ok {
			return nil, false, fmt.Errorf("%w: no semaphores (%T)", ErrKindUnsupported, wk)
		}
		return func(ctx context.Context, name string) (Held, error) {
			return sem.AcquirePermit(ctx, name, w.Permits)
		}, true, nil
	}
	return wk.Lock, false, nil
}

// checkKind checks the fields of w's kind.
func (w Workload) checkKind() error {
	switch w.Kind {
	case KindMutex, KindRW, KindSemaphore:
	default:
		return fmt.Errorf("bench: workload %s: unknown kind %q (want %q, %q or %q)", w.Label(), w.Kind, KindMutex, KindRW, KindSemaphore)
	}
	switch {
	case w.Kind == KindRW && w.Workers < 2:
		return fmt.Errorf("bench: workload %s: a read-write workload needs at least 2 workers (a writer and a reader), not %d", w.Label(), w.Workers)
	case w.Kind == KindRW && (w.Writers < 1 || w.Writers >= w.Workers):
		return fmt.Errorf("bench: workload %s: writers must be between 1 and %d (workers − 1), not %d", w.Label(), w.Workers-1, w.Writers)
	case w.Kind != KindRW && w.Writers != 0:
		return fmt.Errorf("bench: workload %s: writers (%d) are for read-write workloads only", w.Label(), w.Writers)
	case w.Kind == KindSemaphore && w.Permits < 1:
		return fmt.Errorf("bench: workload %s: permits must be at least 1, not %d", w.Label(), w.Permits)
	case w.Kind != KindSemaphore && w.Permits != 0:
		return fmt.Errorf("bench: workload %s: permits (%d) are for semaphore workloads only", w.Label(), w.Permits)
	}
	return nil
}
