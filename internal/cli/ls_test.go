package cli_test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// lockJSON mirrors the documented fields of ls --json and inspect --json.
type lockJSON struct {
	Name        string     `json:"name"`
	Held        bool       `json:"held"`
	Owner       string     `json:"owner"`
	OwnerInfo   *ownerJSON `json:"owner_info"`
	Fence       uint64     `json:"fence"`
	Holds       int        `json:"holds"`
	HeldForMS   *int64     `json:"held_for_ms"`
	ExpiresInMS int64      `json:"expires_in_ms"`
}

// ownerJSON mirrors owner_info.
type ownerJSON struct {
	Host       string  `json:"host"`
	PID        int     `json:"pid"`
	Client     int     `json:"client"`
	AcquiredAt string  `json:"acquired_at"`
	Metadata   *string `json:"metadata"`
}

// TestListInspectRelease holds two locks and looks at them with ls and
// inspect, as a table and as JSON, then breaks one with release --force.
func TestListInspectRelease(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		dir := t.TempDir()
		e := newEnv(t, backend, "DIR="+dir)

		r := e.run("ls")
		if r.code != 0 || !strings.HasPrefix(r.stdout, "no locks held") { // "(no SQLite file at ...)" before the first run
			t.Errorf("ls with no locks: %d %q %q", r.code, r.stdout, r.stderr)
		}
		r = e.run("ls", "--json")
		if r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
			t.Errorf("ls --json with no locks: %d %q %q", r.code, r.stdout, r.stderr)
		}

		a := e.start("run", "--ttl", "6s", "--metadata", "job|42", "jobs:a", "--", "sh", "-c", `touch "$DIR/a"; sleep 30`)
		b := e.start("run", "--ttl", "6s", "other", "--", "sh", "-c", `touch "$DIR/b"; sleep 30`)
		waitExists(t, filepath.Join(dir, "a"), a)
		waitExists(t, filepath.Join(dir, "b"), b)
		ownerA := fmt.Sprintf("|pid %d|", a.cmd.Process.Pid)

		// The table: a header, then one aligned line per lock, sorted.
		r = e.run("ls")
		expect(t, r, 0)
		lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
		if len(lines) != 3 {
			t.Fatalf("ls printed %d lines, want 3:\n%s", len(lines), r.stdout)
		}
		header := regexp.MustCompile(`^NAME +OWNER +FENCE +HELD FOR +EXPIRES IN +HOLDS$`)
		if !header.MatchString(lines[0]) {
			t.Errorf("header %q", lines[0])
		}
		row := regexp.MustCompile(`^jobs:a +\S+\|pid \d+\|\S+\|job\|42 +1 +[\d.]+(ms|s) +[3-6]\.\ds +1$`)
		if !row.MatchString(lines[1]) || !strings.Contains(lines[1], ownerA) {
			t.Errorf("row %q does not match %v", lines[1], row)
		}
		if !strings.HasPrefix(lines[2], "other ") {
			t.Errorf("second row %q, want the lock \"other\"", lines[2])
		}
		if col := strings.Index(lines[0], "FENCE"); lines[1][col-2:col] != "  " || lines[2][col-2:col] != "  " {
			t.Errorf("columns are not aligned:\n%s", r.stdout)
		}

		// A prefix, and flags after it.
		r = e.run("ls", "jobs:", "--json")
		expect(t, r, 0)
		var locks []lockJSON
		if err := json.Unmarshal([]byte(r.stdout), &locks); err != nil {
			t.Fatalf("ls --json: %v\n%s", err, r.stdout)
		}
		if len(locks) != 1 {
			t.Fatalf("ls jobs: --json listed %d locks:\n%s", len(locks), r.stdout)
		}
		l := locks[0]
		if l.Name != "jobs:a" || !l.Held || !strings.Contains(l.Owner, ownerA) || !strings.HasSuffix(l.Owner, "|job|42") ||
			l.Fence != 1 || l.Holds != 1 || l.HeldForMS == nil || *l.HeldForMS < 0 || l.ExpiresInMS <= 3_000 || l.ExpiresInMS > 6_000 {
			t.Errorf("ls --json: %+v", l)
		}
		if o := l.OwnerInfo; o == nil || o.PID != a.cmd.Process.Pid || o.Client != 1 || o.Host == "" || o.AcquiredAt == "" || o.Metadata == nil || *o.Metadata != "job|42" {
			t.Errorf("ls --json: owner_info %+v, want pid %d and the metadata whole", o, a.cmd.Process.Pid)
		}
		for _, field := range []string{`"name"`, `"held"`, `"owner"`, `"owner_info"`, `"fence"`, `"holds"`, `"held_for_ms"`, `"expires_in_ms"`, `"limit": null`} {
			if !strings.Contains(r.stdout, field) {
				t.Errorf("ls --json lacks %s:\n%s", field, r.stdout)
			}
		}
		r = e.run("ls", "nothing-here")
		if r.code != 0 || r.stdout != "no locks held under \"nothing-here\"\n" {
			t.Errorf("ls nothing-here: %d %q", r.code, r.stdout)
		}

		// inspect: the same table for one lock; JSON; exit 1 when not held.
		r = e.run("inspect", "jobs:a")
		expect(t, r, 0)
		if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); len(lines) != 2 || !row.MatchString(lines[1]) {
			t.Errorf("inspect jobs:a:\n%s", r.stdout)
		}
		r = e.run("inspect", "--json", "jobs:a")
		expect(t, r, 0)
		var one lockJSON
		if err := json.Unmarshal([]byte(r.stdout), &one); err != nil || one.Name != "jobs:a" || !one.Held || one.Fence != 1 {
			t.Errorf("inspect --json: %v %+v\n%s", err, one, r.stdout)
		}
		r = e.run("inspect", "free")
		if r.code != 1 || r.stdout != "lock \"free\" is not held\n" {
			t.Errorf("inspect free: %d %q %q", r.code, r.stdout, r.stderr)
		}
		r = e.run("inspect", "free", "--json")
		if r.code != 1 || strings.Join(strings.Fields(r.stdout), "") != `{"name":"free","held":false}` {
			t.Errorf("inspect free --json: %d %q", r.code, r.stdout)
		}

		// release: refused without --force; with it, it says whose lock it
		// broke, and the holder's run stops its command and exits 76.
		r = e.run("release", "jobs:a")
		expect(t, r, 64, "without --force", "usage: dlock release --force NAME")
		r = e.run("release", "--force", "jobs:a")
		expect(t, r, 0)
		want := regexp.MustCompile(`^released "jobs:a", held by \S+\|pid \d+\|\S+\|job\|42 \(fence 1, held for [\d.]+m?s\)\n$`)
		if !want.MatchString(r.stdout) || !strings.Contains(r.stdout, ownerA) {
			t.Errorf("release --force printed %q", r.stdout)
		}
		expect(t, a.wait(), 76, `lost lock "jobs:a"`)
		r = e.run("release", "--force", "jobs:a")
		if r.code != 0 || r.stdout != "lock \"jobs:a\" was not held; nothing to release\n" {
			t.Errorf("second release --force: %d %q %q", r.code, r.stdout, r.stderr)
		}
		r = e.run("release", "--force", "--json", "jobs:a")
		if r.code != 0 || strings.Join(strings.Fields(r.stdout), "") != `{"name":"jobs:a","released":false,"lock":null}` {
			t.Errorf("release --force --json of a free lock: %d %q %q", r.code, r.stdout, r.stderr)
		}
		var rel struct {
			Name     string    `json:"name"`
			Released bool      `json:"released"`
			Lock     *lockJSON `json:"lock"`
		}
		r = e.run("release", "--force", "--json", "other")
		if err := json.Unmarshal([]byte(r.stdout), &rel); err != nil || r.code != 0 || !rel.Released || rel.Lock == nil ||
			rel.Lock.Name != "other" || rel.Lock.OwnerInfo == nil || rel.Lock.OwnerInfo.PID != b.cmd.Process.Pid || rel.Lock.OwnerInfo.Metadata != nil {
			t.Errorf("release --force --json other: %d %v %+v\n%s", r.code, err, rel, r.stdout)
		}
		expect(t, b.wait(), 76, `lost lock "other"`)
	})
}
