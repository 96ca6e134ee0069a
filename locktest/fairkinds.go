// The lock kinds that a fair queue serves, as the cases on fair locks and
// the direct handoff drive them: a Mutex (driver.CapFair), and a
// Semaphore and both sides of an RWMutex (driver.CapFairShared).

package locktest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// side is one way of taking a lock: a waiting Lock and a TryLock (a
// Mutex, a reader or writer of an RWMutex, a Semaphore's permit).
type side struct {
	lock, try func(context.Context) (*dlock.Lease, error)
}

// sideOf makes a side of name on c.
type sideOf func(c *dlock.Client, name string, opts ...dlock.Option) side

func mutexSide(c *dlock.Client, name string, opts ...dlock.Option) side {
	m := c.Mutex(name, opts...)
	return side{m.Lock, m.TryLock}
}

func readerSide(c *dlock.Client, name string, opts ...dlock.Option) side {
	rw := c.RWMutex(name, opts...)
	return side{rw.RLock, rw.TryRLock}
}

func writerSide(c *dlock.Client, name string, opts ...dlock.Option) side {
	rw := c.RWMutex(name, opts...)
	return side{rw.Lock, rw.TryLock}
}

// semSide is a Semaphore of permits.
func semSide(permits int) sideOf {
	return func(c *dlock.Client, name string, opts ...dlock.Option) side {
		sem := c.Semaphore(name, permits, opts...)
		return side{sem.Acquire, sem.TryAcquire}
	}
}

// fairKind is a lock kind whose waiters a fair queue serves: holders
// (each in a Client of its own) keep the queue's head out, the first
// holder's release lets it in, and the head's grant keeps other out.
type fairKind struct {
	name    string
	need    driver.Capability // CapFair, or CapFairShared
	holder  sideOf
	holders int
	head    sideOf
	other   sideOf
	// mode and limit are those of the head's requests (a raw one stands
	// for a head that died).
	mode  driver.Mode
	limit int
}

// fairKinds lists the kinds, the Mutex first.
var fairKinds = []fairKind{
	{name: "Mutex", need: driver.CapFair, holder: mutexSide, holders: 1, head: mutexSide, other: mutexSide,
		mode: driver.Exclusive},
	// Two permits held: the first one's release frees one for the head,
	// and then the head and the second holder fill the Semaphore.
	{name: "Semaphore", need: driver.CapFairShared, holder: semSide(2), holders: 2, head: semSide(2), other: semSide(2),
		mode: driver.Shared, limit: 2},
	{name: "RWMutexReader", need: driver.CapFairShared, holder: writerSide, holders: 1, head: readerSide, other: writerSide,
		mode: driver.Shared},
	{name: "RWMutexWriter", need: driver.CapFairShared, holder: readerSide, holders: 1, head: writerSide, other: readerSide,
		mode: driver.Exclusive},
}

// eachFairKind runs fn as a subtest for each kind, on a name of its own
// under base, when the store has the kind's capability (and, for a case
// on the direct handoff, driver.CapHandoff). On a store without
// driver.CapFairShared, the shared kinds check that Fair is refused.
func eachFairKind(t *testing.T, s *Store, base string, handoff bool, fn func(t *testing.T, k fairKind, name string)) {
	for _, k := range fairKinds {
		t.Run(k.name, func(t *testing.T) {
			name := base + "/" + k.name
			if !supports(t, s, k.need) {
				if k.need == driver.CapFairShared {
					fairSharedRefused(t, s, k, name)
				}
				return
			}
			if handoff && !supports(t, s, driver.CapHandoff) {
				return
			}
			fn(t, k, name)
		})
	}
}

// fairSharedRefused checks that a store without driver.CapFairShared
// refuses Fair on kind k's holders and head.
func fairSharedRefused(t *testing.T, s *Store, k fairKind, name string) {
	t.Helper()
	c := client(t, s)
	for what, sideOf := range map[string]sideOf{"holder": k.holder, "head": k.head} {
		sd := sideOf(c, name, dlock.Fair())
		mustBeInvalid(t, fmt.Sprintf("of a fair %s (%s) on a backend without fair shared locks", k.name, what),
			map[string]func(context.Context) (*dlock.Lease, error){"lock": sd.lock, "try": sd.try})
	}
}

// hold takes k's holds of name, each in a Client of its own.
func (k fairKind) hold(t *testing.T, s *Store, name string, opts []dlock.Option) []*dlock.Lease {
	t.Helper()
	held := make([]*dlock.Lease, k.holders)
	for i := range held {
		held[i] = within(t, fmt.Sprintf("%s holder %d", k.name, i), k.holder(client(t, s), name, opts...).lock)
	}
	return held
}

// watch is watchHolds for kind k's holds of name: nothing for a Mutex,
// which has no shared holds to check.
func (k fairKind) watch(t *testing.T, s *Store, name string) (stop func()) {
	t.Helper()
	if k.need != driver.CapFairShared {
		return func() {}
	}
	return watchHolds(t, s, name, k.limit)
}

// unlockAll releases the leases.
func unlockAll(t *testing.T, ls []*dlock.Lease) {
	t.Helper()
	for _, l := range ls {
		unlock(t, l)
	}
}

// lastFence is the largest fence of the leases.
func lastFence(ls []*dlock.Lease) uint64 {
	var f uint64
	for _, l := range ls {
		f = max(f, l.Fence())
	}
	return f
}

// watchHolds checks, until the returned stop is called, that the store
// never shows an exclusive holder beside live shared holds of name, nor
// (with limit) more live shared holds than limit. It reads the store
// through its Inspector, and checks nothing on a store without one. stop
// may be called more than once (deferred as well).
func watchHolds(t *testing.T, s *Store, name string, limit int) (stop func()) {
	t.Helper()
	in, ok := s.NewBackend(t).(driver.Inspector)
	if !ok {
		return func() {}
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	var bad []string
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			info, held, err := in.Inspect(ctx, name)
			switch {
			case err != nil || !held:
			case info.Owner != "" && len(info.Shared) > 0:
				bad = append(bad, fmt.Sprintf("exclusive holder %q beside %d shared holds", info.Owner, len(info.Shared)))
			case limit > 0 && len(info.Shared) > limit:
				bad = append(bad, fmt.Sprintf("%d shared holds of a limit of %d: %+v", len(info.Shared), limit, info.Shared))
			}
			time.Sleep(time.Millisecond)
		}
	}()
	var once sync.Once
	return func() {
		t.Helper()
		once.Do(func() {
			cancel()
			wg.Wait()
			for i, b := range bad {
				if i == 5 {
					t.Errorf("... and %d more", len(bad)-i)
					break
				}
				t.Errorf("the store showed %s", b)
			}
		})
	}
}

// testFairRWMutexBatch checks the order of a fair RWMutex's grants: with a
// writer holding, two readers, a writer and a reader queue in that order;
// the holder's release lets the two readers in together (handed over
// without requests of theirs, on stores with driver.CapHandoff) and not
// the reader behind the queued writer; the readers' releases let the
// writer in, and its release the last reader. Fences rise in that order.
func testFairRWMutexBatch(t *testing.T, s *Store) {
	const name = "locktest/fair-rw-batch"
	if !supports(t, s, driver.CapFairShared) {
		fairSharedRefused(t, s, fairKinds[2], name)
		return
	}
	handoff := supports(t, s, driver.CapHandoff)
	opts := []dlock.Option{dlock.Fair(), dlock.WithTTL(10 * time.Second)}
	holder := within(t, "the holding writer", writerSide(client(t, s), name, opts...).lock)
	stop := watchHolds(t, s, name, 0)
	defer stop()
	whats := []string{"reader 1", "reader 2", "the queued writer", "the reader behind it"}
	sides := []sideOf{readerSide, readerSide, writerSide, readerSide}
	probes := make([]*probe, len(sides))
	outs := make([]<-chan outcome, len(sides))
	for i, sd := range sides {
		probes[i] = newProbe(s.NewBackend(t))
		outs[i] = queuedAt(t, probes[i], sd, name, opts, i+1)
	}
	// requests is the count of each waiter's requests so far.
	requests := func() []int {
		n := make([]int, len(probes))
		for i, p := range probes {
			n[i] = len(p.recorded())
		}
		return n
	}
	// handed checks that waiter i made no request since before.
	handed := func(i int, before []int) {
		t.Helper()
		if n := len(probes[i].recorded()) - before[i]; handoff && n != 0 {
			t.Errorf("%s made %d acquire requests after the release; want 0 (the release handed it the lock)", whats[i], n)
		}
	}
	before := requests()
	unlock(t, holder)
	if in, ok := s.NewBackend(t).(driver.Inspector); ok && handoff {
		// The release has made its grants by the time Unlock returns.
		if info, _, err := in.Inspect(t.Context(), name); err != nil || info.Owner != "" || len(info.Shared) != 2 {
			t.Errorf("right after the writer's release: %+v, %v; want the two readers' holds alone", info, err)
		}
	}
	readers := []*dlock.Lease{waitLease(t, whats[0], outs[0], 10*time.Second), waitLease(t, whats[1], outs[1], 10*time.Second)}
	handed(0, before)
	handed(1, before)
	notYet(t, whats[2]+" (readers hold)", outs[2])
	notYet(t, whats[3]+" (behind the queued writer)", outs[3])
	before = requests()
	unlockAll(t, readers)
	writer := waitLease(t, whats[2], outs[2], 10*time.Second)
	handed(2, before)
	notYet(t, whats[3]+" (the writer holds)", outs[3])
	before = requests()
	unlock(t, writer)
	last := waitLease(t, whats[3], outs[3], 10*time.Second)
	handed(3, before)
	got := []*dlock.Lease{readers[0], readers[1], writer, last}
	for i := 1; i < len(got); i++ {
		if got[i].Fence() <= got[i-1].Fence() {
			t.Errorf("%s's fence %d is not above %s's %d: granted out of arrival order", whats[i], got[i].Fence(), whats[i-1], got[i-1].Fence())
		}
	}
	if !s.RevisionFences && got[0].Fence() != holder.Fence()+1 {
		t.Errorf("the first reader's fence %d, want %d (the grant right after the holder's)", got[0].Fence(), holder.Fence()+1)
	}
	unlock(t, last)
	stop()
	noLeftovers(t, s, name)
}
