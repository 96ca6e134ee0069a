package etcdlock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/testserver"
)

// Fences are the create revisions of the holders' keys, and etcd's
// revision never goes back: not when the leader is killed and another is
// elected, not when every member is killed and restarted. Every grant after
// such an event has a larger fence than every grant before it, on any
// lock.
func TestFencesAcrossFailover(t *testing.T) {
	srv := testserver.StartEtcdCluster(t, 3)
	var highest uint64
	names := []string{"a", "b", "c"}
	round := func(event string) {
		t.Helper()
		// A fresh client per round: its connections know nothing of the
		// old leader.
		c := dlock.New(etcdlock.New(srv.Client(t)))
		defer c.Close()
		var fences []uint64
		for _, name := range names {
			ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
			l, err := c.Mutex(name, dlock.WithTTL(2*time.Second)).Lock(ctx)
			cancel()
			if err != nil {
				t.Fatalf("%s: Lock(%q): %v", event, name, err)
			}
			fences = append(fences, l.Fence())
			if l.Fence() <= highest {
				t.Errorf("%s: fence %d of %q, want more than %d, the highest before", event, l.Fence(), name, highest)
			}
			highest = max(highest, l.Fence())
			if err := l.Unlock(t.Context()); err != nil {
				t.Fatalf("%s: Unlock: %v", event, err)
			}
		}
		t.Logf("%s: fences %v", event, fences)
	}
	round("start")
	leader := srv.Leader(t)
	srv.Kill(t, leader)
	srv.Leader(t) // elected: writes sent before would wait for the dead one
	round(fmt.Sprintf("leader m%d killed", leader))
	srv.Start(t, leader)
	round("old leader back")
	srv.KillAll(t)
	srv.StartAll(t)
	round("whole cluster killed and restarted")
}
