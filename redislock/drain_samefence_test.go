package redislock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// heldAnswers is a real Backend whose acquires, once armed, run on the
// store, tell reached, and hold their answer until the test lets it go.
type heldAnswers struct {
	*redislock.Backend
	mu       sync.Mutex
	loseNext bool
	armed    bool
	reached  chan struct{}
	answers  chan chan struct{}
}

func (b *heldAnswers) Acquire(ctx context.Context, req driver.AcquireRequest) (driver.AcquireResult, error) {
	res, err := b.Backend.Acquire(ctx, req)
	b.mu.Lock()
	lose, armed := b.loseNext, b.armed
	b.loseNext = false
	b.mu.Unlock()
	if lose {
		return driver.AcquireResult{}, errors.New("injected: the answer was lost")
	}
	if armed {
		go_ := make(chan struct{})
		b.answers <- go_
		b.reached <- struct{}{}
		<-go_
	}
	return res, err
}

// TestDrainTakesConcurrentGrantOfSameFence: the gate does not make
// the drain's count this grant's. A reentrant handle whose acquire had an
// unknown outcome while it held nothing is marked uncertain; two Locks of
// the handle sent at the same time both find no live grant to join, and
// the store adds both to the hold the unknown acquire made (same fence).
// The client makes two grants of that fence; the first inherits the mark,
// and its last Unlock drains every hold the store reports left, the other
// grant's included: that grant's caller holds a lease for a free lock. No
// Unlock races with an acquire here, so the gate cannot help.
func TestDrainTakesConcurrentGrantOfSameFence(t *testing.T) {
	srv := testserver.StartRedis(t)
	b := &heldAnswers{Backend: redislock.New(srv.Client(t)), reached: make(chan struct{}, 2), answers: make(chan chan struct{}, 2)}
	c := dlock.New(b, dlock.WithTTL(5*time.Second))
	defer c.Close()
	other := dlock.New(redislock.New(srv.Client(t)), dlock.WithTTL(5*time.Second))
	defer other.Close()
	ctx := t.Context()
	const name = "review/two-grants"
	m := c.Mutex(name, dlock.Reentrant())

	b.loseNext = true
	if _, err := m.Lock(ctx); err == nil {
		t.Fatal("the Lock whose answer was lost succeeded")
	}
	// The store holds the token once; the handle is marked uncertain.

	b.mu.Lock()
	b.armed = true
	b.mu.Unlock()
	type result struct {
		l   *dlock.Lease
		err error
	}
	ra, rb := make(chan result, 1), make(chan result, 1)
	go func() { l, err := m.Lock(ctx); ra <- result{l, err} }()
	<-b.reached
	goA := <-b.answers
	go func() { l, err := m.Lock(ctx); rb <- result{l, err} }()
	<-b.reached
	goB := <-b.answers
	b.mu.Lock()
	b.armed = false
	b.mu.Unlock()
	close(goA)
	a := <-ra // the first grant: it inherits the handle's mark
	close(goB)
	bb := <-rb
	if a.err != nil || bb.err != nil {
		t.Fatalf("Locks: %v, %v", a.err, bb.err)
	}
	if a.l.Fence() != bb.l.Fence() {
		t.Fatalf("fences %d and %d, want one store grant", a.l.Fence(), bb.l.Fence())
	}
	if err := a.l.Unlock(ctx); err != nil {
		t.Fatalf("the first lease's Unlock: %v", err)
	}
	defer bb.l.Unlock(context.Background())
	if err := bb.l.Err(); err != nil {
		t.Fatalf("the second lease ended: %v", err)
	}
	if l, err := other.Mutex(name).TryLock(ctx); err == nil {
		defer l.Unlock(context.Background())
		t.Fatalf("another owner obtained the lock (fence %d) while the handle's second lease (fence %d) holds it with no error", l.Fence(), bb.l.Fence())
	}
}
