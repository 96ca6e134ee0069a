package redlock

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// TestSplitNamesAnotherHolderThanTheRequester checks the holder a split
// reports: when the refusing nodes name the requester's own owner (a hold
// an earlier attempt of its Client left on a node, not undone yet) as
// often as another, the other is named; the own owner only when no other
// is.
func TestSplitNamesAnotherHolderThanTheRequester(t *testing.T) {
	b := &Backend{nodes: make([]*node, 3), opts: options{nodeTimeout: 50 * time.Millisecond}}
	refusal := func(holder string, shared int) answer[driver.AcquireResult] {
		return answer[driver.AcquireResult]{val: driver.AcquireResult{Holder: holder, Shared: shared}}
	}
	for _, tc := range []struct {
		name string
		mode driver.Mode
		busy []answer[driver.AcquireResult]
		want string
	}{
		// A writer's try: the writer w holds one node, the requester's own
		// reader hold another, the third did not answer in time.
		{"writer's try", driver.Exclusive, []answer[driver.AcquireResult]{refusal("me", 1), refusal("w", 0)}, "w"},
		{"writer's try, other order", driver.Exclusive, []answer[driver.AcquireResult]{refusal("w", 0), refusal("me", 1)}, "w"},
		{"reader's try", driver.Shared, []answer[driver.AcquireResult]{refusal("me", 0), refusal("w", 0)}, "w"},
		{"only its own", driver.Exclusive, []answer[driver.AcquireResult]{refusal("me", 0)}, "me"},
	} {
		a := &attempt{b: b, req: driver.AcquireRequest{Key: "k", Owner: "me", Mode: tc.mode}}
		if got := a.busyResult(tc.busy, 0).Holder; got != tc.want {
			t.Errorf("%s: Holder %q, want %q", tc.name, got, tc.want)
		}
	}
}
