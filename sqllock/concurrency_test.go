package sqllock_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/sqllock"
)

// checker watches, from outside the store, who believes it holds which
// lock: a holder enters after its Acquire returned and leaves before it
// calls Release, so any overlap it sees happened on the store too.
type checker struct {
	t  *testing.T
	mu sync.Mutex
	// per name
	readers, writers map[string]int
	fences           map[string]map[uint64]bool
	maxFence         map[string]uint64 // largest fence of a grant returned so far
	limit            map[string]int    // semaphore names
	grants           map[string]int
}

func newChecker(t *testing.T) *checker {
	return &checker{
		t: t, readers: map[string]int{}, writers: map[string]int{},
		fences: map[string]map[uint64]bool{}, maxFence: map[string]uint64{},
		limit: map[string]int{}, grants: map[string]int{},
	}
}

// floor is the largest fence granted before an attempt starts: the
// attempt's grant must draw a larger one.
func (c *checker) floor(name string) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.maxFence[name]
}

func (c *checker) enter(name string, shared bool, fence, floor uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if fence <= floor {
		c.t.Errorf("%s: fence %d, not above %d granted before the attempt", name, fence, floor)
	}
	if c.fences[name] == nil {
		c.fences[name] = map[uint64]bool{}
	}
	if c.fences[name][fence] {
		c.t.Errorf("%s: fence %d granted twice", name, fence)
	}
	c.fences[name][fence] = true
	c.maxFence[name] = max(c.maxFence[name], fence)
	c.grants[name]++
	if shared {
		c.readers[name]++
	} else {
		c.writers[name]++
	}
	r, w := c.readers[name], c.writers[name]
	switch {
	case w > 1:
		c.t.Errorf("%s: %d writers at once", name, w)
	case w == 1 && r > 0:
		c.t.Errorf("%s: a writer beside %d readers", name, r)
	case c.limit[name] > 0 && r > c.limit[name]:
		c.t.Errorf("%s: %d permits out of %d", name, r, c.limit[name])
	}
}

func (c *checker) leave(name string, shared bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if shared {
		c.readers[name]--
	} else {
		c.writers[name]--
	}
}

// testConcurrentKinds has workers, each on a pool of its own as separate
// processes would be, take readers, writers (with Wait, so that they record
// intents), fair writers and semaphore permits on a few neighbouring names
// at once, renew and release them, and give up waits, while the checker
// verifies that a writer never overlaps a reader or another writer, that
// permits never exceed the limit, and that fences grow. It is what catches
// a grant decided on a stale read of the shared holds.
func testConcurrentKinds(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	if err := db.backend(t).CreateTable(t.Context()); err != nil {
		t.Fatal(err)
	}
	const (
		workers  = 6
		duration = 3 * time.Second
		ttl      = time.Minute
		qttl     = 2 * time.Second
	)
	rwNames := []string{"c/a", "c/b", "c/c"} // c/c's writers are fair
	semName, semLimit := "c/sem", 2
	c := newChecker(t)
	c.limit[semName] = semLimit

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	stop := time.Now().Add(duration)
	var wg sync.WaitGroup
	for w := range workers {
		b := db.backend(t)
		rng := rand.New(rand.NewPCG(uint64(w), 42))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) && ctx.Err() == nil {
				name := rwNames[rng.IntN(len(rwNames))]
				req := driver.AcquireRequest{Key: name, Token: newToken(), Owner: fmt.Sprint("worker ", w), TTL: ttl}
				switch op := rng.IntN(10); {
				case op < 5: // reader
					req.Mode = driver.Shared
				case op < 8: // writer
					req.Wait, req.QueueTTL = true, qttl
					req.Fair = name == "c/c"
				default: // permit
					req.Key, req.Mode, req.Limit = semName, driver.Shared, semLimit
				}
				giveUp := rng.IntN(8) == 0 // a waiter that leaves after a few tries
				if !run(ctx, t, b, c, req, giveUp, rng) {
					return
				}
			}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatal("the workers did not finish within 2 minutes: a waiter starved or a call hung")
	}
	c.mu.Lock()
	t.Logf("%v: grants per name %v", db.dialect, c.grants)
	c.mu.Unlock()
	for _, name := range append(rwNames, semName) {
		noRows(t, db, name)
	}
}

// run acquires req (trying again every few milliseconds), holds it for a
// moment (renewing it sometimes) and releases it; with giveUp it may leave
// after a few refusals, releasing whatever its waiting recorded. It reports
// false after a failure.
func run(ctx context.Context, t *testing.T, b *sqllock.Backend, c *checker, req driver.AcquireRequest, giveUp bool, rng *rand.Rand) bool {
	shared := req.Mode == driver.Shared
	floor := c.floor(req.Key)
	for attempt := 0; ; attempt++ {
		res, err := b.Acquire(ctx, req)
		if err != nil {
			t.Errorf("Acquire(%s, %s, fair %v): %v", req.Key, req.Mode, req.Fair, err)
			return false
		}
		if res.Acquired {
			c.enter(req.Key, shared, res.Fence, floor)
			break
		}
		if giveUp && attempt >= 3 {
			if _, err := b.Release(ctx, req.Key, req.Token); err != nil {
				t.Errorf("Release of a waiter that gave up: %v", err)
				return false
			}
			return true
		}
		time.Sleep(time.Duration(1+rng.IntN(3)) * time.Millisecond)
	}
	time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
	if rng.IntN(4) == 0 {
		var held bool
		var err error
		if rng.IntN(2) == 0 {
			held, err = b.Renew(ctx, req.Key, req.Token, req.TTL)
		} else {
			r := b.RenewBatch(ctx, []driver.RenewRequest{{Key: req.Key, Token: req.Token, TTL: req.TTL}})
			held, err = r[0].Held, r[0].Err
		}
		if err != nil || !held {
			t.Errorf("Renew(%s, %s) = %v, %v; want held", req.Key, req.Mode, held, err)
		}
	}
	c.leave(req.Key, shared)
	res, err := b.Release(ctx, req.Key, req.Token)
	if err != nil || !res.Held {
		t.Errorf("Release(%s, %s) = %+v, %v; want held", req.Key, req.Mode, res, err)
		return false
	}
	return true
}
