package cli

import (
	"slices"
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/spf13/pflag"
)

func TestFmtDuration(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0ms"},
		{850 * time.Millisecond, "850ms"},
		{4260 * time.Millisecond, "4.2s"},
		{59990 * time.Millisecond, "59.9s"},
		{3*time.Minute + 5*time.Second, "3m05s"},
		{2*time.Hour + 3*time.Minute, "2h03m"},
		{75 * time.Hour, "3d03h"},
	}
	for _, tt := range tests {
		if got := fmtDuration(tt.d); got != tt.want {
			t.Errorf("fmtDuration(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
}

func TestHeldFor(t *testing.T) {
	now := time.Date(2026, 11, 21, 10, 0, 13, 0, time.UTC)
	tests := []struct {
		info driver.LockInfo
		want time.Duration
		ok   bool
	}{
		{driver.LockInfo{HeldFor: 3 * time.Second, Owner: "h|pid 1|2026-11-21T10:00:03Z"}, 3 * time.Second, true},
		{driver.LockInfo{Owner: "h|pid 1|2026-11-21T10:00:03Z"}, 10 * time.Second, true},
		{driver.LockInfo{Owner: "h|pid 1|2026-11-21T10:00:03Z|meta|with|bars"}, 10 * time.Second, true},
		{driver.LockInfo{Owner: "h|pid 1|2026-11-21T10:00:20Z"}, 0, true}, // the holder's clock is ahead
		{driver.LockInfo{Owner: "someone else"}, 0, false},
		{driver.LockInfo{Owner: "a|b|2026-11-21T10:00:03Z"}, 0, false},
	}
	for _, tt := range tests {
		got, ok := heldFor(tt.info, now)
		if got != tt.want || ok != tt.ok {
			t.Errorf("heldFor(%+v) = %v, %v; want %v, %v", tt.info, got, ok, tt.want, tt.ok)
		}
	}
}

func TestSplitArgs(t *testing.T) {
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	fs.Bool("json", false, "")
	fs.String("backend", "", "")
	fs.BoolP("quiet", "q", false, "")
	fs.IntP("conflict-exit-code", "E", 75, "")
	tests := []struct {
		args                    []string
		flags, positional, tail []string
		dash                    bool
	}{
		{[]string{"p", "--json"}, []string{"--json"}, []string{"p"}, nil, false},
		{[]string{"--backend", "redis://h", "p"}, []string{"--backend", "redis://h"}, []string{"p"}, nil, false},
		{[]string{"--backend=x", "p", "-json"}, []string{"--backend=x", "-json"}, []string{"p"}, nil, false},
		{[]string{"n", "--", "sh", "-c", "x"}, nil, []string{"n"}, []string{"sh", "-c", "x"}, true},
		{[]string{"--metadata", "--", "n"}, []string{"--metadata"}, nil, []string{"n"}, true},
		{[]string{"-", "n"}, nil, []string{"-", "n"}, nil, false},
		{[]string{"-qE", "0", "n"}, []string{"-qE", "0"}, []string{"n"}, nil, false},
		{[]string{"-E0", "n", "cmd"}, []string{"-E0"}, []string{"n", "cmd"}, nil, false},
	}
	for _, tt := range tests {
		s := splitArgs(fs, tt.args)
		if !slices.Equal(s.flags, tt.flags) || !slices.Equal(s.positional, tt.positional) || !slices.Equal(s.tail, tt.tail) || s.dash != tt.dash {
			t.Errorf("splitArgs(%q) = %q %q %q %v", tt.args, s.flags, s.positional, s.tail, s.dash)
		}
	}
	if s := splitArgs(fs, []string{"-qE", "1", "--quiet"}); !s.spelled["-q"] || !s.spelled["-E"] || !s.spelled["--quiet"] || s.spelled["--conflict-exit-code"] {
		t.Errorf("spelled %v", s.spelled)
	}
}

func TestWaitFlag(t *testing.T) {
	for in, want := range map[string]time.Duration{"0": 0, "1m": time.Minute, "forever": waitForever, "INF": waitForever} {
		var w waitFlag
		if err := w.Set(in); err != nil || w.d != want {
			t.Errorf("Set(%q) = %v, %v; want %v", in, w.d, err, want)
		}
	}
	for _, in := range []string{"5", "-1s", "soon"} {
		var w waitFlag
		if err := w.Set(in); err == nil {
			t.Errorf("Set(%q) accepted %v", in, w.d)
		}
	}
}
