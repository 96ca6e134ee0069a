// What every command shares in reading its arguments: duration flags with
// one kind of help, flag errors written as help writes flags (--ttl), the
// closest command or flag suggested for a misspelt one, and one check of
// lock names.

package cli

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/safetext"
	"github.com/spf13/pflag"
)

// durationValue is a flag.Value for a duration that explains what it wants,
// for every duration flag alike ("30" has no unit: write 30s or 30m).
type durationValue struct{ d *time.Duration }

// durationVar defines a duration flag on fs.
func durationVar(fs *pflag.FlagSet, d *time.Duration, name string, value time.Duration, usage string) {
	*d = value
	fs.Var(durationValue{d}, name, usage)
}

// Type names the flag's value in generated docs and completion.
func (durationValue) Type() string { return "duration" }

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

// flagError turns an error of parsing cmd's flags (cmd is "" for dlock's
// own) into a usage error that writes flags as help does (--ttl, -E): an
// unknown flag with flock's meaning of it or the closest flag fs has, a
// refused value with what the flag wants.
func flagError(cmd string, fs *pflag.FlagSet, err error) error {
	var (
		notExist *pflag.NotExistError
		invalid  *pflag.InvalidValueError
		required *pflag.ValueRequiredError
	)
	switch {
	case errors.As(err, &notExist):
		return usageErr(cmd, "%s", unknownFlag(fs, notExist))
	case errors.As(err, &invalid):
		f := invalid.GetFlag()
		why := errors.Unwrap(invalid)
		msg := "want " + f.Value.Type()
		if why != nil {
			msg = why.Error()
		}
		switch f.Value.Type() {
		case "bool":
			msg = "want true or false, or no value"
		case "int":
			msg = "want a whole number"
		}
		return usageErr(cmd, "%s %s: %s", flagName(f.Name), strconv.Quote(shorten(invalid.GetValue(), 40)), msg)
	case errors.As(err, &required):
		f := required.GetFlag()
		return usageErr(cmd, "%s needs a value", flagName(f.Name))
	}
	return usageErr(cmd, "%s", safetext.Escape(shorten(err.Error(), 200)))
}

// unknownFlag says that a flag is unknown, and what was meant by it.
func unknownFlag(fs *pflag.FlagSet, e *pflag.NotExistError) string {
	name, group := e.GetSpecifiedName(), e.GetSpecifiedShortnames()
	if group != "" {
		// A one-letter flag, alone (-n) or in a group (-qn, -ttl).
		out := "unknown flag -" + safetext.Escape(shorten(name, 40))
		if hint, ok := flockHints[name]; ok {
			return out + ": " + hint
		}
		if len(group) > 1 && fs.Lookup(group) != nil {
			return out + " in -" + group + "; did you mean --" + group + "? (long flags take two dashes)"
		}
		return out
	}
	out := "unknown flag --" + safetext.Escape(shorten(name, 40))
	if hint, ok := flockLongHints[name]; ok {
		return out + ": " + hint
	}
	var names []string
	fs.VisitAll(func(f *pflag.Flag) {
		if !f.Hidden {
			names = append(names, f.Name)
		}
	})
	if s, ok := closest(name, names); ok {
		out += "; did you mean " + flagName(s) + "?"
	}
	return out
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

// flockHints answer the one-letter flags of flock that dlock spells
// otherwise or has no need of.
var flockHints = map[string]string{
	"n": hintNonblock,
	"w": "dlock's is --wait DURATION (or --timeout SECONDS)",
	"x": hintExclusive,
	"e": hintExclusive,
	"s": "dlock's is --shared",
	"c": hintCommand,
	"o": hintClose,
	"u": hintUnlock,
	"F": hintNoFork,
}

// flockLongHints answer flock's long flags that dlock has not.
var flockLongHints = map[string]string{
	"nonblock":  hintNonblock,
	"nb":        hintNonblock,
	"exclusive": hintExclusive,
	"command":   hintCommand,
	"close":     hintClose,
	"unlock":    hintUnlock,
	"no-fork":   hintNoFork,
}

const (
	hintNonblock  = "dlock tries once by default (--wait 0)"
	hintExclusive = "a plain dlock run is exclusive"
	hintCommand   = "dlock runs the command after --: dlock run NAME -- sh -c 'COMMAND'"
	hintClose     = "dlock holds no file descriptor for the command to close"
	hintUnlock    = "the lock is released when dlock run ends (dlock release --force breaks another's)"
	hintNoFork    = "dlock runs the command as its child, to renew the lock while it runs"
)

// flockCommand returns the usage error for flock's "-c COMMAND" (or
// --command) given to run before any "--" and the command's name (a
// second positional argument, whose -c is its own): the command dlock
// would run is "sh -c COMMAND". It returns nil when raw has none.
func flockCommand(fs *pflag.FlagSet, raw []string) error {
	for i, arg := range raw {
		if arg == "--" || len(splitArgs(fs, raw[:i]).positional) > 1 {
			return nil
		}
		var cmd string
		var rest []string
		switch {
		case (arg == "-c" || arg == "--command") && i+1 < len(raw):
			cmd, rest = raw[i+1], append(slices.Clone(raw[:i]), raw[i+2:]...)
		case strings.HasPrefix(arg, "--command="):
			cmd, rest = strings.TrimPrefix(arg, "--command="), append(slices.Clone(raw[:i]), raw[i+1:]...)
		default:
			continue
		}
		if slices.Contains(rest, "--") {
			return nil
		}
		return usageErr("run", "dlock has no %s; flock's -c runs its command with sh -c: dlock run %s -- sh -c %s",
			strings.SplitN(arg, "=", 2)[0], safetext.Escape(strings.Join(rest, " ")), safetext.Escape(shellQuote(cmd)))
	}
	return nil
}

// shellQuote quotes s for sh, in single quotes.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
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
