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
	c := dlock.New(memlock.New(), dlock.WithTTL(time.Second))
	f.Cleanup(func() { _ = c.Close() })
	f.Fuzz(func(t *testing.T, name, metadata string) {
		l, err := c.Mutex(name, dlock.WithMetadata(metadata)).TryLock(t.Context())
		valid := name != "" && name[0] != '}' && len(name) <= dlock.MaxNameLength && utf8.ValidString(name) &&
			!strings.ContainsFunc(name, unicode.IsControl) &&
			len(metadata) <= dlock.MaxMetadataLength && utf8.ValidString(metadata)
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
