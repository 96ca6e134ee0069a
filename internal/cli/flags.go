// What every command shares in reading its arguments: duration flags with
// one kind of help, flag errors written as help writes flags (--ttl), the
// closest command or flag suggested for a misspelt one, and one check of
// lock names.

package cli

import (
	"errors"
	"flag"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/safetext"
)

// durationValue is a flag.Value for a duration that explains what it wants,
// for every duration flag alike ("30" has no unit: write 30s or 30m).
type durationValue struct{ d *time.Duration }

// durationVar defines a duration flag on fs.
func durationVar(fs *flag.FlagSet, d *time.Duration, name string, value time.Duration) {
	*d = value
	fs.Var(durationValue{d}, name, "")
}

func (v durationValue) String() string {
	if v.d == nil {
		return "0s"
	}
	return v.d.String()
}

func (v durationValue) Set(s string) error {
	d, err := parseDuration(s)
	if err != nil {
		return err
	}
	*v.d = d
	return nil
}

// parseDuration reads a duration as the flags take it, with an error that
// says what to write instead.
func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err == nil {
		return d, nil
	}
	if plainNumber.MatchString(s) && strings.Trim(s, "0.") != "" {
		return 0, fmt.Errorf("%s has no unit; write %ss or %sm", s, s, s)
	}
	return 0, errors.New("want a duration such as 500ms, 30s or 5m")
}

// plainNumber matches a number written without a unit ("30", "1.5").
var plainNumber = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`)

// flagRef matches a flag as the flag package writes it in its errors
// ("-ttl"), after the start, a space or a colon.
var flagRef = regexp.MustCompile(`(^|[\s:])--?([A-Za-z][A-Za-z0-9-]*)`)

// invalidValue matches the flag package's error for a value its flag
// refused: the quoted value, the flag's name, the reason.
var invalidValue = regexp.MustCompile(`^invalid (?:boolean )?value ("(?:[^"\\]|\\.)*") for (?:flag )?-+([A-Za-z][A-Za-z0-9-]*): (.*)$`)

// flagError rewrites an error of fs.Parse as help writes flags (--ttl, -E)
// and, for an unknown flag, suggests the closest one fs has.
func flagError(fs *flag.FlagSet, err error) string {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok {
		name = strings.TrimLeft(name, "-")
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		out := "unknown flag " + flagName(safetext.Escape(shorten(name, 40)))
		switch hint, ok := flockHints[name]; {
		case ok:
			out += ": " + hint
		case len(name) > 1 && fs.Lookup(name[:1]) != nil && fs.Lookup(name[1:]) != nil:
			out += "; give -" + name[:1] + " and -" + name[1:] + " apart"
		default:
			if s, ok := closest(name, names); ok {
				out += "; did you mean " + flagName(s) + "?"
			}
		}
		return out
	}
	if m := invalidValue.FindStringSubmatch(msg); m != nil && fs.Lookup(m[2]) != nil {
		why := m[3]
		f := fs.Lookup(m[2])
		switch _, intErr := strconv.Atoi(f.DefValue); {
		case isBoolFlag(f):
			why = "want true or false, or no value"
		case why == "parse error" && intErr == nil:
			why = "want a whole number"
		}
		return flagName(m[2]) + " " + shorten(m[1], 40) + ": " + why
	}
	return flagRef.ReplaceAllStringFunc(msg, func(m string) string {
		sub := flagRef.FindStringSubmatch(m)
		if fs.Lookup(sub[2]) == nil {
			return m
		}
		return sub[1] + flagName(sub[2])
	})
}

// closest returns the name among names that s most likely misspells: the
// only one that starts with s, else the nearest within a third of its
// length in edits (at least one); none for a one- or two-letter s that is
// no prefix, which any short name is near.
func closest(s string, names []string) (string, bool) {
	var prefixed []string
	for _, n := range names {
		if len(s) >= 2 && strings.HasPrefix(n, s) {
			prefixed = append(prefixed, n)
		}
	}
	if len(prefixed) == 1 {
		return prefixed[0], true
	}
	if utf8.RuneCountInString(s) <= 2 {
		return "", false
	}
	best, bestD := "", max(1, utf8.RuneCountInString(s)/3)+1
	for _, n := range names {
		if d := editDistance(s, n); d < bestD {
			best, bestD = n, d
		}
	}
	return best, best != ""
}

// flockHints answer the flags of flock that dlock spells otherwise.
var flockHints = map[string]string{
	"n": "dlock tries once by default (--wait 0)",
	"w": "dlock's is --wait DURATION (or --timeout)",
	"x": "a plain dlock run is exclusive",
	"s": "dlock's is --shared",
}

// editDistance is the Levenshtein distance between a and b, in runes.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}

// shorten cuts s to at most n runes, with "..." when it was longer.
func shorten(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n]) + "..."
}

// checkNameArg checks a lock NAME given to cmd as the library would, so
// that every command refuses the same names (with exit 64), before it
// connects to the store.
func checkNameArg(cmd, name string) error {
	if err := dlock.CheckName(name); err != nil {
		msg := strings.TrimPrefix(err.Error(), "dlock: invalid argument: ")
		if len(name) > dlock.MaxNameLength {
			msg = fmt.Sprintf("name: %d bytes, over the limit of %d", len(name), dlock.MaxNameLength)
		}
		return usageErr(cmd, "lock %s", msg)
	}
	return nil
}
