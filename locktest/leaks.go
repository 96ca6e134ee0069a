package locktest

import (
	"runtime"
	"strings"
	"testing"
	"time"
)

// ownGoroutines returns the stacks of running goroutines that run or were
// started by dlock's own packages (the client and its backends), keyed by
// their header line ("goroutine 42 [select]:" without the state). Goroutines
// of drivers and pools (database/sql, go-redis) come and go with connections
// and are not the client's to stop, so they are left out; so are the test's
// own goroutines and the test servers'.
func ownGoroutines() map[string]string {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	own := make(map[string]string)
	for _, g := range strings.Split(string(buf), "\n\n") {
		if !strings.Contains(g, "github.com/dlock-go/dlock") ||
			strings.Contains(g, "_test.go") ||
			strings.Contains(g, "/internal/test/testserver") ||
			strings.Contains(g, "github.com/dlock-go/dlock/locktest.") {
			continue
		}
		id, _, _ := strings.Cut(g, " [")
		own[id] = g
	}
	return own
}

// checkNoNewGoroutines fails t if goroutines of dlock that were not running
// in before are still running after a grace period.
func checkNoNewGoroutines(t *testing.T, before map[string]string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		var leaked []string
		for id, stack := range ownGoroutines() {
			if _, ok := before[id]; !ok {
				leaked = append(leaked, stack)
			}
		}
		if len(leaked) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%d goroutine(s) of dlock still running after Close:\n\n%s", len(leaked), strings.Join(leaked, "\n\n"))
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
