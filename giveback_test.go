package dlock_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/memlock"
)

// noWithdraw is a wrapper whose inner store cannot withdraw: it returns
// errors.ErrUnsupported itself, not driver.ErrUnsupported.
type noWithdraw struct{ *memlock.Backend }

func (noWithdraw) Withdraw(context.Context, string, string) error { return errors.ErrUnsupported }

// TestWithdrawUnsupportedIsQuiet: a wait of a reentrant fair handle that
// ends on a backend without Withdraw leaves its entry to lapse, as the
// contract allows, without a warning, whether the backend says so with
// errors.ErrUnsupported or driver.ErrUnsupported.
func TestWithdrawUnsupportedIsQuiet(t *testing.T) {
	store := memlock.New()
	ctx := t.Context()
	holder := dlock.New(store)
	defer holder.Close()
	h, err := holder.Mutex("q", dlock.Fair()).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Unlock(ctx) }()
	var buf bytes.Buffer
	c := dlock.New(noWithdraw{store}, dlock.WithLogger(slog.New(slog.NewTextHandler(&buf, nil))))
	_, err = c.Mutex("q", dlock.Fair(), dlock.Reentrant(), dlock.WithWait(50*time.Millisecond)).Lock(ctx)
	if !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("Lock: %v, want ErrNotObtained", err)
	}
	if err := c.Close(); err != nil { // waits for the withdrawal
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "leaving the queue failed") {
		t.Errorf("warned for a backend without Withdraw: %s", buf.String())
	}
}

// A grant whose answer arrives after the lease's safe validity is of no use:
// Lock and TryLock must not return it (found by the chaos latency scenario
// on MariaDB: a lease was handed out already past its deadline), and the
// grant must be given back at once, not left to expire. The delay is past
// the safe validity (TTL 1s − margin 500ms) but inside the TTL, so the hold
// is still on the store when the answer comes.
func TestGrantAnsweredTooLateIsGivenBack(t *testing.T) {
	t.Parallel()
	store := newSlowAcquire(600 * time.Millisecond)
	c := dlock.New(store, dlock.WithTTL(time.Second), dlock.WithSafetyMargin(500*time.Millisecond))
	defer c.Close()
	for i, lock := range []func(context.Context) (*dlock.Lease, error){c.Mutex("x").TryLock, c.RWMutex("y").TryRLock} {
		l, err := lock(t.Context())
		if err == nil {
			t.Fatalf("got a lease with %v left before its deadline; want an error", time.Until(l.Deadline()))
		}
		var no *dlock.NotObtainedError
		if !errors.As(err, &no) || no.Slow < 600*time.Millisecond || !strings.Contains(err.Error(), "given back") {
			t.Fatalf("err = %v; want a *NotObtainedError with Slow >= 600ms saying the grant was given back", err)
		}
		store.mu.Lock()
		token := store.granted[i]
		released := store.released[token]
		store.mu.Unlock()
		if released != 1 {
			t.Fatalf("the late grant was released %d times before TryLock returned, want 1", released)
		}
	}
	// Lock gives the late grant back and goes on waiting: once the store
	// is fast again, it gets the lock.
	go func() {
		time.Sleep(300 * time.Millisecond)
		store.delay.Store(0)
	}()
	l, err := c.Mutex("x").Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if left := time.Until(l.Deadline()); left < 300*time.Millisecond {
		t.Errorf("Lock returned a lease with %v left; want a fresh one", left)
	}
	store.mu.Lock()
	late := len(store.granted) - 3 // the two TryLocks' and the last, good grant
	var givenBack int
	for _, tok := range store.granted[2 : len(store.granted)-1] {
		givenBack += store.released[tok]
	}
	store.mu.Unlock()
	if late < 1 || givenBack != late {
		t.Errorf("Lock saw %d late grants and gave back %d", late, givenBack)
	}
	if err := l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestWaitingWriterKeepsReadersOutAcrossGivenBackGrant: a writer whose
// grant, once the reader it waited for left, is answered too late gives it
// back and waits on with a new token; a reader that came after it stays
// out through the give-back. The late reader's lease comes after the
// writer's.
func TestWaitingWriterKeepsReadersOutAcrossGivenBackGrant(t *testing.T) {
	// With this TTL and margin a grant answered after 2 s is given back,
	// while the store still has it for 1.7 s.
	lateReaderWaitsForWriter(t, true, func(w *troubled) { w.lateGrant.Store(int64(2300 * time.Millisecond)) },
		dlock.WithTTL(4*time.Second), dlock.WithSafetyMargin(2*time.Second))
}

// TestEndedWaitWithdrawsMovedIntent: a wait that ends while the move of
// its writer intent to its new token is under way (the store moved it,
// the answer was lost as the caller's context ended) withdraws the new
// token's intent as it leaves: a reader that comes next is not kept out
// by a writer that is gone.
func TestEndedWaitWithdrawsMovedIntent(t *testing.T) {
	store := memlock.New()
	ctx := t.Context()
	readers := dlock.New(store)
	defer readers.Close()
	r1, err := readers.RWMutex("book").RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer r1.Unlock(ctx)

	lctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	wb := &moving{troubled: newTroubled(store, 0)}
	wb.move = func(mctx context.Context, key, from, to, owner string, ttl time.Duration) (bool, error) {
		wb.troubled.MoveIntent(mctx, key, from, to, owner, ttl)
		cancel() // the caller gives up as the answer is lost
		return false, driver.Transient(errLostAnswer)
	}
	var intents atomic.Int64
	wb.answered = func(_ driver.AcquireRequest, res driver.AcquireResult) {
		if res.Queued && intents.Add(1) == 2 {
			wb.loseNext.Store(true) // this attempt, a wait's, loses its answer
		}
	}
	c := dlock.New(wb)
	defer c.Close()
	if _, err := c.RWMutex("book").Lock(lctx); err == nil {
		t.Fatal("the writer got the lock while a reader held it")
	}
	if wb.moves.Load() == 0 {
		t.Fatal("no move of the intent was tried")
	}
	r2, err := readers.RWMutex("book").TryRLock(ctx)
	if err != nil {
		t.Fatalf("a reader after the writer left: %v; want the lock", err)
	}
	if err := r2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
