package redislock

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestMillisRoundsUp(t *testing.T) {
	for _, c := range []struct {
		ttl  time.Duration
		want int64
	}{
		{time.Nanosecond, 1}, // never 0, which would delete the key
		{time.Millisecond, 1},
		{1500 * time.Microsecond, 2},
		{10 * time.Second, 10000},
		{10*time.Second + 1, 10001},
	} {
		if got := millis(c.ttl); got != c.want {
			t.Errorf("millis(%v) = %d, want %d", c.ttl, got, c.want)
		}
	}
}

func TestKeyLayout(t *testing.T) {
	b := New(nil, WithNamespace("app"))
	if got := b.lockKey("orders:42"); got != "app:{orders:42}" {
		t.Errorf("lockKey = %q", got)
	}
	if got := b.fenceKey("orders:42"); got != "app:{orders:42}:fence" {
		t.Errorf("fenceKey = %q", got)
	}
	if got := b.channel("orders:42"); got != "app:{orders:42}:rel" {
		t.Errorf("channel = %q", got)
	}
	for name, want := range map[string]string{
		"app:{orders:42}":     "orders:42",
		"app:{a}b}":           "a}b",
		"app:{orders:42}:rel": "",
		"app:{x}:fence":       "",
		"app:{x}:fence}":      "x}:fence", // the lock of a key that happens to end in ":fence}"
		"other:{x}":           "",
		"app:{orders:42}:s":   "orders:42", // shared holds only
		"app:{a}:s}:s":        "a}:s",
		"app:{a}:s}":          "a}:s",
		"app:{x}:si":          "",
		"app:{x}:w":           "",
		"app:{x}:q":           "",
		"app:{x}:qe":          "",
		"app:{x}:qo":          "",
		"other:{x}:s":         "",
	} {
		got, ok := b.keyOfLock(name)
		if got != want || ok != (want != "") {
			t.Errorf("keyOfLock(%q) = %q, %v; want %q", name, got, ok, want)
		}
	}
	wantKeys := []string{"app:{k}", "app:{k}:fence", "app:{k}:s", "app:{k}:si", "app:{k}:w", "app:{k}:q", "app:{k}:qe", "app:{k}:qo", "app:{k}:late"}
	if got := b.acquireKeys("k"); !slices.Equal(got, wantKeys) {
		t.Errorf("acquireKeys = %q, want %q", got, wantKeys)
	}
	if got, want := b.stateKeys("k"), slices.Delete(slices.Clone(wantKeys[:7]), 1, 2); !slices.Equal(got, want) {
		t.Errorf("stateKeys = %q, want %q", got, want)
	}
	if got, want := b.renewKeys("k"), []string{"app:{k}", "app:{k}:s", "app:{k}:si"}; !slices.Equal(got, want) {
		t.Errorf("renewKeys = %q, want %q", got, want)
	}
	if want := fmt.Sprintf("local lateTTL, lateMax = %d,", lateTTL.Milliseconds()); !strings.Contains(lateLua, want) {
		t.Errorf("late.lua does not say %q: keys.go's lateTTL and the script's differ", want)
	}
	if New(nil, WithNamespace("")).ns != DefaultNamespace {
		t.Error("WithNamespace(\"\") did not keep the default")
	}
}

func TestGlobEscape(t *testing.T) {
	if got, want := globEscape(`a*b?c[d]e\f`), `a\*b\?c\[d\]e\\f`; got != want {
		t.Errorf("globEscape = %q, want %q", got, want)
	}
}

func TestNextOf(t *testing.T) {
	for payload, want := range map[string]string{
		"next:":       "",
		"next:abc":    "abc",
		"next:next:x": "next:x",
		"dlock:{k}":   "", // an earlier version's announcement: anyone
		"":            "",
		"Next:abc":    "",
	} {
		if got := nextOf(payload); got != want {
			t.Errorf("nextOf(%q) = %q, want %q", payload, got, want)
		}
	}
}
