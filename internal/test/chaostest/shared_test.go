package chaostest

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"

	"github.com/dlock-go/dlock/internal/test/testserver"
)

// The MariaDB and PostgreSQL servers that the scenarios share: each SQL
// store gets a database of its own on them (sharedDatabase), as
// testserver's servers allow. Initialising and starting a server takes a
// second or more, several under load, and some forty subtests need one;
// the scenarios run one at a time, and what a scenario breaks (its
// sessions, its proxy) is its database's or its own. A store whose server
// the scenario stops, kills or restarts has a server of its own
// (storeOptions.OwnServer). The shared servers are stopped when TestMain
// ends (stopShared).
var shared struct {
	mu    sync.Mutex
	life  *life
	maria *testserver.MariaDB
	pg    *testserver.Postgres
	dbs   int // databases created, for their names
}

// sharedMariaDB returns the shared MariaDB server, started on first use.
func sharedMariaDB(t *testing.T) *testserver.MariaDB {
	t.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.maria == nil {
		shared.maria = startShared(t, testserver.StartMariaDB)
	}
	return shared.maria
}

// sharedPostgres returns the shared PostgreSQL server, started on first use.
func sharedPostgres(t *testing.T) *testserver.Postgres {
	t.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.pg == nil {
		shared.pg = startShared(t, testserver.StartPostgres)
	}
	return shared.pg
}

// sharedDatabase returns a new database name, unused on the shared servers.
func sharedDatabase() string {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	shared.dbs++
	return "chaos" + strconv.Itoa(shared.dbs)
}

// startShared starts a server with start for the package's lifetime, and
// fails (or skips) t as start would have: testserver skips only outside
// CI=true (a missing server fails the test under CI=true), and so does
// this. shared.mu is held.
func startShared[S any](t *testing.T, start func(testing.TB) S) S {
	t.Helper()
	if shared.life == nil {
		shared.life = &life{}
	}
	var srv S
	failed, skipped := shared.life.run(func(tb testing.TB) { srv = start(tb) })
	switch {
	case failed != "":
		t.Fatalf("shared server: %s", failed)
	case skipped != "":
		t.Skipf("%s", skipped)
	}
	return srv
}

// stopShared stops the shared servers and removes their directories.
func stopShared() {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.life != nil {
		shared.life.cleanup()
	}
	shared.life, shared.maria, shared.pg = nil, nil, nil
}

// life is the testing.TB of the shared servers: what they register for
// clean-up runs in stopShared, and a failure while starting one ends the
// goroutine that run started (its message goes to the test that asked).
// Other methods of testing.TB are not for it (the embedded nil TB panics).
type life struct {
	testing.TB
	mu              sync.Mutex
	cleanups        []func()
	failed, skipped string
}

// run calls fn with l in a goroutine of its own, waits for it, and returns
// the message of a failure or a skip.
func (l *life) run(fn func(testing.TB)) (failed, skipped string) {
	l.failed, l.skipped = "", ""
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(l)
	}()
	<-done
	return l.failed, l.skipped
}

func (l *life) Helper()      {}
func (l *life) Name() string { return "chaostest-shared" }

func (l *life) Cleanup(f func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cleanups = append(l.cleanups, f)
}

// cleanup runs the clean-ups, the last registered first.
func (l *life) cleanup() {
	l.mu.Lock()
	fs := l.cleanups
	l.cleanups = nil
	l.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

func (l *life) TempDir() string {
	dir, err := os.MkdirTemp("", "dlock-chaos-shared-")
	if err != nil {
		l.Fatalf("%v", err)
	}
	l.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func (l *life) Fatal(args ...any) { l.Fatalf("%s", fmt.Sprint(args...)) }

func (l *life) Fatalf(format string, args ...any) {
	l.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (l *life) Skipf(format string, args ...any) {
	l.skipped = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (l *life) Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "chaostest shared servers: "+format+"\n", args...)
}
