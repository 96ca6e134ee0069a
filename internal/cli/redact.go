// Keeping passwords out of messages: redacting backend URLs and scrubbing
// secrets from store errors.

package cli

import (
	"net/url"
	"regexp"
	"strings"
)

// passwordSpan returns the part of raw that a careful reader takes for a
// password: from the first ':' after "//" to the last '@'. It errs towards
// taking too much, which only hides more of an echoed URL.
func passwordSpan(raw string) string {
	i := strings.Index(raw, "://")
	if i < 0 {
		return ""
	}
	rest := raw[i+3:]
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return ""
	}
	c := strings.IndexByte(rest[:at], ':')
	if c < 0 {
		return ""
	}
	return rest[c+1 : at]
}

// secretParam matches the query parameters whose values are secrets:
// password= and sslpassword= (PostgreSQL), sentinel_password= (Redis
// Sentinel). Only these names: a pattern such as "contains pass" would also
// take allowCleartextPasswords=1 (MySQL) for a secret, and scrub every "1"
// from the driver's messages.
var secretParam = regexp.MustCompile(`(?i)([?&](?:password|sslpassword|sentinel_password)=)([^&#]*)`)

// redact returns raw with its passwords replaced by "xxxxx", for messages.
func redact(raw string) string {
	if span := passwordSpan(raw); span != "" {
		i := strings.Index(raw, "://") + 3
		c := i + strings.IndexByte(raw[i:], ':')
		raw = raw[:c+1] + "xxxxx" + raw[c+1+len(span):]
	}
	return secretParam.ReplaceAllString(raw, "${1}xxxxx")
}

// querySecrets returns the values of the secret query parameters of raw.
func querySecrets(raw string) []string {
	var out []string
	for _, m := range secretParam.FindAllStringSubmatch(raw, -1) {
		if m[2] == "" {
			continue
		}
		out = append(out, m[2])
		if dec, err := url.QueryUnescape(m[2]); err == nil && dec != m[2] {
			out = append(out, dec)
		}
	}
	return out
}

// scrub replaces every secret, and its percent-encoded forms, in msg. An
// occurrence inside a longer word is left alone ("p" in "tcp"): drivers do
// not put passwords in their messages, and this is the safety net for one
// that would, not a reason to garble every message of a short password. For
// the same reason a secret that is too short, or a number or a boolean
// (scrubbable says which), is left alone: scrubbing "1" or "true" would
// blank port numbers, addresses and flags, and tell nothing a reader could
// not guess.
func scrub(msg string, secrets []string) string {
	for _, s := range secrets {
		if !scrubbable(s) {
			continue
		}
		for _, form := range []string{s, url.PathEscape(s), url.QueryEscape(s), url.UserPassword("", s).String()[1:]} {
			if form != "" {
				msg = replaceWord(msg, form, "xxxxx")
			}
		}
	}
	return msg
}

// minSecretLen is the length below which scrub leaves a secret alone.
const minSecretLen = 4

// scrubbable reports whether scrub replaces s: not when it is shorter than
// minSecretLen, only digits, or a boolean word.
func scrubbable(s string) bool {
	if len(s) < minSecretLen {
		return false
	}
	if strings.Trim(s, "0123456789") == "" {
		return false
	}
	switch strings.ToLower(s) {
	case "true", "false", "yes", "no", "on", "off":
		return false
	}
	return true
}

// dropUserName drops from secrets those equal to the user name: the name
// is not hidden in messages ("access denied for user 'app'"), and a
// password that equals it would blank it everywhere while hiding nothing.
func dropUserName(secrets []string, user string) []string {
	if user == "" {
		return secrets
	}
	out := secrets[:0]
	for _, s := range secrets {
		if s != user {
			out = append(out, s)
		}
	}
	return out
}

// replaceWord replaces the occurrences of old in s that are not part of a
// longer run of letters and digits.
func replaceWord(s, old, repl string) string {
	var b strings.Builder
	from := 0
	for {
		i := strings.Index(s[from:], old)
		if i < 0 {
			b.WriteString(s[from:])
			return b.String()
		}
		i += from
		end := i + len(old)
		inWord := (i > 0 && isAlnum(s[i-1]) && isAlnum(old[0])) ||
			(end < len(s) && isAlnum(s[end]) && isAlnum(old[len(old)-1]))
		b.WriteString(s[from:i])
		if inWord {
			b.WriteString(old)
		} else {
			b.WriteString(repl)
		}
		from = end
	}
}

func isAlnum(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}
