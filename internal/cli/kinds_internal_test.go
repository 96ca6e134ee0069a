package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// TestParseKind: --fair, --shared and --semaphore N set the kind, --fair
// makes a reader or a permit fair, and the combinations that make no sense
// are usage errors.
func TestParseKind(t *testing.T) {
	a := &app{connectTimeout: defaultConnectTimeout}
	good := []struct {
		args    []string
		kind    lockKind
		fair    bool
		permits int
		flags   string // kindFlags
	}{
		{[]string{"x", "--", "true"}, lockExclusive, false, 0, ""},
		{[]string{"--fair", "x", "--", "true"}, lockFair, true, 0, "--fair"},
		{[]string{"x", "--shared", "--", "true"}, lockShared, false, 0, "--shared"},
		{[]string{"--semaphore", "3", "x", "--", "true"}, lockSemaphore, false, 3, "--semaphore"},
		{[]string{"--semaphore=1", "x", "--", "true"}, lockSemaphore, false, 1, "--semaphore"},
		{[]string{"--fair", "--lock-delay", "1s", "x", "--", "true"}, lockFair, true, 0, "--fair"},
		{[]string{"--fair", "--shared", "x", "--", "true"}, lockShared, true, 0, "--fair --shared"},
		{[]string{"--shared", "--fair", "x", "--", "true"}, lockShared, true, 0, "--fair --shared"},
		{[]string{"--semaphore", "2", "--fair", "x", "--", "true"}, lockSemaphore, true, 2, "--fair --semaphore"},
	}
	for _, c := range good {
		o, err := parseRunArgs(a, c.args)
		if err != nil || o.kind != c.kind || o.fair != c.fair || o.permits != c.permits || o.kindFlags() != c.flags {
			t.Errorf("run %q: kind %v, fair %v, permits %d, flags %q, %v; want %v, %v, %d, %q",
				c.args, o.kind, o.fair, o.permits, o.kindFlags(), err, c.kind, c.fair, c.permits, c.flags)
		}
	}
	bad := []struct {
		args []string
		want string
	}{
		{[]string{"--shared", "--semaphore", "2", "x", "--", "true"}, "--shared and --semaphore exclude each other"},
		{[]string{"--fair", "--shared", "--semaphore", "2", "x", "--", "true"}, "--shared and --semaphore exclude each other"},
		{[]string{"--fair", "--semaphore", "0", "x", "--", "true"}, "--semaphore 0: want the number of permits"},
		{[]string{"--fair", "--shared", "--lock-delay", "1s", "x", "--", "true"}, "--lock-delay does not apply to --fair --shared: only exclusive locks (a plain run, or --fair alone)"},
		{[]string{"--semaphore", "2", "--fair", "--lock-delay", "1s", "x", "--", "true"}, "--lock-delay does not apply to --fair --semaphore: only"},
		{[]string{"--semaphore", "0", "x", "--", "true"}, "--semaphore 0: want the number of permits, from 1 to 1048576"},
		{[]string{"--semaphore", "-2", "x", "--", "true"}, "--semaphore -2: want the number of permits"},
		{[]string{"--semaphore", "1048577", "x", "--", "true"}, "--semaphore 1048577: want"},
		{[]string{"--semaphore", "many", "x", "--", "true"}, `--semaphore "many": want a whole number`},
		{[]string{"--shared", "--lock-delay", "1s", "x", "--", "true"}, "--lock-delay does not apply to --shared"},
		{[]string{"--semaphore", "2", "--lock-delay", "1s", "x", "--", "true"}, "--lock-delay does not apply to --semaphore"},
	}
	for _, c := range bad {
		_, err := parseRunArgs(a, c.args)
		ee, ok := err.(*exitError)
		if !ok || ee.code != exitUsage || ee.usage != "run" || !strings.Contains(ee.msg, c.want) {
			t.Errorf("run %q: %v, want a usage error with %q", c.args, err, c.want)
		}
	}
}

// TestKindEnv: DLOCK_KIND names each kind, DLOCK_FAIR=1 marks a fair run,
// and both replace values inherited from the environment.
func TestKindEnv(t *testing.T) {
	for kind, want := range map[lockKind]string{lockExclusive: "exclusive", lockFair: "fair", lockShared: "shared", lockSemaphore: "semaphore"} {
		if kind.String() != want {
			t.Errorf("%d.String() = %q, want %q", kind, kind.String(), want)
		}
	}
	env := childEnv([]string{"DLOCK_KIND=stale", "DLOCK_FAIR=1", "DLOCK_KINDNESS=kept", "DLOCK_FAIRNESS=kept", "HOME=/h"}, nil, lockShared, false)
	got := strings.Join(env, " ")
	if strings.Contains(got, "stale") || strings.Contains(got, "DLOCK_FAIR=") || !strings.Contains(got, "DLOCK_KINDNESS=kept") ||
		!strings.Contains(got, "DLOCK_FAIRNESS=kept") || !strings.HasSuffix(got, "DLOCK_KIND=shared") {
		t.Errorf("childEnv of a plain reader = %q", env)
	}
	env = childEnv([]string{"DLOCK_FAIR=stale", "HOME=/h"}, nil, lockSemaphore, true)
	got = strings.Join(env, " ")
	if strings.Contains(got, "stale") || !strings.HasSuffix(got, "DLOCK_KIND=semaphore DLOCK_FAIR=1") {
		t.Errorf("childEnv of a fair permit = %q", env)
	}
}

// TestWaitMessages: the waiting line and the final message describe each
// kind of refusal.
func TestWaitMessages(t *testing.T) {
	owner := "web1|pid 7|2026-11-21T10:00:03Z|nightly"
	cases := []struct {
		name    string
		kind    lockKind
		fair    bool
		permits int
		e       dlock.NotObtainedError
		line    string // describe, first message, --wait 30s
		final   string // notObtainedErr with --wait 0
	}{
		{"exclusive holder", lockExclusive, false, 0,
			dlock.NotObtainedError{Holder: owner, HolderTTL: 8 * time.Second},
			`"x" is held by ` + owner + ` (held for \S+, expires in 8.0s); waiting up to 30s`,
			`"x" is held by ` + owner + ` \(held for \S+, expires in 8.0s\); not waiting \(--wait 0\)`},
		{"writer waiting", lockShared, false, 0,
			dlock.NotObtainedError{Holder: owner, HolderTTL: 4 * time.Second, WriterWaiting: true},
			`"x": a writer is waiting (owner ` + owner + `), and readers let it go first; waiting up to 30s`,
			`"x": a writer is waiting \(owner ` + owner + `\), and readers let it go first; not waiting \(--wait 0\)`},
		{"writer waiting, semaphore", lockSemaphore, false, 5,
			dlock.NotObtainedError{Holder: owner, HolderTTL: 4 * time.Second, WriterWaiting: true},
			`"x": a writer is waiting (owner ` + owner + `), and permit holders let it go first; waiting up to 30s`,
			`"x": a writer is waiting \(owner ` + owner + `\), and permit holders let it go first; not waiting \(--wait 0\)`},
		{"permits", lockSemaphore, false, 5,
			dlock.NotObtainedError{Holder: owner, HolderTTL: 3 * time.Second, Shared: 5, Permits: 5},
			`"x": 5 of 5 permits in use (next expires in 3.0s); waiting up to 30s`,
			`"x": 5 of 5 permits in use \(next expires in 3.0s\); not waiting \(--wait 0\)`},
		{"readers", lockExclusive, false, 0,
			dlock.NotObtainedError{Holder: owner, HolderTTL: 9 * time.Second, Shared: 2},
			`"x": 2 readers hold it (the last expires in 9.0s); waiting up to 30s`,
			`"x": 2 readers hold it \(the last expires in 9.0s\); not waiting \(--wait 0\)`},
		{"one reader", lockExclusive, false, 0,
			dlock.NotObtainedError{Holder: owner, HolderTTL: 9 * time.Second, Shared: 1},
			`"x": 1 reader holds it (the last expires in 9.0s); waiting up to 30s`,
			`"x": 1 reader holds it`},
		{"fair queue", lockFair, true, 0,
			dlock.NotObtainedError{Holder: owner, HolderTTL: 8 * time.Second, Position: 3},
			`"x" is held by ` + owner + ` (held for \S+, expires in 8.0s); 3rd in the queue; waiting up to 30s`,
			`"x" is held by ` + owner},
		{"fair, free, queue ahead", lockFair, true, 0,
			dlock.NotObtainedError{Position: 2},
			`"x" is free, but others are queued for it (a fair lock goes to them first); 2nd in the queue; waiting up to 30s`,
			`"x" is free, but others are queued for it \(a fair lock goes to them first\); not waiting \(--wait 0\)`},
		{"fair reader, readers and a queue ahead", lockShared, true, 0,
			dlock.NotObtainedError{Holder: owner, HolderTTL: 9 * time.Second, Shared: 2, Position: 2},
			`"x": 2 readers hold it (the last expires in 9.0s), and others are queued ahead (a fair lock goes to them first); 2nd in the queue; waiting up to 30s`,
			`"x": 2 readers hold it \(the last expires in 9.0s\), and others are queued ahead \(a fair lock goes to them first\); not waiting \(--wait 0\)`},
		{"fair permit, a permit free and a queue ahead", lockSemaphore, true, 3,
			dlock.NotObtainedError{Holder: owner, HolderTTL: 3 * time.Second, Shared: 2, Permits: 3, Position: 1},
			`"x": 2 of 3 permits in use (next expires in 3.0s), and others are queued ahead (a fair lock goes to them first); 1st in the queue; waiting up to 30s`,
			`"x": 2 of 3 permits in use \(next expires in 3.0s\), and others are queued ahead`},
		{"fair permit, every permit in use", lockSemaphore, true, 2,
			dlock.NotObtainedError{Holder: owner, HolderTTL: 3 * time.Second, Shared: 2, Permits: 2, Position: 1},
			`"x": 2 of 2 permits in use (next expires in 3.0s); 1st in the queue; waiting up to 30s`,
			`"x": 2 of 2 permits in use \(next expires in 3.0s\); not waiting \(--wait 0\)`},
		{"fair permit, free, queue ahead", lockSemaphore, true, 2,
			dlock.NotObtainedError{Position: 3},
			`"x" is free, but others are queued for it (a fair lock goes to them first); 3rd in the queue; waiting up to 30s`,
			`"x" is free, but others are queued for it \(a fair lock goes to them first\); not waiting \(--wait 0\)`},
		{"fair reader, a writer holds it", lockShared, true, 0,
			dlock.NotObtainedError{Holder: owner, HolderTTL: 8 * time.Second, Position: 2},
			`"x" is held by ` + owner + ` (held for \S+, expires in 8.0s); 2nd in the queue; waiting up to 30s`,
			`"x" is held by ` + owner},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := &runOptions{name: "x", kind: c.kind, fair: c.fair, permits: c.permits, wait: 30 * time.Second, conflictCode: exitNotObtained}
			r := &waitReporter{name: o.name, kind: o.kind, fair: o.fair, permits: o.permits, wait: o.wait}
			e := c.e
			e.Name = "x"
			line := r.describe(&e, false, false)
			want := regexp.QuoteMeta(c.line)
			want = strings.ReplaceAll(want, `\\S\+`, `\S+`)
			if !regexp.MustCompile("^" + want + "$").MatchString(line) {
				t.Errorf("describe = %q\nwant %q", line, c.line)
			}
			o.wait = 0
			msg := notObtainedErr(&store{where: "test"}, o, &e).msg
			if !regexp.MustCompile("^" + c.final).MatchString(msg) {
				t.Errorf("final message = %q\nwant %q", msg, c.final)
			}
		})
	}
	// A change is announced with "now", and only when what is in the way
	// changes: not for another shared hold expiring last.
	r := &waitReporter{name: "x", kind: lockExclusive, wait: waitForever}
	e := &dlock.NotObtainedError{Name: "x", Holder: owner, HolderTTL: time.Second, Shared: 1}
	if got := r.describe(e, true, false); got != `"x": now 1 reader holds it (the last expires in 1.0s); still waiting` {
		t.Errorf("describe after a change = %q", got)
	}
	same := *e
	same.Holder = "other"
	if waitState(e) != waitState(&same) {
		t.Error("a new last-expiring reader counts as a change")
	}
	fewer := *e
	fewer.Shared = 2
	if waitState(e) == waitState(&fewer) {
		t.Error("a new number of readers is not a change")
	}
	// A plain waiter that dlock queued so that it is not starved shows no
	// place; a fair one does, and a new place alone is no new holder.
	held := &dlock.NotObtainedError{Name: "x", Holder: owner, HolderTTL: time.Second, Position: 1}
	if got := r.describe(held, false, false); strings.Contains(got, "queue") {
		t.Errorf("a plain waiter's message shows a place: %q", got)
	}
	if r.place(held) != 0 {
		t.Error("a plain waiter's place counts as a change")
	}
	fair := &waitReporter{name: "x", kind: lockFair, fair: true, wait: waitForever}
	moved := *held
	moved.Position = 2
	if fair.place(held) == fair.place(&moved) {
		t.Error("a fair waiter's new place is not a change")
	}
	got := fair.describe(&moved, false, true)
	if strings.Contains(got, "now held") || !strings.Contains(got, "; now 2nd in the queue; still waiting") {
		t.Errorf("describe after a new place = %q, want the same holder and \"now 2nd in the queue\"", got)
	}
}

func TestOrdinal(t *testing.T) {
	for n, want := range map[int]string{1: "1st", 2: "2nd", 3: "3rd", 4: "4th", 11: "11th", 12: "12th", 13: "13th", 21: "21st", 22: "22nd", 101: "101st", 111: "111th"} {
		if got := ordinal(n); got != want {
			t.Errorf("ordinal(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestTableKinds: the SHARED and WAITING columns appear only when a lock
// has shared holds or waiters; a lock held only by readers shows "-" in the
// holder's columns; inspect lists each shared holder.
func TestTableKinds(t *testing.T) {
	now := time.Now()
	plain := driver.LockInfo{Key: "plain", Owner: "a|pid 1|x", Fence: 4, Holds: 1, TTL: 8 * time.Second, HeldFor: 2 * time.Second}
	var b bytes.Buffer
	writeTable(&b, []driver.LockInfo{plain}, now)
	if want := "NAME   OWNER      FENCE  HELD FOR  EXPIRES IN  HOLDS\nplain  a|pid 1|x  4      2.0s      8.0s        1\n"; b.String() != want {
		t.Errorf("plain table:\n%s\nwant:\n%s", b.String(), want)
	}

	readers := driver.LockInfo{Key: "reports", WriterWaiting: true, Shared: []driver.SharedHold{
		{Owner: "r1|pid 2|x", Fence: 5, TTL: 9 * time.Second},
		{Owner: "r2|pid 3|x", Fence: 6, TTL: 7 * time.Second},
	}}
	pool := driver.LockInfo{Key: "pool", Limit: 5, Queued: 2, Shared: []driver.SharedHold{
		{Owner: "p1|pid 4|x", Fence: 9, TTL: 6 * time.Second},
	}}
	fair := plain
	fair.Key, fair.Queued = "fair", 3
	b.Reset()
	writeTable(&b, []driver.LockInfo{fair, plain, pool, readers}, now)
	want := `NAME     OWNER      FENCE  HELD FOR  EXPIRES IN  HOLDS  SHARED       WAITING
fair     a|pid 1|x  4      2.0s      8.0s        1      -            3 queued
plain    a|pid 1|x  4      2.0s      8.0s        1      -            -
pool     -          -      -         -           -      1/5 permits  2 queued
reports  -          -      -         -           -      2 readers    writer
`
	if b.String() != want {
		t.Errorf("table with kinds:\n%s\nwant:\n%s", b.String(), want)
	}

	b.Reset()
	writeSharedTable(&b, readers, now)
	want = `READER      FENCE  HELD FOR  EXPIRES IN
r1|pid 2|x  5      -         9.0s
r2|pid 3|x  6      -         7.0s
`
	if b.String() != want {
		t.Errorf("readers:\n%s\nwant:\n%s", b.String(), want)
	}
	b.Reset()
	writeSharedTable(&b, pool, now)
	if !strings.HasPrefix(b.String(), "PERMIT HOLDER  FENCE") {
		t.Errorf("permit holders:\n%s", b.String())
	}

	j := toJSON(pool, now)
	if len(j.Shared) != 1 || j.Shared[0].Fence != 9 || j.Shared[0].ExpiresInMS != 6000 || j.Limit == nil || *j.Limit != 5 || j.Queued != 2 || j.Owner != nil || j.Fence != nil || j.ExpiresInMS != nil || j.HeldForMS != nil {
		t.Errorf("toJSON(pool) = %+v", j)
	}
	if j := toJSON(plain, now); j.Shared == nil || len(j.Shared) != 0 || j.Limit != nil {
		t.Errorf("toJSON(plain).Shared = %#v, Limit %v; want [] and null", j.Shared, j.Limit)
	}
}

// TestParseOwner: an owner string dlock wrote comes apart into its parts,
// the metadata whole even with '|' in it; others give null.
func TestParseOwner(t *testing.T) {
	o := parseOwner("web-1|pid 4242 client 3|2026-11-21T10:00:03Z|a|b")
	if o == nil || o.Host != "web-1" || o.PID != 4242 || o.Client != 3 || o.AcquiredAt != "2026-11-21T10:00:03Z" || o.Metadata == nil || *o.Metadata != "a|b" {
		t.Errorf("parseOwner = %+v", o)
	}
	o = parseOwner("web-1|pid 4242|proc:3fa2c1d0:8812345|2026-11-21T10:00:03Z|a|b")
	if o == nil || o.PID != 4242 || o.AcquiredAt != "2026-11-21T10:00:03Z" || o.Metadata == nil || *o.Metadata != "a|b" {
		t.Errorf("parseOwner with a process tag = %+v", o)
	}
	o = parseOwner("web-1|pid 7|2026-11-21T10:00:03Z")
	if o == nil || o.Client != 1 || o.Metadata != nil {
		t.Errorf("parseOwner without metadata = %+v", o)
	}
	for _, s := range []string{"", "someone else", "h|pid x|2026-11-21T10:00:03Z", "h|pid 1|yesterday", "h|process 1|2026-11-21T10:00:03Z", "h|pid 1|proc:xyz|2026-11-21T10:00:03Z"} {
		if o := parseOwner(s); o != nil {
			t.Errorf("parseOwner(%q) = %+v, want nil", s, o)
		}
	}
}

// TestReadOnlyHint: SQLite's "readonly database" error is explained with the
// files' modes and owners and what to change; other errors get no hint.
func TestReadOnlyHint(t *testing.T) {
	path := filepath.Join(t.TempDir(), "locks.db")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	hint := readOnlyHint(path, "attempt to write a readonly database (8)")
	for _, want := range []string{path + " (-rw-r--r-- ", "chmod 2775 DIR", "chmod g+w"} {
		if !strings.Contains(hint, want) {
			t.Errorf("hint %q lacks %q", hint, want)
		}
	}
	if h := readOnlyHint(path, "database is locked"); h != "" {
		t.Errorf("hint for another error: %q", h)
	}
}
