package etcdlock

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkRevokeIdleScan times one scan of revokeIdle (t.mu held
// throughout) over 10,000 live holds on one lease.
func BenchmarkRevokeIdleScan(b *testing.B) {
	t := newLeaseTable(nil, nil)
	l := &lease{id: 1, bucket: 1, ttl: 2 * time.Second, expires: time.Now().Add(time.Hour), holds: make(map[*hold]struct{})}
	t.byID[l.id], t.current[1] = l, l
	for i := range 10000 {
		t.track(l, fmt.Sprint("k", i), "tok", 1, 1, 1, time.Second, time.Now().Add(time.Hour))
	}
	b.ResetTimer()
	for range b.N {
		t.scanned = time.Time{}
		t.revokeIdle()
	}
}
