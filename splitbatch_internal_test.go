package dlock

import (
	"math/rand/v2"
	"testing"
	"time"
)

// splitBatch is a partition of the batch (every grant once), and each
// part's time left is at most twice its first's (or 20 ms).
func TestSplitBatchPartitions(t *testing.T) {
	now := time.Now()
	for range 200 {
		n := 2 + rand.IntN(100)
		batch := make([]*grant, n)
		for i := range batch {
			left := time.Duration(rand.Int64N(int64(30*time.Second))) - 50*time.Millisecond
			batch[i] = &grant{index: -1, deadline: now.Add(left)}
		}
		seen := map[*grant]int{}
		for _, part := range splitBatch(batch, now) {
			if len(part) == 0 {
				t.Fatal("empty part")
			}
			first := part[0].safeDeadline().Sub(now)
			for _, g := range part {
				seen[g]++
				if left := g.safeDeadline().Sub(now); left > 2*max(first, 10*time.Millisecond) {
					t.Fatalf("part with first %v holds %v", first, left)
				}
			}
		}
		if len(seen) != n {
			t.Fatalf("%d grants in the parts, want %d", len(seen), n)
		}
		for g, c := range seen {
			if c != 1 {
				t.Fatalf("grant %p in %d parts", g, c)
			}
		}
	}
}

// BenchmarkSplitBatch: a batch of 100 grants of one TTL (one part).
func BenchmarkSplitBatch(b *testing.B) {
	now := time.Now()
	batch := make([]*grant, 100)
	for i := range batch {
		batch[i] = &grant{index: -1, deadline: now.Add(2*time.Second + time.Duration(i)*time.Millisecond)}
	}
	b.ReportAllocs()
	for range b.N {
		splitBatch(batch, now)
	}
}
