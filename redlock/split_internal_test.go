package redlock

import (
	"testing"
	"time"
)

// TestSplitDelayBacksOff checks that the delay after a split of the nodes
// between contenders doubles with each split of the key in a row, up to
// eight times, and starts over after a grant or a refusal by a holder.
func TestSplitDelayBacksOff(t *testing.T) {
	const timeout = 50 * time.Millisecond
	b := &Backend{opts: options{nodeTimeout: timeout}}
	lo, hi := timeout/5, timeout
	for i, mult := range []time.Duration{1, 2, 4, 8, 8, 8} {
		d := b.splitDelay("k")
		if d < lo*mult || d >= hi*mult {
			t.Errorf("split %d in a row: delay %v, want in [%v, %v)", i+1, d, lo*mult, hi*mult)
		}
	}
	if d := b.splitDelay("other"); d < lo || d >= hi {
		t.Errorf("first split of another key: delay %v, want in [%v, %v)", d, lo, hi)
	}
	b.noSplit("k")
	if d := b.splitDelay("k"); d < lo || d >= hi {
		t.Errorf("first split after noSplit: delay %v, want in [%v, %v)", d, lo, hi)
	}
}

// TestSplitDelayForgets checks that the keys splitDelay remembers stay
// bounded.
func TestSplitDelayForgets(t *testing.T) {
	b := &Backend{opts: options{nodeTimeout: 50 * time.Millisecond}}
	for i := range 3 * maxSplitKeys {
		b.splitDelay(string(rune('a'+i%26)) + time.Duration(i).String())
	}
	if n := len(b.splits); n > maxSplitKeys {
		t.Errorf("%d keys remembered, want at most %d", n, maxSplitKeys)
	}
}
