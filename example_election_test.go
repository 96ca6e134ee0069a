package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

// fencedLog is a resource that keeps the highest fence it has seen and
// refuses writes with a lower one: a deposed leader's late write.
type fencedLog struct {
	mu    sync.Mutex
	fence uint64
	lines []string
}

func (f *fencedLog) write(fence uint64, line string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fence < f.fence {
		return false
	}
	f.fence = fence
	f.lines = append(f.lines, line)
	return true
}

// Leader election: each replica campaigns; the leader does its work under
// the leadership's context and fences its writes with the leadership's
// fence, and others read or observe who leads.
func ExampleElection() {
	ctx := context.Background()
	store := memlock.New() // redislock.New(rdb), sqllock.New(db, ...) in production
	replicaA, replicaB := dlock.New(store), dlock.New(store)
	defer replicaA.Close()
	defer replicaB.Close()
	out := &fencedLog{}

	a, err := replicaA.Election("scheduler").Campaign(ctx, "replica-a:8080")
	if err != nil {
		fmt.Println(err)
		return
	}
	// The leader's work: stopped when the leadership ends, fenced writes.
	work := a.Context()
	if work.Err() == nil {
		fmt.Println("a writes:", out.write(a.Fence(), "scheduled by a"))
	}

	// Anyone reads the leader and its value.
	leader, _ := replicaB.Election("scheduler").Leader(ctx)
	fmt.Println("leader:", leader.Value, "fence", leader.Fence)

	// b campaigns and waits; a resigns, b leads.
	won := make(chan *dlock.Leadership)
	go func() {
		b, _ := replicaB.Election("scheduler").Campaign(ctx, "replica-b:8080")
		won <- b
	}()
	_ = a.Resign(ctx)
	b := <-won
	fmt.Println("a's work context ended:", work.Err() != nil)
	fmt.Println("b writes:", out.write(b.Fence(), "scheduled by b"))

	// A late write of the old leader is refused by its fence.
	fmt.Println("late write of a:", out.write(a.Fence(), "stale"))
	_ = b.Resign(ctx)
	// Output:
	// a writes: true
	// leader: replica-a:8080 fence 1
	// a's work context ended: true
	// b writes: true
	// late write of a: false
}

// A replica that has other work to do tries once to lead, and stands by
// when another leads.
func ExampleElection_TryCampaign() {
	ctx := context.Background()
	store := memlock.New()
	replicaA, replicaB := dlock.New(store), dlock.New(store)
	defer replicaA.Close()
	defer replicaB.Close()

	a, err := replicaA.Election("compactor").TryCampaign(ctx, "replica-a")
	fmt.Println("a leads:", err == nil)

	e := replicaB.Election("compactor")
	if _, err := e.TryCampaign(ctx, "replica-b"); errors.Is(err, dlock.ErrNotObtained) {
		leader, _ := e.Leader(ctx)
		fmt.Println("b stands by; leader:", leader.Value)
	}

	_ = a.Resign(ctx)
	b, err := e.TryCampaign(ctx, "replica-b")
	fmt.Println("after a resigned, b leads:", err == nil, b.Value())
	_ = b.Resign(ctx)
	// Output:
	// a leads: true
	// b stands by; leader: replica-a
	// after a resigned, b leads: true replica-b
}

// The leader announces a new value (here, the address it serves on after
// a restart of its listener) without campaigning again: its fence and
// lease stay, and every reader of the election sees the new value.
func ExampleLeadership_Proclaim() {
	ctx := context.Background()
	store := memlock.New()
	replicaA, replicaB := dlock.New(store), dlock.New(store)
	defer replicaA.Close()
	defer replicaB.Close()

	a, err := replicaA.Election("gateway").Campaign(ctx, "10.0.0.1:8080")
	if err != nil {
		fmt.Println(err)
		return
	}
	fence := a.Fence()
	if err := a.Proclaim(ctx, "10.0.0.1:9090"); err != nil {
		fmt.Println(err)
		return
	}
	leader, _ := replicaB.Election("gateway").Leader(ctx)
	fmt.Println("leader:", leader.Value)
	fmt.Println("same fence:", leader.Fence == fence, "value:", a.Value())
	_ = a.Resign(ctx)
	// Output:
	// leader: 10.0.0.1:9090
	// same fence: true value: 10.0.0.1:9090
}
