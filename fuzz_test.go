package dlock_test

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

// FuzzNames checks that any name and metadata either work or are refused with
// ErrInvalid, never panic, and that the rules are the documented ones.
func FuzzNames(f *testing.F) {
	for _, s := range []string{"orders:42", "", "a\nb", "\xff", strings.Repeat("x", 300), "{tag}", "ü", "a b"} {
		f.Add(s, "meta")
	}
	for _, m := range []string{"\x1b]0;x\a", "a\u009bb", "x\u202ey", "nul\x00", "\u2066"} {
		f.Add("ok", m)
	}
	c := dlock.New(memlock.New(), dlock.WithTTL(time.Second))
	f.Cleanup(func() { _ = c.Close() })
	f.Fuzz(func(t *testing.T, name, metadata string) {
		l, err := c.Mutex(name, dlock.WithMetadata(metadata)).TryLock(t.Context())
		// Control characters (C0, DEL, C1) and bidi formatting characters
		// reach other users' terminals: refused in names and metadata.
		unsafe := func(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) }
		valid := name != "" && name[0] != '}' && len(name) <= dlock.MaxNameLength && utf8.ValidString(name) &&
			!strings.ContainsFunc(name, unsafe) &&
			len(metadata) <= dlock.MaxMetadataLength && utf8.ValidString(metadata) && !strings.ContainsFunc(metadata, unsafe)
		if !valid {
			if !errors.Is(err, dlock.ErrInvalid) {
				t.Fatalf("TryLock(%q, metadata %q) = %v, want ErrInvalid", name, metadata, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("TryLock(%q, metadata %q) = %v", name, metadata, err)
		}
		if l.Name() != name || !strings.HasSuffix(l.Owner(), metadata) {
			t.Fatalf("lease name %q owner %q, want %q and metadata %q", l.Name(), l.Owner(), name, metadata)
		}
		if err := l.Unlock(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
}

// The holder's owner string in a NotObtainedError was written by another
// program; its Error() must not hand a terminal escape sequences, C1 or
// bidi characters.
func TestNotObtainedErrorEscapesHolder(t *testing.T) {
	e := &dlock.NotObtainedError{Name: "x", Holder: "h\x1b]52;c;cm0=\a\u009b\u202e|pid 1", HolderTTL: time.Second}
	msg := e.Error()
	for _, r := range msg {
		if unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) {
			t.Fatalf("Error() = %q holds %U", msg, r)
		}
	}
	if !strings.Contains(msg, `\x1b]52`) {
		t.Errorf("Error() = %q does not show the holder escaped", msg)
	}
}
