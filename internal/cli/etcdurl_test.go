package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/etcdlock"
)

// An '@' in the query of an etcd:// URL belongs to the query, as net/url
// reads it: it changes neither the hosts nor the credentials.
func TestParseEtcdAtInQueryKeepsHostsAndCredentials(t *testing.T) {
	b, err := parseBackendURL("etcd://app:pw@h1?namespace=a@evil/")
	if err != nil {
		t.Fatal(err)
	}
	e := b.etcd
	if len(e.endpoints) != 1 || e.endpoints[0] != "h1:2379" || e.user != "app" || e.password != "pw" || e.namespace != "a@evil/" {
		t.Errorf("endpoints %v, user %q, password %q, namespace %q; want [h1:2379], app, pw, a@evil/", e.endpoints, e.user, e.password, e.namespace)
	}
	b, err = parseBackendURL("etcd://h1,h2?namespace=x@y/")
	if err != nil {
		t.Fatal(err)
	}
	if e := b.etcd; len(e.endpoints) != 2 || e.user != "" || e.password != "" || e.namespace != "x@y/" {
		t.Errorf("endpoints %v, user %q, namespace %q", e.endpoints, e.user, e.namespace)
	}
	if _, err := parseBackendURL("etcd://app:p/w@h1"); err == nil || !strings.Contains(err.Error(), "percent-encode") {
		t.Errorf("a '/' in the password: %v, want a hint to percent-encode it", err)
	}
}

// A namespace is a directory: the lock's name follows it directly, so one
// that does not end with '/' would share keys with another namespace's
// names ("app/x" + "y" is "app/" + "xy").
func TestParseEtcdNamespaceMustEndWithSlash(t *testing.T) {
	_, err := parseBackendURL("etcd://h1?namespace=app/x")
	if err == nil || !strings.Contains(err.Error(), "must end with '/'") {
		t.Errorf("namespace=app/x: %v, want an error saying it must end with '/'", err)
	}
	if _, err := parseBackendURL("etcd://h1?namespace=app/x/"); err != nil {
		t.Errorf("namespace=app/x/: %v", err)
	}
}

// FuzzParseEtcd checks that the hosts and the user information of a parsed
// etcd URL come from its authority (up to the first '/' or '?'), never
// from its path or query.
func FuzzParseEtcd(f *testing.F) {
	for _, s := range []string{
		"etcd://app:pw@h1?namespace=a@evil", "etcd://h1,h2:2380,[::1]", "etcd://u:p%40@h1/?namespace=n@m&op_timeout=1s",
		"etcds://u@h1,h2?ca=/a@b", "etcd://u:p@h1/@x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if !strings.HasPrefix(strings.ToLower(raw), "etcd://") && !strings.HasPrefix(strings.ToLower(raw), "etcds://") {
			return
		}
		b, err := parseBackendURL(raw)
		if err != nil {
			return
		}
		_, rest, _ := strings.Cut(raw, "://")
		authority, _, _ := cutAny(rest, "/?")
		e := b.etcd
		if (e.user != "" || e.password != "") && !strings.Contains(authority, "@") {
			t.Errorf("%q: user %q, password %q from outside the authority %q", raw, e.user, e.password, authority)
		}
		hosts := authority[strings.LastIndexByte(authority, '@')+1:]
		for _, ep := range e.endpoints {
			host := ep[:max(strings.LastIndexByte(ep, ':'), 0)]
			if !strings.Contains(hosts, host) {
				t.Errorf("%q: endpoint %q not in the hosts %q", raw, ep, hosts)
			}
		}
	})
}

// After a failed release on etcd, the CLI says how long the lock may stay
// on the store: its lease's TTL, 1.5 times the lock's rounded up, not the
// lock's TTL.
func TestEtcdReleaseFailureNamesLeaseExpiry(t *testing.T) {
	st := &store{storeTTL: etcdlock.StoreTTL}
	if got := st.expiresWithin(10 * time.Second); got != 15*time.Second {
		t.Errorf("etcd: expires within %v for a TTL of 10s, want 15s", got)
	}
	if got := (&store{}).expiresWithin(10 * time.Second); got != 10*time.Second {
		t.Errorf("other stores: expires within %v for a TTL of 10s, want 10s", got)
	}
}
