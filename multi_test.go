package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/memlock"
	"github.com/dlock-go/dlock/redislock"
	"github.com/redis/go-redis/v9"
)

func TestMultiInvalid(t *testing.T) {
	c := dlock.New(memlock.New())
	defer c.Close()
	for what, m := range map[string]*dlock.Multi{
		"no names":      c.Multi(nil),
		"a name twice":  c.Multi([]string{"a", "b", "a"}),
		"an empty name": c.Multi([]string{"a", ""}),
		"Reentrant":     c.Multi([]string{"a", "b"}, dlock.Reentrant()),
	} {
		if _, err := m.Lock(t.Context()); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("%s: Lock = %v, want ErrInvalid", what, err)
		}
		if _, err := m.TryLock(t.Context()); !errors.Is(err, dlock.ErrInvalid) {
			t.Errorf("%s: TryLock = %v, want ErrInvalid", what, err)
		}
	}
}

// TestMultiUnlockOne checks that unlocking one lease of a MultiLease on its
// own ends the MultiLease (as released) and releases the other names.
func TestMultiUnlockOne(t *testing.T) {
	c := dlock.New(memlock.New())
	defer c.Close()
	ml, err := c.Multi([]string{"a", "b"}).TryLock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := dlock.MultiLeaseFromContext(ml.Context()); !ok || got != ml {
		t.Error("MultiLeaseFromContext(ml.Context()) does not give ml")
	}
	if err := ml.Lease("a").Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ml.Done():
	case <-time.After(time.Second):
		t.Fatal("the MultiLease did not end when one of its leases was unlocked")
	}
	if err := ml.Err(); !errors.Is(err, dlock.ErrReleased) {
		t.Errorf("Err = %v, want ErrReleased", err)
	}
	deadline := time.Now().Add(time.Second)
	for {
		l, err := c.Mutex("b").TryLock(t.Context())
		if err == nil {
			_ = l.Unlock(t.Context())
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b still held: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := ml.Unlock(t.Context()); !errors.Is(err, dlock.ErrReleased) {
		t.Errorf("Unlock after the end = %v, want ErrReleased", err)
	}
}

// TestMultiClose checks that Client.Close ends a MultiLease it holds and
// leaves no goroutine behind (goleak in TestMain).
func TestMultiClose(t *testing.T) {
	c := dlock.New(memlock.New())
	ml, err := c.Multi([]string{"a", "b", "c"}).Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ml.Done():
	case <-time.After(time.Second):
		t.Fatal("the MultiLease did not end at Close")
	}
	if !errors.Is(ml.Err(), dlock.ErrLost) {
		t.Errorf("Err after Close = %v, want ErrLost", ml.Err())
	}
}

// TestMultiNil checks that the methods of a nil MultiLease and a nil
// Leadership report ErrInvalid or act as ended, without panicking.
func TestMultiNil(t *testing.T) {
	var ml *dlock.MultiLease
	if err := ml.Unlock(t.Context()); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("nil MultiLease Unlock = %v, want ErrInvalid", err)
	}
	if err := ml.Err(); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("nil MultiLease Err = %v, want ErrInvalid", err)
	}
	<-ml.Done()
	<-ml.Context().Done()
	if f, ok := ml.Fence("a"); f != 0 || ok || ml.Names() != nil {
		t.Error("nil MultiLease holds something")
	}
	var ld *dlock.Leadership
	if err := ld.Resign(t.Context()); !errors.Is(err, dlock.ErrInvalid) {
		t.Errorf("nil Leadership Resign = %v, want ErrInvalid", err)
	}
	<-ld.Done()
	<-ld.Context().Done()
	if ld.Fence() != 0 || ld.Value() != "" {
		t.Error("nil Leadership holds something")
	}
}

// TestMultiLockReturnsByDeadlineWhenStoreUnreachable checks that a
// Multi.Lock whose wait ends while the store cannot be reached returns by
// its deadline, whether the partition comes during a call (the first
// name's acquire) or while it waits for the second name: the names it took
// are given back in the background, not while the caller waits for a TTL.
func TestMultiLockReturnsByDeadlineWhenStoreUnreachable(t *testing.T) {
	t.Parallel()
	for _, after := range []time.Duration{0, 300 * time.Millisecond} {
		t.Run(fmt.Sprintf("partition after %v", after), func(t *testing.T) {
			srv := testserver.StartRedis(t)
			px := testserver.StartProxy(t, srv.Addr())
			holder := dlock.New(redislock.New(srv.Client(t)))
			defer holder.Close()
			// ContextTimeoutEnabled, as redislock.New asks: without it
			// go-redis bounds a call in flight by its own timeouts (3s,
			// and 5s for its reading of push notifications), not by the
			// caller's deadline.
			c := dlock.New(redislock.New(redis.NewClient(&redis.Options{Addr: px.Addr(), ContextTimeoutEnabled: true})), dlock.WithTTL(10*time.Second))
			defer func() {
				px.Heal(t)
				if err := c.Close(); err != nil {
					t.Log(err)
				}
			}()
			h, err := holder.Mutex("b").Lock(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			defer h.Unlock(context.Background())
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			got := make(chan error, 1)
			start := time.Now()
			go func() {
				_, err := c.Multi([]string{"a", "b"}).Lock(ctx)
				got <- err
			}()
			time.Sleep(after) // 300ms: "a" taken, waiting for "b"
			px.Partition(t)
			select {
			case err := <-got:
				if !errors.Is(err, dlock.ErrNotObtained) {
					t.Errorf("Lock = %v, want ErrNotObtained", err)
				}
				if took := time.Since(start); took > 3*time.Second {
					t.Errorf("Lock returned %v after it began, with a 1s deadline", took.Round(time.Millisecond))
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Lock still runs 30s after it began, with a 1s deadline")
			}
		})
	}
}

// hangingRelease is a memlock store whose releases, once hang is set, get
// no answer until their context ends.
type hangingRelease struct {
	*memlock.Backend
	hang atomic.Bool
}

func (s *hangingRelease) Release(ctx context.Context, key, token string) (driver.ReleaseResult, error) {
	if s.hang.Load() {
		<-ctx.Done()
		return driver.ReleaseResult{}, ctx.Err()
	}
	return s.Backend.Release(ctx, key, token)
}

func (s *hangingRelease) ReleaseGrant(ctx context.Context, key, token string, fence uint64) (driver.ReleaseResult, error) {
	if s.hang.Load() {
		<-ctx.Done()
		return driver.ReleaseResult{}, ctx.Err()
	}
	return s.Backend.ReleaseGrant(ctx, key, token, fence)
}

// TestMultiTryLockReturnsWhileGiveBackHangs checks that a Multi.TryLock
// that finds a name held does not wait for the release of the names it
// took when the store does not answer it: the release goes on in the
// background, and Close waits for it.
func TestMultiTryLockReturnsWhileGiveBackHangs(t *testing.T) {
	t.Parallel()
	store := &hangingRelease{Backend: memlock.New()}
	holder := dlock.New(store.Backend)
	defer holder.Close()
	if _, err := holder.Mutex("b").Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	c := dlock.New(store, dlock.WithTTL(3*time.Second))
	store.hang.Store(true)
	start := time.Now()
	_, err := c.Multi([]string{"a", "b"}).TryLock(t.Context())
	if !errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("TryLock = %v, want ErrNotObtained", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("TryLock returned after %v: it waited for the give-back (TTL 3s)", took.Round(time.Millisecond))
	}
	store.hang.Store(false)
	if err := c.Close(); err != nil {
		t.Log(err)
	}
}

// TestMultiErrAfterOneUnlock: once one lease of a MultiLease has been
// unlocked on its own (Unlock returned), the MultiLease has ended: its Err
// is ErrReleased and its Done is closed (MultiLease.Err's documentation).
func TestMultiErrAfterOneUnlock(t *testing.T) {
	c := dlock.New(memlock.New())
	defer c.Close()
	bad := 0
	for i := range 200 {
		ml, err := c.Multi([]string{"a", "b"}).TryLock(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if err := ml.Lease("a").Unlock(t.Context()); err != nil {
			t.Fatal(err)
		}
		if ml.Err() == nil {
			bad++
			if bad == 1 {
				t.Errorf("round %d: MultiLease.Err() = nil after its lease of a was unlocked", i)
			}
		}
		<-ml.Done()
		_ = ml.Unlock(t.Context())
	}
	if bad > 0 {
		t.Errorf("%d of 200 rounds reported the MultiLease held after one of its names was released", bad)
	}
}

// TestMultiErrAfterLoss: once a lease of a MultiLease has been lost
// (its Done is closed, its Err is a *LostError), the MultiLease must not go
// on reporting every name held: its Err is documented as "nil while every
// name is held".
func TestMultiErrAfterLoss(t *testing.T) {
	t.Parallel()
	store := memlock.New()
	c := dlock.New(store, dlock.WithTTL(60*time.Millisecond))
	defer c.Close()
	bad := 0
	const rounds = 20
	for i := range rounds {
		ml, err := c.Multi([]string{"a", "b"}).TryLock(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := store.ForceRelease(t.Context(), "a"); err != nil {
			t.Fatal(err)
		}
		a := ml.Lease("a")
		select {
		case <-a.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("the lease of a was not lost")
		}
		if !errors.Is(a.Err(), dlock.ErrLost) {
			t.Fatalf("a.Err() = %v, want ErrLost", a.Err())
		}
		if ml.Err() == nil || ml.Context().Err() == nil {
			bad++
			if bad == 1 {
				t.Errorf("round %d: a is lost (%v) but MultiLease.Err() = %v, Context().Err() = %v", i, a.Err(), ml.Err(), ml.Context().Err())
			}
		}
		<-ml.Done()
		_ = ml.Unlock(t.Context())
	}
	if bad > 0 {
		t.Errorf("%d of %d rounds reported the MultiLease held after one of its names was lost", bad, rounds)
	}
}
