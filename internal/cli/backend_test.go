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
		{
			raw: "etcd://e1,e2:2380,[::1]", kind: kindEtcd, where: "etcd at e1:2379,e2:2380,[::1]:2379",
			check: func(t *testing.T, b *backendURL) {
				if e := b.etcd; len(e.endpoints) != 3 || e.tls || e.user != "" || len(b.secrets) != 0 {
					t.Errorf("etcd = %+v, secrets %q", e, b.secrets)
				}
			},
		},
		{
			raw: "ETCDS://app:p%40ss@e1:2379/?namespace=team/&op_timeout=5s&ca=/etc/ca.pem", kind: kindEtcd, where: "etcd at e1:2379",
			check: func(t *testing.T, b *backendURL) {
				e := b.etcd
				if !e.tls || e.user != "app" || e.password != "p@ss" || e.namespace != "team/" || e.timeout != 5*time.Second || e.ca != "/etc/ca.pem" {
					t.Errorf("etcd = %+v", e)
				}
				if len(b.secrets) != 1 || b.secrets[0] != "p@ss" {
					t.Errorf("secrets = %q", b.secrets)
				}
			},
		},
		{
			raw: "etcd://e1?tls=1", kind: kindEtcd, where: "etcd at e1:2379",
			check: func(t *testing.T, b *backendURL) {
				if !b.etcd.tls {
					t.Error("tls=1 without TLS")
				}
			},
		},
		{
			raw: "etcd://e1?handoff=0", kind: kindEtcd, where: "etcd at e1:2379",
			check: func(t *testing.T, b *backendURL) {
				if !b.etcd.noHandoff || len(etcdOptions(b.etcd)) != 1 {
					t.Errorf("handoff=0: %+v", b.etcd)
				}
			},
		},
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
			raw: "redis://h:6379/1?replica_ack=2&dial_timeout=2s", kind: kindRedis, where: "redis at h:6379 (db 1)",
			check: func(t *testing.T, b *backendURL) {
				if b.replicaAck != 2 || b.replicaAckTimeout != defaultReplicaAckTimeout || b.redis.DialTimeout != 2*time.Second {
					t.Errorf("replica ack %d %v, dial %v", b.replicaAck, b.replicaAckTimeout, b.redis.DialTimeout)
				}
			},
		},
		{
			raw: "redis+sentinel://s1/m?replica_ack=1&replica_ack_timeout=250ms&db=2", kind: kindSentinel,
			where: `redis master "m" via sentinels s1:26379 (db 2)`,
			check: func(t *testing.T, b *backendURL) {
				if b.replicaAck != 1 || b.replicaAckTimeout != 250*time.Millisecond {
					t.Errorf("replica ack %d %v", b.replicaAck, b.replicaAckTimeout)
				}
			},
		},
		{
			raw: "redis+cluster://h1:7000?replica_ack=1", kind: kindCluster, where: "redis cluster at h1:7000",
			check: func(t *testing.T, b *backendURL) {
				if b.replicaAck != 1 {
					t.Errorf("replica ack %d", b.replicaAck)
				}
			},
		},
		{
			raw: "redlock://:s%40cret@r1,r2:6380,[::1]/2?node_timeout=20ms", kind: kindRedlock,
			where: "redlock over 3 nodes r1:6379,r2:6380,[::1]:6379 (db 2)",
			check: func(t *testing.T, b *backendURL) {
				r := b.redlock
				if len(r.nodes) != 3 || r.nodeTimeout != 20*time.Millisecond {
					t.Fatalf("redlock = %+v", r)
				}
				for _, o := range r.nodes {
					if o.Password != "s@cret" || o.DB != 2 {
						t.Errorf("node options = %+v", o)
					}
				}
				if !contains(b.secrets, "s@cret") {
					t.Errorf("secrets = %q", b.secrets)
				}
			},
		},
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
		{"redlock://h1,h2", "at least 3 independent nodes"},
		{"etcd://h1/prefix", "no path"},
		{"etcd://h1?foo=1", "unknown parameter"},
		{"etcd://h1?cert=/c.pem", "cert= and key= together"},
		{"etcd://h1?op_timeout=0s", "positive duration"},
		{"etcd://h1?handoff=maybe", "not 1 or 0"},
		{"etcd://:pw@h1", "without a user"},
		{"etcd://h1,,h2", "empty host"},
		{"redis://h/0?replica_ack=x", "not a number of replicas"},
		{"redis://h/0?replica_ack=1&replica_ack_timeout=0s", "positive duration"},
		{"redis://h/0?replica_ack_timeout=1s", "needs replica_ack=N"},
		{"redis://h/0?replica_ack=0&replica_ack_timeout=1s", "needs replica_ack=N"},
		{"redis+cluster://h1?foo=1", "only replica_ack"},
		{"redlock://h1,h2,h3?replica_ack=1", "unknown parameter"},
		{"redlock://h1,h2,h1:6379", "listed twice"},
		{"redlock://h1,h2,h3/x", "not a database number"},
		{"redlock://h1,h2,h3?node_timeout=-1s", "positive duration"},
		{"redlock://h1,h2,h3?dial_timeout=1s", "unknown parameter"},
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
		{"redis+cluster://h1:7000?x=1", "only replica_ack"},
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
		{"postgres://h/db?SSLPassword=kp&sslmode=require", "postgres://h/db?SSLPassword=xxxxx&sslmode=require"},
		// Only the known secret parameters: these are flags, not passwords.
		{"mysql://root:pw@h/db?allowCleartextPasswords=1", "mysql://root:xxxxx@h/db?allowCleartextPasswords=1"},
		{"mysql://root@h/db?allowNativePasswords=true&allowOldPasswords=false", "mysql://root@h/db?allowNativePasswords=true&allowOldPasswords=false"},
		{"postgres://h/db?passfile=/etc/pgpass&token=x", "postgres://h/db?passfile=/etc/pgpass&token=x"},
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
		{8, "", "r1,r2:6380,[::1]/2?node_timeout=20ms", "@x"},
		{8, "u", "r1,r1,r2", "p"},
		{9, "root", "e1:2379,e2,e3", "x"},
		{10, "u", "e1/?namespace=a/&ca=/x", "@x"},
		{1, "", "", ""},
	} {
		f.Add(seed.scheme, seed.user, seed.passwordEnd, seed.rest)
	}
	schemeList := []string{"sqlite", "redis", "rediss", "redis+sentinel", "redis+cluster", "mysql", "postgres", "postgresql", "redlock", "etcd", "etcds"}
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
		{"password p rejected", "p", "password p rejected"}, // too short to scrub
		{"password hunter2 rejected", "hunter2", "password xxxxx rejected"},
		{"hunter2hunter2", "hunter2", "hunter2hunter2"},
		{"key=hunter2;", "hunter2", "key=xxxxx;"},
	}
	for _, tt := range tests {
		if got := scrub(tt.msg, []string{tt.secret}); got != tt.want {
			t.Errorf("scrub(%q, %q) = %q, want %q", tt.msg, tt.secret, got, tt.want)
		}
	}
}

// TestSecretsOfURL: which parts of a URL are kept as secrets to scrub.
func TestSecretsOfURL(t *testing.T) {
	tests := []struct {
		raw  string
		want []string
	}{
		{"redis://app:hunter2@h:6379/0", []string{"hunter2"}},
		{"redis://:hunter2@h:6379/0", []string{"hunter2"}},
		{"mysql://root:s3cret@h/db?allowCleartextPasswords=1", []string{"s3cret"}},
		{"mysql://root@h/db?allowCleartextPasswords=1&allowNativePasswords=true", nil},
		// A password equal to the user name would blank the user name.
		{"mysql://root:root@h/db", nil},
		{"redis+sentinel://app:app@s1/m?sentinel_password=sentpw", []string{"sentpw"}},
		{"postgres://app:dbpass@h/db?sslpassword=keypass&sslmode=require", []string{"dbpass", "keypass"}},
		{"postgres://app@h/db?password=p%40ss1", []string{"p%40ss1", "p@ss1"}},
	}
	for _, tt := range tests {
		b, err := parseBackendURL(tt.raw)
		if err != nil {
			t.Errorf("parseBackendURL(%q): %v", tt.raw, err)
			continue
		}
		if strings.Join(b.secrets, " ") != strings.Join(tt.want, " ") {
			t.Errorf("secrets of %q = %q, want %q", tt.raw, b.secrets, tt.want)
		}
	}
}

// TestScrubLeavesDriverMessages: the messages of real drivers keep their
// addresses, ports, codes and user names when the URL has flags or short,
// numeric or boolean secrets.
func TestScrubLeavesDriverMessages(t *testing.T) {
	const denied = "Error 1045 (28000): Access denied for user 'root'@'127.0.0.1' (using password: YES)"
	tests := []struct {
		name, raw, msg, want string
	}{
		{"flag parameter", "mysql://root:s3cret@127.0.0.1:1/db?allowCleartextPasswords=1", denied, denied},
		{"password equals user", "mysql://root:root@127.0.0.1/db", denied, denied},
		{"numeric password", "mysql://root:1045@127.0.0.1/db", denied, denied},
		{"short password", "mysql://root:127@127.0.0.1/db", denied, denied},
		{"boolean password", "postgres://app:yes@h/db", "password authentication failed for user \"app\" (using password: YES)",
			"password authentication failed for user \"app\" (using password: YES)"},
		{"real password", "redis://app:hunter2@h:6379/0", "WRONGPASS hunter2 for app at h:6379", "WRONGPASS xxxxx for app at h:6379"},
		{"encoded password", "redis://app:p%40ssw0rd@h:6379/0", "auth p@ssw0rd (p%40ssw0rd) refused", "auth xxxxx (xxxxx) refused"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := parseBackendURL(tt.raw)
			if err != nil {
				t.Fatal(err)
			}
			if got := scrub(tt.msg, b.secrets); got != tt.want {
				t.Errorf("scrub = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestScrubbable(t *testing.T) {
	tests := []struct {
		s    string
		want bool
	}{
		{"", false}, {"1", false}, {"pw", false}, {"abc", false}, {"1234", false}, {"0000000000", false},
		{"true", false}, {"FALSE", false}, {"yes", false}, {"off", false},
		{"abcd", true}, {"12a4", true}, {"hunter2", true}, {"p@ss", true}, {"truee", true},
	}
	for _, tt := range tests {
		if got := scrubbable(tt.s); got != tt.want {
			t.Errorf("scrubbable(%q) = %v, want %v", tt.s, got, tt.want)
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
		"etcd://u:p@h1,h2?namespace=x", "etcds://:p@h", "etcd://u:p%zz@h",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		_, err := parseBackendURL(raw)
		if err != nil && strings.ContainsAny(err.Error(), "\r\n") {
			t.Errorf("error is not one line: %q", err)
		}
		// The password may also stand, as text, in the host or path part
		// (redis://u:host1234@host1234/0): only the user information of
		// the redacted URL must not show it.
		if span := passwordSpan(raw); len(span) >= 8 {
			if info := userInfo(redact(raw)); strings.Contains(info, span) {
				t.Errorf("redact(%q) = %q shows %q in the user information", raw, redact(raw), span)
			}
		}
	})
}

// userInfo returns the user information of a URL as passwordSpan finds it:
// between "://" and the last '@', or "" when there is none.
func userInfo(raw string) string {
	i := strings.Index(raw, "://")
	if i < 0 {
		return ""
	}
	rest := raw[i+3:]
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return ""
	}
	return rest[:at]
}

// The check of FuzzParseBackendURLRaw looks at the user information only: a
// password that also stands in the host part is not a leak.
func TestFuzzCheckLooksOutsideTheHost(t *testing.T) {
	raw := "redis://u:host12345@host12345:6379/0"
	if span := passwordSpan(raw); span != "host12345" {
		t.Fatalf("passwordSpan = %q", span)
	}
	if info := userInfo(redact(raw)); strings.Contains(info, "host12345") {
		t.Errorf("redact(%q) = %q keeps the password", raw, redact(raw))
	}
	if !strings.Contains(redact(raw), "@host12345:6379") {
		t.Errorf("redact(%q) = %q lost the host", raw, redact(raw))
	}
}
