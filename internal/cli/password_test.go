package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dlock-go/dlock/internal/test/testserver"
)

// A password in --backend stands on the command line, where ps shows it to
// every user while dlock run lasts. DLOCK_PASSWORD and --password-file keep
// it off; and the command run under the lock is handed no credential.
func TestPasswordOffTheCommandLine(t *testing.T) {
	t.Parallel()
	const secret = "s3cret-Pw.42"
	srv := testserver.StartRedis(t)
	if err := srv.Client(t).ConfigSet(t.Context(), "requirepass", secret).Err(); err != nil {
		t.Fatal(err)
	}
	plain := "redis://" + srv.Addr() + "/0"
	dir := t.TempDir()
	file := filepath.Join(dir, "pw")
	if err := os.WriteFile(file, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	// Without a password Redis refuses; with one from either source it works.
	if r := newEnv(t, plain).run("run", "a", "--", "true"); r.code == 0 {
		t.Fatalf("run without the password succeeded: %q", r.stderr)
	}
	pwEnv := newEnv(t, plain, "DLOCK_PASSWORD="+secret)
	expect(t, pwEnv.run("run", "a", "--", "true"), 0)
	expect(t, newEnv(t, plain).run("--password-file", file, "run", "a", "--", "true"), 0)

	// The child sees neither DLOCK_PASSWORD nor a DLOCK_BACKEND that holds a
	// password; it still gets its lock's name and fence.
	withPW := "redis://:" + secret + "@" + srv.Addr() + "/0"
	for _, e := range []*env{pwEnv, newEnv(t, withPW)} {
		out := filepath.Join(dir, "env")
		expect(t, e.run("run", "a", "--", "sh", "-c", `env > "$0"`, out), 0)
		data, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(data), secret) {
			t.Errorf("the command's environment holds the password:\n%s", data)
		}
		if !strings.Contains(string(data), "DLOCK_NAME=a\n") || !strings.Contains(string(data), "DLOCK_FENCE=") {
			t.Errorf("the command's environment lacks DLOCK_NAME or DLOCK_FENCE:\n%s", data)
		}
	}
	// A DLOCK_BACKEND without a password is passed on.
	out := filepath.Join(dir, "env2")
	expect(t, pwEnv.run("run", "a", "--", "sh", "-c", `env > "$0"`, out), 0)
	if data, _ := os.ReadFile(out); !strings.Contains(string(data), "DLOCK_BACKEND="+plain+"\n") {
		t.Errorf("a DLOCK_BACKEND without a password was not passed on:\n%s", data)
	}

	// Bad input: a clear error, exit 64, no password echoed.
	for _, tc := range []struct {
		env  *env
		args []string
		want string
	}{
		{newEnv(t, plain), []string{"--password-file", filepath.Join(dir, "missing"), "run", "a", "--", "true"}, "--password-file"},
		{newEnv(t, plain), []string{"--password-file", emptyFile(t), "run", "a", "--", "true"}, "empty"},
		{newEnv(t, withPW), []string{"--password-file", file, "run", "a", "--", "true"}, "give it once"},
		{newEnv(t, ""), []string{"--password-file", file, "run", "a", "--", "true"}, "no password"},
	} {
		r := tc.env.run(tc.args...)
		if r.code != 64 || !strings.Contains(r.stderr, tc.want) || strings.Contains(r.stderr, secret) {
			t.Errorf("%q: exit %d, stderr %q; want 64 and %q, without the password", tc.args, r.code, r.stderr, tc.want)
		}
	}
}

func emptyFile(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPasswordExposureWarned: a --password-file every user can read, and a
// password in --backend (visible in ps), are warned of once on stderr, and
// the command still runs.
func TestPasswordExposureWarned(t *testing.T) {
	t.Parallel()
	backend, _ := redisURL(t)
	file := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(file, []byte("secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(file, 0o644); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, backend)
	r := e.run("--password-file", file, "ls")
	expect(t, r, 0, "is readable by every user of this host (mode 0644)")
	if err := os.Chmod(file, 0o600); err != nil {
		t.Fatal(err)
	}
	if r := e.run("--password-file", file, "ls"); r.code != 0 || strings.Contains(r.stderr, "warning") {
		t.Errorf("a private --password-file: exit %d:\n%s", r.code, r.stderr)
	}
	withPW := strings.Replace(backend, "redis://", "redis://:secret@", 1)
	r = newEnv(t, "").run("--backend", withPW, "ls")
	expect(t, r, 0, "the password in --backend is visible to other users of this host (ps); give it in DLOCK_PASSWORD or a --password-file")
	if n := strings.Count(r.stderr, "warning"); n != 1 || strings.Contains(r.stderr, "secret") {
		t.Errorf("want one warning, without the password:\n%s", r.stderr)
	}
}

// TestRedisUserWithoutPasswordRefused: go-redis signs a user in only with a
// password, so a Redis URL that names a user and no password would connect
// as the default user: dlock refuses it with exit 64 before connecting, and
// takes the password from DLOCK_PASSWORD or --password-file as for any URL.
func TestRedisUserWithoutPasswordRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ url, want string }{
		{"redis://bob@127.0.0.1:1/0", `names the Redis user "bob" but no password`},
		{"rediss://bob@127.0.0.1:1/0", `names the Redis user "bob" but no password`},
		{"redis+cluster://bob@127.0.0.1:1,127.0.0.1:2", `names the Redis user "bob" but no password`},
		{"redis+sentinel://bob@127.0.0.1:1/main", `names the Redis user "bob" but no password`},
		{"redis+sentinel://127.0.0.1:1/main?sentinel_username=sam", `names the sentinels' user "sam" (sentinel_username) but no sentinel_password`},
		{"redlock://bob@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", `names the Redis user "bob" but no password`},
	} {
		r := newEnv(t, tc.url).run("run", "a", "--", "true")
		expect(t, r, 64, tc.want)
		// With a password from the environment the URL is used: nothing
		// listens there, so the connection fails (exit 69), past the check.
		r = newEnv(t, tc.url, "DLOCK_PASSWORD=pw").run("--connect-timeout", "2s", "run", "a", "--", "true")
		if strings.Contains(tc.url, "sentinel_username") {
			expect(t, r, 64, "no sentinel_password")
			continue
		}
		if r.code != 69 || strings.Contains(r.stderr, "no password") {
			t.Errorf("%s with DLOCK_PASSWORD: exit %d, want 69 (no server):\n%s", tc.url, r.code, r.stderr)
		}
	}
}
