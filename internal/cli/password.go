// The store's password from --password-file or DLOCK_PASSWORD, and keeping
// credentials out of the command's environment.

package cli

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// envPassword is the environment variable with the store's password, for
// URLs without one: a password in --backend stands on the command line,
// where ps shows it to every user of the machine while dlock runs.
const envPassword = "DLOCK_PASSWORD"

// password returns the password given by --password-file or
// DLOCK_PASSWORD, and where it came from; "" when neither is given.
func (a *app) password() (pw, source string, err error) {
	if a.passwordFile != "" {
		data, err := os.ReadFile(a.passwordFile)
		if err != nil {
			return "", "", fail(exitUsage, "--password-file: %v", err)
		}
		if fi, err := os.Stat(a.passwordFile); err == nil && fi.Mode().Perm()&0o004 != 0 && !a.warned {
			fmt.Fprintf(a.msgs(), "dlock: warning: --password-file %q is readable by every user of this host (mode %04o); chmod o-r it\n",
				a.passwordFile, fi.Mode().Perm())
		}
		pw = strings.TrimRight(string(data), "\r\n")
		if pw == "" {
			return "", "", fail(exitUsage, "--password-file %q: the file is empty", a.passwordFile)
		}
		if strings.ContainsAny(pw, "\r\n") {
			return "", "", fail(exitUsage, "--password-file %q: more than one line", a.passwordFile)
		}
		return pw, "--password-file", nil
	}
	if pw = os.Getenv(envPassword); pw != "" {
		return pw, envPassword, nil
	}
	return "", "", nil
}

// setPassword gives the store pw as its password. A URL that has a
// password of its own takes no second one, and a SQLite file none at all.
func (b *backendURL) setPassword(pw string) error {
	set := func(have *string) error {
		if *have != "" {
			return errors.New("the URL has a password already; give it once")
		}
		*have = pw
		return nil
	}
	var err error
	switch {
	case b.redis != nil:
		err = set(&b.redis.Password)
	case b.failover != nil:
		err = set(&b.failover.Password)
	case b.cluster != nil:
		err = set(&b.cluster.Password)
	case b.redlock != nil:
		for _, o := range b.redlock.nodes {
			if err = set(&o.Password); err != nil {
				break
			}
		}
	case b.mysql != nil:
		err = set(&b.mysql.Passwd)
	case b.postgres != nil:
		err = set(&b.postgres.Password)
	case b.etcd != nil:
		if b.etcd.user == "" {
			return errors.New("etcd authenticates a user: give the user in the URL (etcd://user@host:2379)")
		}
		err = set(&b.etcd.password)
	default:
		return errors.New("a SQLite file takes no password")
	}
	if err != nil {
		return err
	}
	b.secrets = append(b.secrets, pw)
	return nil
}

// redisUserWithoutPassword returns the user that a Redis URL names without
// a password once every source of one was applied, or "", and whether it
// is the sentinels' user (sentinel_username). go-redis sends AUTH only with
// a password, so that user would be ignored: the connection would be the
// default user's, with its rights, or refused.
func (b *backendURL) redisUserWithoutPassword() (string, bool) {
	check := func(user, pw string) string {
		if user != "" && pw == "" {
			return user
		}
		return ""
	}
	switch {
	case b.redis != nil:
		return check(b.redis.Username, b.redis.Password), false
	case b.failover != nil:
		if u := check(b.failover.Username, b.failover.Password); u != "" {
			return u, false
		}
		u := check(b.failover.SentinelUsername, b.failover.SentinelPassword)
		return u, u != ""
	case b.cluster != nil:
		return check(b.cluster.Username, b.cluster.Password), false
	case b.redlock != nil:
		for _, o := range b.redlock.nodes {
			if u := check(o.Username, o.Password); u != "" {
				return u, false
			}
		}
	}
	return "", false
}

// withoutCredentials returns env without the variables that carry the
// store's credentials: DLOCK_PASSWORD, and DLOCK_BACKEND when its URL holds a
// password. A command run under a lock has no business with them.
func withoutCredentials(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		switch {
		case name == envPassword:
		case name == envBackend && redact(value) != value:
		default:
			out = append(out, kv)
		}
	}
	return out
}

// passwordErr describes a password that could not be used with the URL.
func passwordErr(source string, err error) error {
	return fail(exitUsage, "%s: %v", source, err)
}
