package cli_test

import (
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/test/testserver"
)

// closedPort returns a loopback port on which nothing listens.
func closedPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	return port
}

// blackHole listens on a loopback port, accepts connections and never
// answers, like a server that hangs; it stops when the test ends.
func blackHole(t *testing.T) int {
	t.Helper()
	_, port, _ := net.SplitHostPort(testserver.StartSilent(t))
	n, _ := strconv.Atoi(port)
	return n
}

// oneLine checks that stderr is exactly one line.
func oneLine(t *testing.T, r result) {
	t.Helper()
	if strings.Count(r.stderr, "\n") != 1 || !strings.HasSuffix(r.stderr, "\n") {
		t.Errorf("stderr is not one line:\n%s", r.stderr)
	}
	if strings.Contains(r.stderr, "goroutine ") || strings.Contains(r.stderr, "panic") {
		t.Errorf("stderr looks like a crash:\n%s", r.stderr)
	}
}

// TestBadBackend: bad URLs are usage errors, unreachable stores exit 69;
// each says so in one line, soon, without the password.
func TestBadBackend(t *testing.T) {
	closed := strconv.Itoa(closedPort(t))
	hole := strconv.Itoa(blackHole(t))
	cases := []struct {
		name    string
		backend string
		args    []string
		code    int
		want    string
	}{
		{"unknown scheme", "memcached://localhost:11211", nil, 64, `unknown scheme "memcached"`},
		{"not a URL", "localhost:6379", nil, 64, "not a URL"},
		{"bad port", "redis://u:hunter2@localhost:99999/0", nil, 64, `"redis://u:xxxxx@localhost:99999/0": port 99999 is out of range`},
		{"relative sqlite", "sqlite://locks.db", nil, 64, "three slashes"},
		{"missing directory", "sqlite:///nonexistent-dir-dlock/locks.db", nil, 69, "directory /nonexistent-dir-dlock does not exist"},
		{"redis refused", "redis://u:hunter2@127.0.0.1:" + closed + "/0", nil, 69, "cannot reach redis at 127.0.0.1:" + closed + " (db 0): "},
		{"redis hangs", "redis://127.0.0.1:" + hole + "/0", []string{"--connect-timeout", "500ms"}, 69,
			"no answer from redis at 127.0.0.1:" + hole + " (db 0) within 500ms"},
		{"mysql refused", "mysql://root:hunter2@127.0.0.1:" + closed + "/locks", nil, 69, "cannot reach mysql at 127.0.0.1:" + closed},
		{"mysql hangs", "mysql://root:hunter2@127.0.0.1:" + hole + "/locks", []string{"--connect-timeout", "500ms"}, 69, "within 500ms"},
		{"postgres refused", "postgres://app:hunter2@127.0.0.1:" + closed + "/locks?sslmode=disable", nil, 69, "cannot reach postgres at 127.0.0.1:" + closed},
		{"postgres hangs", "postgres://app:hunter2@127.0.0.1:" + hole + "/locks?sslmode=disable", []string{"--connect-timeout", "500ms"}, 69, "within 500ms"},
		{"sentinel refused", "redis+sentinel://:hunter2@127.0.0.1:" + closed + "/mymaster", nil, 69, "cannot reach redis master"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			for _, how := range []string{"flag", "env"} {
				var e *env
				args := append([]string{}, c.args...)
				if how == "flag" {
					e = newEnv(t, "")
					args = append(args, "ls", "--backend", c.backend)
				} else {
					e = newEnv(t, c.backend)
					args = append(args, "run", "x", "--", "echo", "ran")
				}
				r := e.run(args...)
				expect(t, r, c.code, c.want)
				if how == "flag" && strings.Contains(c.backend, ":hunter2@") && c.code != 64 {
					// A password in --backend is warned of, on a line
					// of its own before the error.
					const warning = "dlock: warning: the password in --backend is visible to other users of this host (ps)"
					first, rest, _ := strings.Cut(r.stderr, "\n")
					if !strings.HasPrefix(first, warning) {
						t.Errorf("no warning of the password in --backend:\n%s", r.stderr)
					}
					r.stderr = rest
				}
				oneLine(t, r)
				if strings.Contains(r.stderr, "hunter2") {
					t.Errorf("stderr shows the password:\n%s", r.stderr)
				}
				if r.stdout != "" {
					t.Errorf("stdout %q", r.stdout)
				}
				if limit := 4 * time.Second; r.elapsed > limit {
					t.Errorf("took %v, want under %v", r.elapsed, limit)
				}
				if how == "env" && c.code == 64 && !strings.Contains(r.stderr, "DLOCK_BACKEND") {
					t.Errorf("the message does not say the URL came from DLOCK_BACKEND:\n%s", r.stderr)
				}
			}
		})
	}
}

func TestUsage(t *testing.T) {
	e := newEnv(t, sqliteURL(t))
	cases := []struct {
		args   []string
		code   int
		stdout string // a part of stdout
		stderr string // a part of stderr
	}{
		{nil, 64, "", "no command given"},
		{[]string{"frobnicate"}, 64, "", `unknown command "frobnicate"`},
		{[]string{"--nope", "ls"}, 64, "", "unknown flag --nope"},
		{[]string{"-h"}, 0, "Commands:", ""},
		{[]string{"help"}, 0, "sqlite:///abs/path/locks.db", ""},
		{[]string{"help", "run"}, 0, "Exit status:", ""},
		{[]string{"run", "--help"}, 0, "--kill-grace DURATION", ""},
		{[]string{"help", "nope"}, 64, "", `no help for "nope"`},
		{[]string{"lss"}, 64, "", `unknown command "lss"; did you mean ls?`},
		{[]string{"inspec", "x"}, 64, "", `did you mean inspect?`},
		{[]string{"release", "--force", ""}, 64, "", "lock name: empty"},
		{[]string{"inspect", strings.Repeat("n", 10000)}, 64, "", "lock name: 10000 bytes, over the limit of 255"},
		{[]string{"inspect", "a\x1b[2Jb"}, 64, "", `"a\x1b[2Jb" contains U+001B`},
		{[]string{"--connect-timeout", "5", "ls"}, 64, "", `--connect-timeout "5": 5 has no unit; write 5s or 5m`},
		{[]string{"ls", "a", "b"}, 64, "", "at most one PREFIX"},
		{[]string{"ls", "--jsn"}, 64, "", "unknown flag --jsn; did you mean --json?"},
		{[]string{"inspect"}, 64, "", "want one lock NAME"},
		{[]string{"release", "--force"}, 64, "", "want one lock NAME"},
		{[]string{"run", "--lock-delay", "-1s", "x", "--", "true"}, 64, "", "--lock-delay -1s is negative"},
		{[]string{"run", "--lock-delay", "5s", "x", "--", "true"}, 64, "", "--lock-delay needs a Redis or Redlock backend"},
		{[]string{"version"}, 0, "dlock ", ""},
		{[]string{"--version"}, 0, "dlock ", ""},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			t.Parallel()
			r := e.run(c.args...)
			if r.code != c.code || !strings.Contains(r.stdout, c.stdout) || !strings.Contains(r.stderr, c.stderr) {
				t.Errorf("dlock %q: exit %d, stdout:\n%s\nstderr:\n%s\nwant exit %d, stdout with %q, stderr with %q",
					c.args, r.code, r.stdout, r.stderr, c.code, c.stdout, c.stderr)
			}
			if c.code == 64 && !strings.Contains(r.stderr, "usage: dlock") {
				t.Errorf("dlock %q: no usage after the error:\n%s", c.args, r.stderr)
			}
		})
	}
}

// TestHelpRunListsExitCodes: the exit codes are documented where the user
// looks for them.
func TestHelpRunListsExitCodes(t *testing.T) {
	t.Parallel()
	r := newEnv(t, "").run("help", "run")
	expect(t, r, 0)
	for _, code := range []string{"128+N", "64", "69", "75", "76", "126", "127"} {
		if !strings.Contains(r.stdout, "\n  "+code+" ") {
			t.Errorf("help run does not list exit status %s:\n%s", code, r.stdout)
		}
	}
}

// TestConnectCauses: a store that answers, but refuses the credentials or
// lacks what the URL names, is not "unreachable": refused credentials exit
// 77 (EX_NOPERM), a database the store does not have 78 (EX_CONFIG), each
// in the store's own words without the driver's other attempts (pgx's TLS
// try); no HOME for the default store is a configuration error too.
func TestConnectCauses(t *testing.T) {
	t.Parallel()
	rdb := testserver.StartRedis(t)
	pwRedis := testserver.StartRedis(t)
	if err := pwRedis.Client(t).ConfigSet(t.Context(), "requirepass", "right").Err(); err != nil {
		t.Fatal(err)
	}
	maria := testserver.StartMariaDB(t)
	maria.CreateDatabase(t, "locks")
	mdb := maria.DB(t, "")
	for _, q := range []string{"CREATE USER 'app'@'%' IDENTIFIED BY 'right'", "GRANT ALL ON locks.* TO 'app'@'%'"} {
		if _, err := mdb.ExecContext(t.Context(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	pg := testserver.StartPostgres(t)
	pg.AddPasswordUser(t, "app", "right")
	pgHost := pg.Addr()

	cases := []struct {
		name    string
		backend string
		vars    []string
		code    int
		want    string
	}{
		{"redis db out of range", "redis://" + rdb.Addr() + "/99", nil, 78, "the database number is out of range"},
		{"redis no password", "redis://" + pwRedis.Addr() + "/0", nil, 77, "refused the credentials: NOAUTH"},
		{"redis wrong password", "redis://" + pwRedis.Addr() + "/0", []string{"DLOCK_PASSWORD=wrong"}, 77, "refused the credentials: WRONGPASS"},
		{"mariadb wrong password", "mysql://app@" + maria.Addr() + "/locks", []string{"DLOCK_PASSWORD=wrong"}, 77, "refused the credentials: Error 1045"},
		{"mariadb unknown database", "mysql://root@" + maria.Addr() + "/nope", nil, 78, "Error 1049"},
		{"postgres wrong password", "postgres://app@" + pgHost + "/postgres", []string{"DLOCK_PASSWORD=wrong"}, 77, `refused the credentials: password authentication failed for user "app" (SQLSTATE 28P01)`},
		{"postgres unknown database", "postgres://postgres@" + pgHost + "/nope?sslmode=disable", nil, 78, `database "nope" does not exist (SQLSTATE 3D000)`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newEnv(t, c.backend, c.vars...).run("ls")
			expect(t, r, c.code, c.want)
			oneLine(t, r)
			for _, noise := range []string{"cannot reach", "tls error", "wrong"} {
				if strings.Contains(r.stderr, noise) {
					t.Errorf("stderr has %q:\n%s", noise, r.stderr)
				}
			}
		})
	}
	// Neither HOME nor XDG_STATE_HOME: the default store has no place.
	e := newEnv(t, "")
	var vars []string
	for _, kv := range e.vars {
		if !strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "XDG_STATE_HOME=") {
			vars = append(vars, kv)
		}
	}
	e.vars = vars
	expect(t, e.run("ls"), 78, "neither XDG_STATE_HOME nor HOME is set")
}

// TestRunEvictingRedisIsConfigError: a Redis that may evict lock keys is a
// configuration to change (78), not a store out of reach (69), and the
// message says so once, in one line: the lock's name and the store once,
// without the library's layers repeating them.
func TestRunEvictingRedisIsConfigError(t *testing.T) {
	t.Parallel()
	rdb := testserver.StartRedis(t, "--maxmemory-policy", "allkeys-lru")
	r := newEnv(t, "redis://"+rdb.Addr()+"/0").run("run", "x", "--", "true")
	expect(t, r, 78, `dlock: lock "x": redis at `+rdb.Addr()+` (db 0): maxmemory-policy allkeys-lru on `, "allow_eviction=1")
	oneLine(t, r)
	for _, repeated := range []string{`"x"`, "maxmemory-policy allkeys-lru"} {
		if n := strings.Count(r.stderr, repeated); n != 1 {
			t.Errorf("stderr has %q %d times, want once:\n%s", repeated, n, r.stderr)
		}
	}
	if strings.Contains(r.stderr, "redislock") {
		t.Errorf("stderr names the library's layers:\n%s", r.stderr)
	}
}

// TestRunStoreErrorSaysEachLayerOnce: a store error that no class covers
// (Redis out of memory) reaches the user with the operation, the lock's
// name, dlock's prefix and the store's address each said once.
func TestRunStoreErrorSaysEachLayerOnce(t *testing.T) {
	t.Parallel()
	rdb := testserver.StartRedis(t, "--maxmemory", "1", "--maxmemory-policy", "noeviction")
	r := newEnv(t, "redis://"+rdb.Addr()+"/0").run("run", "x", "--", "true")
	expect(t, r, 69, `dlock: acquire "x": redis `+rdb.Addr()+`: OOM command not allowed`)
	oneLine(t, r)
	for _, once := range []string{`"x"`, "dlock:", "acquire", rdb.Addr()} {
		if n := strings.Count(r.stderr, once); n != 1 {
			t.Errorf("stderr has %q %d times, want once:\n%s", once, n, r.stderr)
		}
	}
	if strings.Contains(r.stderr, "redislock") {
		t.Errorf("stderr names the library's layers:\n%s", r.stderr)
	}
}

// TestRunRedisACLRefusalSaysEachLayerOnce: a Redis user whose ACL refuses
// dlock's script or keys is refused rights (77), said in Redis's words with
// the lock's name, dlock's prefix and the store's address each once,
// without the library's layers repeating them.
func TestRunRedisACLRefusalSaysEachLayerOnce(t *testing.T) {
	t.Parallel()
	rdb := testserver.StartRedis(t)
	for user, rules := range map[string][]string{
		"nokeys":   {"~other:*", "&*", "+@all"},
		"noscript": {"~dlock:*", "&dlock:*", "+@all", "-evalsha", "-eval"},
	} {
		args := append([]any{"ACL", "SETUSER", user, "on", ">pw"}, toAny(rules)...)
		if err := rdb.Client(t).Do(t.Context(), args...).Err(); err != nil {
			t.Fatal(err)
		}
		t.Run(user, func(t *testing.T) {
			r := newEnv(t, "redis://"+user+"@"+rdb.Addr()+"/0", "DLOCK_PASSWORD=pw").run("run", "x", "--", "true")
			expect(t, r, 77, `dlock: lock "x": redis at `+rdb.Addr()+` (db 0): NOPERM `)
			oneLine(t, r)
			for _, once := range []string{`"x"`, "dlock:", rdb.Addr()} {
				if n := strings.Count(r.stderr, once); n != 1 {
					t.Errorf("stderr has %q %d times, want once:\n%s", once, n, r.stderr)
				}
			}
		})
	}
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// TestTLSURLAgainstPlainRedisNamesTLS: a Redis without TLS never answers a
// TLS handshake (it waits for the end of a line), so a rediss:// URL for a
// plain port times out; the message says that the URL asks for TLS. A
// plain URL that times out says nothing of TLS.
func TestTLSURLAgainstPlainRedisNamesTLS(t *testing.T) {
	t.Parallel()
	_, srv := redisURL(t)
	r := newEnv(t, "rediss://"+srv.Addr()+"/0").run("--connect-timeout", "500ms", "run", "x", "--", "true")
	expect(t, r, 69, "within 500ms (--connect-timeout); the URL asks for TLS (rediss://): is the server's port a TLS one?")
	oneLine(t, r)
	hole := strconv.Itoa(blackHole(t))
	r = newEnv(t, "redis://127.0.0.1:"+hole+"/0").run("--connect-timeout", "500ms", "run", "x", "--", "true")
	expect(t, r, 69, "within 500ms (--connect-timeout)")
	if strings.Contains(r.stderr, "TLS") {
		t.Errorf("a plain URL's timeout speaks of TLS:\n%s", r.stderr)
	}
}
