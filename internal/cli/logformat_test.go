package cli_test

import (
	"encoding/json"
	"strings"
	"testing"
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
