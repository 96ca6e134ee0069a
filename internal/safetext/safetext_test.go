package safetext

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestEscape(t *testing.T) {
	tests := []struct{ in, want string }{
		{"host-a|pid 42|2026-11-21T10:00:03Z|cron@host-7", "host-a|pid 42|2026-11-21T10:00:03Z|cron@host-7"},
		{"café 東京", "café 東京"},
		{"a\x1b]0;pwned\x07b", `"a\x1b]0;pwned\ab"`},
		{"a\u009bb", `"a\u009bb"`},
		{"evil\u202Etxt.exe", `"evil\u202etxt.exe"`},
		{"a\rb", `"a\rb"`},
		{"bad\xffbyte", `"bad\xffbyte"`},
		{"nul\x00", `"nul\x00"`},
	}
	for _, tt := range tests {
		if got := Escape(tt.in); got != tt.want {
			t.Errorf("Escape(%q) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

// FuzzEscape: whatever a store hands back, what is printed holds no
// control, C1 or bidi character, and text that needed no escaping is left
// as it was.
func FuzzEscape(f *testing.F) {
	for _, s := range []string{"", "owner", "\x1b[2J", "\u009b31m", "\u202e", "\xff", "a\tb", "\u2066x\u2069"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := Escape(s)
		if !utf8.ValidString(out) {
			t.Fatalf("Escape(%q) = %q is not valid UTF-8", s, out)
		}
		for _, r := range out {
			if Unsafe(r) {
				t.Fatalf("Escape(%q) = %q contains %U", s, out, r)
			}
		}
		if _, _, ok := Check(s); ok && out != s {
			t.Fatalf("Escape(%q) = %q changed safe text", s, out)
		}
		if !ok(s) && !strings.HasPrefix(out, `"`) {
			t.Fatalf("Escape(%q) = %q is not quoted", s, out)
		}
	})
}

func ok(s string) bool { _, _, k := Check(s); return k }
