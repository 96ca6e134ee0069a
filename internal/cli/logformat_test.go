package cli_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/dlock-go/dlock/internal/test/testserver"
)

// TestLogFormatJSON: with --log-format json every message of dlock's own
// on stderr is one JSON object (time, level, msg), a failure carries its
// exit code and usage line, and what the command writes to its stderr
// passes through untouched.
func TestLogFormatJSON(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sqliteURL(t))
	r := e.run("--log-format", "json", "run", "-v", "job", "--", "sh", "-c", "echo from-the-command >&2")
	if r.code != 0 {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	var records, raw int
	for _, line := range strings.Split(strings.TrimSpace(r.stderr), "\n") {
		if line == "from-the-command" {
			raw++
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("stderr line %q is neither JSON nor the command's: %v", line, err)
		}
		if rec["level"] != "INFO" || rec["time"] == nil || strings.HasPrefix(rec["msg"].(string), "dlock:") {
			t.Errorf("record %v", rec)
		}
		records++
	}
	if raw != 1 || records == 0 {
		t.Errorf("%d lines of the command's own and %d records in %q", raw, records, r.stderr)
	}

	r = e.run("--log-format", "json", "run", "--ttl", "soon", "job", "--", "true")
	var rec map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.stderr)), &rec); err != nil || r.code != 64 {
		t.Fatalf("exit %d, stderr %q: want one JSON record and 64 (%v)", r.code, r.stderr, err)
	}
	if rec["level"] != "ERROR" || rec["exit"] != float64(64) || !strings.Contains(rec["msg"].(string), "--ttl") ||
		!strings.HasPrefix(rec["usage"].(string), "dlock run") {
		t.Errorf("record %v", rec)
	}

	r = e.run("--log-format", "yaml", "ls")
	if r.code != 64 || !strings.Contains(r.stderr, `--log-format "yaml": want text or json`) {
		t.Errorf("bad format: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestLogFormatCoversTheStoresWarnings: a warning of the store's library
// (a Redis whose maxmemory-policy the user may not read, as on managed
// services) is one of dlock's messages: "dlock: warning: ..." in text, a
// WARN record with --log-format json, not a line of Go's default logger.
func TestLogFormatCoversTheStoresWarnings(t *testing.T) {
	t.Parallel()
	rdb := testserver.StartRedis(t)
	if err := rdb.Client(t).Do(t.Context(), "ACL", "SETUSER", "app", "on", ">pw", "~dlock:*", "&dlock:*", "+@all", "-config").Err(); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, "redis://app@"+rdb.Addr()+"/0", "DLOCK_PASSWORD=pw")

	r := e.run("run", "x", "--", "true")
	expect(t, r, 0, "dlock: warning: redislock: cannot read Redis's maxmemory-policy")
	oneLine(t, r)

	r = e.run("--log-format", "json", "run", "x", "--", "true")
	expect(t, r, 0)
	var rec map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.stderr)), &rec); err != nil {
		t.Fatalf("stderr %q: want one JSON record (%v)", r.stderr, err)
	}
	if msg, _ := rec["msg"].(string); rec["level"] != "WARN" || !strings.Contains(msg, "maxmemory-policy") {
		t.Errorf("record %v", rec)
	}
}
