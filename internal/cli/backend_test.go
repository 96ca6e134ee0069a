package cli

import (
	"strings"
	"testing"
	"time"
)

func TestParseBackendURLGood(t *testing.T) {
	tests := []struct {
		raw   string
		kind  backendKind
		where string
		check func(t *testing.T, b *backendURL)
	}{
		{raw: "sqlite:///var/lib/dlock/locks.db", kind: kindSQLite, where: "SQLite file /var/lib/dlock/locks.db"},
		{raw: "SQLITE:///tmp/a%20b.db", kind: kindSQLite, where: "SQLite file /tmp/a b.db"},
		{raw: "sqlite:state/locks.db", kind: kindSQLite, where: "SQLite file state/locks.db"},
		{raw: "sqlite:./locks.db", kind: kindSQLite, where: "SQLite file ./locks.db"},
		{raw: "redis://localhost:6379/0", kind: kindRedis, where: "redis at localhost:6379 (db 0)"},
		{raw: "redis://127.0.0.1", kind: kindRedis, where: "redis at 127.0.0.1:6379 (db 0)"},
		{raw: "redis://[::1]:7000/3", kind: kindRedis, where: "redis at [::1]:7000 (db 3)"},
		{
			raw: "redis://app:p%40ss@cache:6380/2?dial_timeout=1s", kind: kindRedis, where: "redis at cache:6380 (db 2)",
			check: func(t *testing.T, b *backendURL) {
				if b.redis.Username != "app" || b.redis.Password != "p@ss" || b.redis.DialTimeout != time.Second {
					t.Errorf("options = user %q password %q dial %v", b.redis.Username, b.redis.Password, b.redis.DialTimeout)
				}
				if len(b.secrets) != 1 || b.secrets[0] != "p@ss" {
					t.Errorf("secrets = %q", b.secrets)
				}
			},
		},
		{
			raw: "rediss://cache.example:6380/0", kind: kindRedis, where: "redis at cache.example:6380 (db 0)",
			check: func(t *testing.T, b *backendURL) {
				if b.redis.TLSConfig == nil {
					t.Error("rediss:// without TLS")
				}
			},
		},
		{
			raw: "redis+sentinel://:pw@s1:26379,s2,[::1]:26380/mymaster?db=4&sentinel_password=spw", kind: kindSentinel,
			where: `redis master "mymaster" via sentinels s1:26379,s2:26379,[::1]:26380 (db 4)`,
			check: func(t *testing.T, b *backendURL) {
				o := b.failover
				if o.MasterName != "mymaster" || o.Password != "pw" || o.SentinelPassword != "spw" || o.DB != 4 || len(o.SentinelAddrs) != 3 {
					t.Errorf("options = %+v", o)
				}
				if !contains(b.secrets, "pw") || !contains(b.secrets, "spw") {
					t.Errorf("secrets = %q", b.secrets)
				}
			},
		},
		{
			raw: "redis+cluster://u:p/w@h1:7000,h2:7001", kind: kindCluster, where: "redis cluster at h1:7000,h2:7001",
			check: func(t *testing.T, b *backendURL) {
				if b.cluster.Username != "u" || b.cluster.Password != "p/w" || len(b.cluster.Addrs) != 2 {
					t.Errorf("options = %+v", b.cluster)
				}
			},
		},
		{raw: "redis+cluster://h1:7000/0", kind: kindCluster, where: "redis cluster at h1:7000"},
		{
			raw: "mysql://app:s%3Acret@db.example/locks?tls=skip-verify", kind: kindMySQL, where: "mysql at db.example:3306 (database locks)",
			check: func(t *testing.T, b *backendURL) {
				c := b.mysql
				if c.User != "app" || c.Passwd != "s:cret" || c.DBName != "locks" || c.Net != "tcp" || c.TLSConfig != "skip-verify" {
					t.Errorf("config = %+v", c)
				}
			},
		},
		{
			raw: "postgres://app:pw@db.example:5433/locks?sslmode=disable", kind: kindPostgres, where: "postgres at db.example:5433 (database locks)",
			check: func(t *testing.T, b *backendURL) {
				if b.postgres.User != "app" || b.postgres.Password != "pw" || b.postgres.Database != "locks" {
					t.Errorf("config user %q password %q db %q", b.postgres.User, b.postgres.Password, b.postgres.Database)
				}
			},
		},
		{raw: "postgresql://app@db.example/locks?sslmode=disable", kind: kindPostgres, where: "postgres at db.example:5432 (database locks)"},
	}
	for _, tt := range tests {
		t.Run(tt.raw, func(t *testing.T) {
			b, err := parseBackendURL(tt.raw)
			if err != nil {
				t.Fatalf("parseBackendURL: %v", err)
			}
			if b.kind != tt.kind || b.where != tt.where {
				t.Errorf("kind %q where %q, want %q %q", b.kind, b.where, tt.kind, tt.where)
			}
			if tt.check != nil {
				tt.check(t, b)
			}
		})
	}
}

func TestParseBackendURLBad(t *testing.T) {
	tests := []struct{ raw, want string }{
		{"localhost:6379", "not a URL"},
		{"/var/lib/locks.db", "sqlite:///absolute/path.db"},
		{"memcached://h:11211", `unknown scheme "memcached"`},
		{"redlock://h1,h2,h3", "not supported yet"},
		{"sqlite://relative/path.db", "three slashes"},
		{"sqlite://user:secret@host/x.db", "three slashes"},
		{"sqlite:///", "no file path"},
		{"sqlite:///tmp/dir/", "directory"},
		{"sqlite::memory:", "in-memory"},
		{"sqlite:///tmp/x.db?cache=shared", "no query"},
		{"sqlite:///tmp/%zz.db", "percent-encoding"},
		{"redis://h:99999/0", "port 99999 is out of range"},
		{"redis://h:0/0", "out of range"},
		{"redis://h:port/0", "port is not a number"},
		{"redis://h/zero", "invalid database number"},
		{"redis://h/0/1", "invalid URL path"},
		{"redis://h:6379/0?nosuch=1", "nosuch"},
		{"redis://u:pa/ss@h:6379/0", "percent-encode"},
		{"redis://u:12/ss@h:6379/0", "percent-encode"},
		{"redis://u:p#ss@h:6379/0", "percent-encode"},
		{"redis://h a/0", "host"},
		{"redis://a,b:6379/0", "bad character in the host name"},
		{"redis://::1/0", "brackets"},
		{"redis://[::1/0", "IPv6"},
		{"redis:h:6379", "want redis://"},
		{"redis://h\n:6379", "control character"},
		{"redis+sentinel://s1:26379", "master's name"},
		{"redis+sentinel://s1:26379/a/b", "master's name"},
		{"redis+sentinel://s1:26379/m?db=x", "not a database number"},
		{"redis+sentinel://s1:26379/m?read_timeout=1", "unknown parameter"},
		{"redis+sentinel://s1:26379,/m", "empty host"},
		{"redis+sentinel:s1", "want redis+sentinel://"},
		{"redis+cluster://h1:7000/3", "only database 0"},
		{"redis+cluster://h1:7000?x=1", "no parameters"},
		{"redis+cluster://h1:70000", "out of range"},
		{"redis+cluster://u:%zz@h1", "percent-encoding"},
		{"redis+cluster://h1#frag", "fragment"},
		{"mysql://u:p@h:3306", "database name"},
		{"mysql://u:p@h:3306/a/b", "database name"},
		{"mysql://u:p@/db", "empty host"},
		{"mysql://u:p@h/db?timeout=never", "bad parameter"},
		{"postgres://u:p@h:5432/db?sslmode=sometimes", "sslmode"},
		{"postgres://u:p@h:x/db", "port is not a number"},
	}
	for _, tt := range tests {
		t.Run(tt.raw, func(t *testing.T) {
			b, err := parseBackendURL(tt.raw)
			if err == nil {
				t.Fatalf("parseBackendURL accepted it: %+v", b)
			}
			msg := err.Error()
			if !strings.Contains(msg, tt.want) {
				t.Errorf("error %q does not mention %q", msg, tt.want)
			}
			if strings.ContainsAny(msg, "\r\n") {
				t.Errorf("error %q is not one line", msg)
			}
		})
	}
}

func TestRedact(t *testing.T) {
	tests := []struct{ raw, want string }{
		{"redis://h:6379/0", "redis://h:6379/0"},
		{"redis://user@h:6379/0", "redis://user@h:6379/0"},
		{"redis://user:pw@h:6379/0", "redis://user:xxxxx@h:6379/0"},
		{"redis://:pw@h:6379/0", "redis://:xxxxx@h:6379/0"},
		{"redis://u:p/w?x#y@h:6379/0", "redis://u:xxxxx@h:6379/0"},
		{"postgres://h/db?sslmode=disable&password=pw", "postgres://h/db?sslmode=disable&password=xxxxx"},
		{"redis+sentinel://h/m?sentinel_password=pw&db=1", "redis+sentinel://h/m?sentinel_password=xxxxx&db=1"},
	}
	for _, tt := range tests {
		if got := redact(tt.raw); got != tt.want {
			t.Errorf("redact(%q) = %q, want %q", tt.raw, got, tt.want)
		}
	}
}

// marker is the start of every password in FuzzParseBackendURL.
const marker = "S3CR3T"

// FuzzParseBackendURL checks that no URL makes the parser panic, that every
// error is one line, and that a password never shows in what dlock prints:
// the error with the redacted URL, or the store's description.
func FuzzParseBackendURL(f *testing.F) {
	for _, seed := range []struct {
		scheme      uint8
		user, rest  string
		passwordEnd string
	}{
		{0, "", "/x.db", ""},
		{1, "app", "h:6379/0", "x"},
		{1, "app", "h:6379/0?password=p", "/x"},
		{2, "", "h:6379/1", "12/x"},
		{3, "u", "s1:26379,s2/m?db=1", "p@q"},
		{4, "u", "h1:7000,h2:7001", "#x"},
		{5, "root", "h:3306/db?tls=true", "?x"},
		{6, "app", "h:5432/db?sslmode=disable", "%41"},
		{7, "app", "[::1]:5432/db", "`: x"},
		{1, "", "", ""},
	} {
		f.Add(seed.scheme, seed.user, seed.passwordEnd, seed.rest)
	}
	schemeList := []string{"sqlite", "redis", "rediss", "redis+sentinel", "redis+cluster", "mysql", "postgres", "postgresql"}
	f.Fuzz(func(t *testing.T, scheme uint8, user, passwordEnd, rest string) {
		if strings.ContainsAny(user, ":/?#@") || strings.Contains(user+rest, marker) {
			t.Skip() // the marker must be in the password, and only there
		}
		raw := schemeList[int(scheme)%len(schemeList)] + "://" + user + ":" + marker + passwordEnd + "@" + rest
		b, err := parseBackendURL(raw)
		if err != nil {
			msg := "--backend " + redact(raw) + ": " + err.Error()
			if strings.Contains(msg, marker) {
				t.Errorf("message shows the password: %s", msg)
			}
			if strings.ContainsAny(err.Error(), "\r\n") {
				t.Errorf("error is not one line: %q", err)
			}
			return
		}
		if strings.Contains(b.where, marker) {
			t.Errorf("description shows the password: %s", b.where)
		}
		if len(b.secrets) == 0 && b.kind != kindSQLite {
			t.Errorf("no secrets kept for %q", raw)
		}
	})
}

func TestScrub(t *testing.T) {
	tests := []struct{ msg, secret, want string }{
		{"auth failed for p@ss (p%40ss)", "p@ss", "auth failed for xxxxx (xxxxx)"},
		{"dial tcp 127.0.0.1:1: refused", "p", "dial tcp 127.0.0.1:1: refused"},
		{"password p rejected", "p", "password xxxxx rejected"},
		{"hunter2hunter2", "hunter2", "hunter2hunter2"},
		{"key=hunter2;", "hunter2", "key=xxxxx;"},
	}
	for _, tt := range tests {
		if got := scrub(tt.msg, []string{tt.secret}); got != tt.want {
			t.Errorf("scrub(%q, %q) = %q, want %q", tt.msg, tt.secret, got, tt.want)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// FuzzParseBackendURLRaw feeds arbitrary strings: no panic, one-line errors,
// and redact never shows what passwordSpan calls the password.
func FuzzParseBackendURLRaw(f *testing.F) {
	for _, s := range []string{
		"", "redis://", "sqlite:", "sqlite:////", "redis+sentinel://@/", "redis+cluster://[::1]:1,[::1",
		"mysql://u:p@h/d?%zz", "postgres://h/d?password=p&x", "postgresql://u:p@h1,h2/db", "rediss://u:p@h/0?skip_verify=true",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		_, err := parseBackendURL(raw)
		if err != nil && strings.ContainsAny(err.Error(), "\r\n") {
			t.Errorf("error is not one line: %q", err)
		}
		if span := passwordSpan(raw); len(span) >= 8 && !strings.Contains(raw[:strings.Index(raw, "://")], span) {
			if strings.Contains(redact(raw), span) {
				t.Errorf("redact(%q) = %q shows %q", raw, redact(raw), span)
			}
		}
	})
}
