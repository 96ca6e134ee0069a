// Package safetext decides which stored strings (lock names, owner
// strings, metadata) may reach a terminal as they are, and escapes the
// others. A lock's owner string is written by whoever took the lock and
// read by everyone who waits for it, lists it or breaks it; raw control
// characters in it could rewrite another user's screen (ANSI escapes, OSC 52
// to the clipboard, carriage returns that overwrite a line) and bidi
// overrides could make it read as something else.
package safetext

import (
	"strconv"
	"unicode"
	"unicode/utf8"
)

// Unsafe reports whether r may not be stored in a name or metadata, nor
// printed raw: a control character (C0, DEL, C1) or a bidirectional
// formatting character (U+061C, U+200E, U+200F, U+202A–U+202E,
// U+2066–U+2069).
func Unsafe(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r)
}

// Check returns the first unsafe rune of s and its byte offset, with ok
// false, or ok true when s is valid UTF-8 without unsafe runes. An invalid
// byte is reported as utf8.RuneError.
func Check(s string) (r rune, at int, ok bool) {
	for i, c := range s {
		if c == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(s[i:]); size == 1 {
				return c, i, false
			}
		}
		if Unsafe(c) {
			return c, i, false
		}
	}
	return 0, 0, true
}

// Escape returns s when it can be printed as it is, and otherwise s quoted
// as a Go string literal, in which every unprintable rune, bidi control and
// invalid byte is an escape sequence (\x1b, \u202e, \x80).
func Escape(s string) string {
	if _, _, ok := Check(s); ok {
		return s
	}
	return strconv.QuoteToGraphic(s)
}
