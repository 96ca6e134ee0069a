package sqllock_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/sqllock"
)

// newToken returns an owner token as the dlock client makes them.
func newToken() string {
	return hex.EncodeToString([]byte(rand.Text())[:16])
}

func acquire(t *testing.T, b driver.Backend, req driver.AcquireRequest) driver.AcquireResult {
	t.Helper()
	res, err := b.Acquire(t.Context(), req)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", req.Key, err)
	}
	return res
}

func mustAcquire(t *testing.T, b driver.Backend, req driver.AcquireRequest) driver.AcquireResult {
	t.Helper()
	res := acquire(t, b, req)
	if !res.Acquired {
		t.Fatalf("Acquire(%q) = %+v, want acquired", req.Key, res)
	}
	return res
}

func release(t *testing.T, b driver.Backend, key, token string) driver.ReleaseResult {
	t.Helper()
	res, err := b.Release(t.Context(), key, token)
	if err != nil {
		t.Fatalf("Release(%q): %v", key, err)
	}
	return res
}

func renew(t *testing.T, b driver.Backend, key, token string, ttl time.Duration) bool {
	t.Helper()
	held, err := b.Renew(t.Context(), key, token, ttl)
	if err != nil {
		t.Fatalf("Renew(%q): %v", key, err)
	}
	return held
}

func inspect(t *testing.T, b *sqllock.Backend, key string) (driver.LockInfo, bool) {
	t.Helper()
	info, ok, err := b.Inspect(t.Context(), key)
	if err != nil {
		t.Fatalf("Inspect(%q): %v", key, err)
	}
	return info, ok
}

// near reports whether d is within (want-slack, want].
func near(d, want, slack time.Duration) bool { return d > want-slack && d <= want }

func testFirstGrant(t *testing.T, newDB newDatabase) {
	b := newDB(t).backend(t)
	tok := newToken()
	res := mustAcquire(t, b, driver.AcquireRequest{Key: "orders:42", Token: tok, Owner: "host-a|pid 1", TTL: 10 * time.Second})
	if res.Fence != 1 || res.Holds != 1 {
		t.Errorf("first grant: fence %d, holds %d; want 1, 1", res.Fence, res.Holds)
	}
	info, ok := inspect(t, b, "orders:42")
	if !ok {
		t.Fatal("Inspect: not held after a grant")
	}
	if info.Key != "orders:42" || info.Owner != "host-a|pid 1" || info.Fence != 1 || info.Holds != 1 {
		t.Errorf("Inspect = %+v", info)
	}
	if !near(info.TTL, 10*time.Second, 2*time.Second) {
		t.Errorf("TTL = %v, want about 10s", info.TTL)
	}
	if info.HeldFor < 0 || info.HeldFor > 2*time.Second {
		t.Errorf("HeldFor = %v, want under 2s", info.HeldFor)
	}

	// Released: the row stays free, with its fence; the next grant draws 2.
	if got := release(t, b, "orders:42", tok); got != (driver.ReleaseResult{Held: true, Remaining: 0}) {
		t.Errorf("Release = %+v, want held with 0 remaining", got)
	}
	if _, ok := inspect(t, b, "orders:42"); ok {
		t.Error("Inspect: still held after the release")
	}
	if got := release(t, b, "orders:42", tok); got.Held {
		t.Errorf("second Release = %+v, want not held", got)
	}
	if res := mustAcquire(t, b, driver.AcquireRequest{Key: "orders:42", Token: newToken(), Owner: "b", TTL: time.Second}); res.Fence != 2 {
		t.Errorf("grant after release: fence %d, want 2", res.Fence)
	}
}

func testReentry(t *testing.T, newDB newDatabase) {
	b := newDB(t).backend(t)
	tok := newToken()
	req := driver.AcquireRequest{Key: "k", Token: tok, Owner: "o", TTL: 10 * time.Second, Reentrant: true}
	first := mustAcquire(t, b, req)
	if first.Holds != 1 {
		t.Errorf("first reentrant grant: %d holds, want 1", first.Holds)
	}
	req.TTL = time.Second // shorter: the lease keeps its 10s
	second := mustAcquire(t, b, req)
	if second.Holds != 2 || second.Fence != first.Fence {
		t.Errorf("re-entry = %+v, want holds 2 and fence %d", second, first.Fence)
	}
	if info, _ := inspect(t, b, "k"); info.Holds != 2 || !near(info.TTL, 10*time.Second, 2*time.Second) {
		t.Errorf("after re-entry with a shorter TTL: %+v, want 2 holds and about 10s", info)
	}
	// Without Reentrant, the same token is refused and sees itself as holder.
	req.Reentrant = false
	if res := acquire(t, b, req); res.Acquired || res.Holder != "o" {
		t.Errorf("non-reentrant acquire by the holder's token = %+v, want refused naming o", res)
	}
	if got := release(t, b, "k", tok); got != (driver.ReleaseResult{Held: true, Remaining: 1}) {
		t.Errorf("first release = %+v, want 1 remaining", got)
	}
	if !renew(t, b, "k", tok, time.Minute) {
		t.Error("renew refused while one hold remains")
	}
	if got := release(t, b, "k", tok); got != (driver.ReleaseResult{Held: true, Remaining: 0}) {
		t.Errorf("last release = %+v, want 0 remaining", got)
	}
	if renew(t, b, "k", tok, time.Minute) {
		t.Error("renew accepted after the last release")
	}
	// The same token grants anew: a new fence.
	req.Reentrant = true
	if res := mustAcquire(t, b, req); res.Fence != first.Fence+1 || res.Holds != 1 {
		t.Errorf("grant after the last release = %+v, want fence %d and 1 hold", res, first.Fence+1)
	}
}

func testHeldByAnother(t *testing.T, newDB newDatabase) {
	b := newDB(t).backend(t)
	mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: newToken(), Owner: "alice", TTL: 10 * time.Second})
	for _, reentrant := range []bool{false, true} {
		res := acquire(t, b, driver.AcquireRequest{Key: "k", Token: newToken(), Owner: "bob", TTL: time.Second, Reentrant: reentrant})
		if res.Acquired || res.Holder != "alice" || !near(res.HolderTTL, 10*time.Second, 2*time.Second) {
			t.Errorf("reentrant=%v: %+v, want refused naming alice with about 10s left", reentrant, res)
		}
	}
	if res := release(t, b, "k", newToken()); res.Held {
		t.Errorf("Release by a stranger = %+v", res)
	}
	if renew(t, b, "k", newToken(), time.Minute) {
		t.Error("Renew by a stranger accepted")
	}
	if info, ok := inspect(t, b, "k"); !ok || info.Owner != "alice" {
		t.Errorf("after a stranger's calls: %+v, %v", info, ok)
	}
}

func testExpiredRowTakenOver(t *testing.T, newDB newDatabase) {
	b := newDB(t).backend(t)
	old := newToken()
	first := mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: old, Owner: "a", TTL: 50 * time.Millisecond, Reentrant: true})
	time.Sleep(100 * time.Millisecond)
	if _, ok := inspect(t, b, "k"); ok {
		t.Error("Inspect shows an expired lock as held")
	}
	if renew(t, b, "k", old, time.Minute) {
		t.Error("Renew revived an expired lease")
	}
	// Even the old token's re-entry is a new grant once the lease expired.
	if res := mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: old, Owner: "a", TTL: 50 * time.Millisecond, Reentrant: true}); res.Fence != first.Fence+1 || res.Holds != 1 {
		t.Errorf("re-entry after expiry = %+v, want a new grant with fence %d", res, first.Fence+1)
	}
	time.Sleep(100 * time.Millisecond)
	second := mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: newToken(), Owner: "b", TTL: time.Minute})
	if second.Fence != first.Fence+2 {
		t.Errorf("grant over an expired row: fence %d, want %d", second.Fence, first.Fence+2)
	}
	if res := release(t, b, "k", old); res.Held {
		t.Errorf("Release by the expired holder = %+v, want not held", res)
	}
}

func testRenewNeverShortens(t *testing.T, newDB newDatabase) {
	b := newDB(t).backend(t)
	tok := newToken()
	mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: tok, Owner: "o", TTL: 10 * time.Second})
	if !renew(t, b, "k", tok, time.Second) {
		t.Fatal("Renew with a shorter TTL refused: a renewal that changes nothing still holds")
	}
	if info, _ := inspect(t, b, "k"); !near(info.TTL, 10*time.Second, 2*time.Second) {
		t.Errorf("TTL after a shorter renewal = %v, want about 10s", info.TTL)
	}
	if !renew(t, b, "k", tok, time.Minute) {
		t.Fatal("Renew refused")
	}
	if info, _ := inspect(t, b, "k"); !near(info.TTL, time.Minute, 2*time.Second) {
		t.Errorf("TTL after a longer renewal = %v, want about 1m", info.TTL)
	}
}

func testRenewBatch(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	b := db.backend(t)
	pool, statements := db.counting(t)
	counted := sqllock.New(pool, db.dialect)
	a, c := newToken(), newToken()
	mustAcquire(t, b, driver.AcquireRequest{Key: "a", Token: a, Owner: "o", TTL: time.Second, Reentrant: true})
	mustAcquire(t, b, driver.AcquireRequest{Key: "a", Token: a, Owner: "o", TTL: time.Second, Reentrant: true})
	mustAcquire(t, b, driver.AcquireRequest{Key: "c", Token: c, Owner: "o", TTL: time.Second})
	if err := counted.CreateTable(t.Context()); err != nil {
		t.Fatal(err)
	}

	// Every lease held: one statement.
	reqs := []driver.RenewRequest{
		{Key: "a", Token: a, TTL: 20 * time.Second},
		{Key: "c", Token: c, TTL: 20 * time.Second},
		{Key: "a", Token: a, TTL: 30 * time.Second}, // the other hold of a: the longest TTL wins
	}
	statements.Store(0)
	got := counted.RenewBatch(t.Context(), reqs)
	if n := statements.Load(); n != 1 {
		t.Errorf("RenewBatch of %d held leases ran %d statements, want 1", len(reqs), n)
	}
	for i, r := range got {
		if !r.Held || r.Err != nil {
			t.Errorf("result %d = %+v, want held", i, r)
		}
	}
	if info, _ := inspect(t, b, "a"); !near(info.TTL, 30*time.Second, 2*time.Second) {
		t.Errorf("TTL of a = %v, want about 30s (the longest of its requests)", info.TTL)
	}

	// Some not held: results in order, and still one statement where the
	// dialect can tell rows apart.
	reqs = []driver.RenewRequest{
		{Key: "x", Token: newToken(), TTL: time.Minute}, // never locked
		{Key: "c", Token: c, TTL: time.Minute},
		{Key: "a", Token: c, TTL: time.Minute}, // the wrong token
		{Key: "a", Token: a, TTL: time.Minute},
		{Key: strings.Repeat("k", 300), Token: a, TTL: time.Minute}, // invalid
	}
	statements.Store(0)
	got = counted.RenewBatch(t.Context(), reqs)
	want := []bool{false, true, false, true, false}
	for i, r := range got {
		if r.Held != want[i] {
			t.Errorf("result %d (%q) = %+v, want held %v", i, reqs[i].Key, r, want[i])
		}
		if (r.Err != nil) != (i == 4) {
			t.Errorf("result %d error = %v", i, r.Err)
		}
	}
	// SQLite's batch statement cannot say which of the others are shared
	// holds: a second one looks.
	perBatch := map[sqllock.Dialect]int64{sqllock.PostgreSQL: 1, sqllock.SQLite: 2}[db.dialect]
	if n := statements.Load(); db.dialect != sqllock.MySQL && n != perBatch {
		t.Errorf("RenewBatch ran %d statements, want %d", n, perBatch)
	}
	t.Logf("%v: a batch with some leases not held ran %d statements", db.dialect, statements.Load())

	// Large batches are split into statements of 500.
	many := make([]driver.RenewRequest, 1201)
	for i := range many {
		many[i] = driver.RenewRequest{Key: fmt.Sprintf("many/%d", i), Token: a, TTL: time.Minute}
	}
	many[1200] = driver.RenewRequest{Key: "c", Token: c, TTL: time.Minute}
	statements.Store(0)
	got = counted.RenewBatch(t.Context(), many)
	if !got[1200].Held || got[0].Held || got[0].Err != nil {
		t.Errorf("large batch: first %+v, last %+v", got[0], got[1200])
	}
	if n := statements.Load(); db.dialect != sqllock.MySQL && n != 3*perBatch {
		t.Errorf("RenewBatch of 1201 leases ran %d statements, want %d", n, 3*perBatch)
	}
}

// testRenewBatchFallback checks MySQL's way of telling which leases of a
// batch were held: one UPDATE, then, when it did not renew them all, one
// SELECT of the leases that hold their lock.
func testRenewBatchFallback(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	b := db.backend(t)
	pool, statements := db.counting(t)
	counted := sqllock.New(pool, db.dialect)
	tok := newToken()
	mustAcquire(t, b, driver.AcquireRequest{Key: "held", Token: tok, Owner: "o", TTL: time.Minute})
	if err := counted.CreateTable(t.Context()); err != nil {
		t.Fatal(err)
	}
	reqs := []driver.RenewRequest{
		{Key: "held", Token: tok, TTL: time.Minute},
		{Key: "gone", Token: tok, TTL: time.Minute},
		{Key: "held", Token: newToken(), TTL: time.Minute},
	}
	statements.Store(0)
	got := counted.RenewBatch(t.Context(), reqs)
	if !got[0].Held || got[1].Held || got[2].Held {
		t.Errorf("results = %+v, want only the first held", got)
	}
	if n := statements.Load(); n != 2 {
		t.Errorf("%d statements, want 2: the batch, then one SELECT", n)
	}
	// A renewal that moves no expiry (shorter TTL) is held all the same.
	statements.Store(0)
	got = counted.RenewBatch(t.Context(), []driver.RenewRequest{{Key: "held", Token: tok, TTL: time.Second}})
	if !got[0].Held || got[0].Err != nil {
		t.Errorf("shorter renewal in a batch = %+v, want held", got[0])
	}
	if n := statements.Load(); n != 2 {
		t.Errorf("%d statements, want 2 (the batch changed no row, so one SELECT checks)", n)
	}
}

// testExactNames checks that names compare byte for byte: no case folding,
// no trailing-space padding, no Unicode normalisation.
func testExactNames(t *testing.T, newDB newDatabase) {
	b := newDB(t).backend(t)
	names := []string{"a", "A", "a ", "é", "e\u0301", "%", "_", "a%", strings.Repeat("x", sqllock.MaxKeyLength)}
	for _, name := range names {
		mustAcquire(t, b, driver.AcquireRequest{Key: name, Token: newToken(), Owner: name, TTL: time.Minute})
	}
	infos, err := b.List(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != len(names) {
		t.Fatalf("List = %d locks, want %d: names that differ must not collide", len(infos), len(names))
	}
	for _, name := range names {
		if info, ok := inspect(t, b, name); !ok || info.Owner != name {
			t.Errorf("Inspect(%q) = %+v, %v", name, info, ok)
		}
	}
	long := strings.Repeat("x", sqllock.MaxKeyLength+1)
	if _, err := b.Acquire(t.Context(), driver.AcquireRequest{Key: long, Token: newToken(), Owner: "o", TTL: time.Minute}); err == nil {
		t.Error("Acquire of a 256-byte key succeeded")
	}
}

func testInspector(t *testing.T, newDB newDatabase) {
	b := newDB(t).backend(t)
	tok := newToken()
	req := driver.AcquireRequest{Key: "job", Token: tok, Owner: "worker-1", TTL: time.Minute, Reentrant: true}
	first := mustAcquire(t, b, req)
	mustAcquire(t, b, req)
	time.Sleep(20 * time.Millisecond)
	info, ok, err := b.ForceRelease(t.Context(), "job")
	if err != nil || !ok {
		t.Fatalf("ForceRelease = %v, %v", ok, err)
	}
	if info.Key != "job" || info.Owner != "worker-1" || info.Fence != first.Fence || info.Holds != 2 ||
		!near(info.TTL, time.Minute, 2*time.Second) || info.HeldFor < 20*time.Millisecond {
		t.Errorf("ForceRelease returned %+v", info)
	}
	if _, ok, err := b.ForceRelease(t.Context(), "job"); ok || err != nil {
		t.Errorf("second ForceRelease = %v, %v; want not held", ok, err)
	}
	if renew(t, b, "job", tok, time.Minute) {
		t.Error("the holder renewed after ForceRelease")
	}
	if res := release(t, b, "job", tok); res.Held {
		t.Errorf("the holder released after ForceRelease: %+v", res)
	}
	if res := mustAcquire(t, b, driver.AcquireRequest{Key: "job", Token: newToken(), Owner: "worker-2", TTL: time.Minute}); res.Fence != first.Fence+1 {
		t.Errorf("grant after ForceRelease: fence %d, want %d", res.Fence, first.Fence+1)
	}
}

func testListPrefix(t *testing.T, newDB newDatabase) {
	b := newDB(t).backend(t)
	free := newToken()
	for _, name := range []string{"app/a", "app/b", "app%x", "app_x", "App/c", "apq", "other", "app/free"} {
		tok := newToken()
		if name == "app/free" {
			tok = free
		}
		mustAcquire(t, b, driver.AcquireRequest{Key: name, Token: tok, Owner: "o", TTL: time.Minute})
	}
	release(t, b, "app/free", free)
	for prefix, want := range map[string]string{
		"app/": "app/a app/b",
		"app%": "app%x",
		"app_": "app_x",
		"app":  "app%x app/a app/b app_x",
		"A":    "App/c",
		"zzz":  "",
	} {
		infos, err := b.List(t.Context(), prefix)
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, info := range infos {
			keys = append(keys, info.Key)
		}
		if got := strings.Join(keys, " "); got != want {
			t.Errorf("List(%q) = %q, want %q", prefix, got, want)
		}
	}
}

func testTables(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	ctx := t.Context()

	// A missing table is an error with WithoutCreateTable...
	bare := db.backend(t, sqllock.WithTable("mine"), sqllock.WithoutCreateTable())
	if _, err := bare.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: newToken(), Owner: "o", TTL: time.Second}); err == nil {
		t.Fatal("Acquire without the table succeeded")
	}
	// ...until a DBA creates it with DDL.
	ddl, err := sqllock.DDL(db.dialect, "mine")
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range strings.Split(ddl, ";\n\n") {
		db.exec(t, stmt)
	}
	mustAcquire(t, bare, driver.AcquireRequest{Key: "k", Token: newToken(), Owner: "o", TTL: time.Second})

	// By default the table is created on first use, and creating it again
	// is harmless.
	auto := db.backend(t, sqllock.WithTable("theirs"))
	mustAcquire(t, auto, driver.AcquireRequest{Key: "k", Token: newToken(), Owner: "o", TTL: time.Second})
	if err := auto.CreateTable(ctx); err != nil {
		t.Errorf("CreateTable on an existing table: %v", err)
	}
	// Tables are separate stores: k is held in both.
	if res := acquire(t, auto, driver.AcquireRequest{Key: "k", Token: newToken(), Owner: "o", TTL: time.Second}); res.Acquired {
		t.Error("k acquired twice in one table")
	}

	for _, bad := range []string{"", "1x", "a-b", "a.b.c", `x"; DROP TABLE t; --`, strings.Repeat("x", 64)} {
		b := db.backend(t, sqllock.WithTable(bad))
		if _, err := b.Acquire(ctx, driver.AcquireRequest{Key: "k", Token: newToken(), Owner: "o", TTL: time.Second}); err == nil {
			t.Errorf("WithTable(%q): Acquire succeeded", bad)
		}
		if _, err := sqllock.DDL(db.dialect, bad); err == nil {
			t.Errorf("DDL(%q) succeeded", bad)
		}
	}
	if _, err := sqllock.DDL(sqllock.Dialect(0), "t"); err == nil {
		t.Error("DDL of an unknown dialect succeeded")
	}
}

// testConcurrentFirstUse has many owners race for names nobody has used, so
// that the first-use path (on MySQL: UPDATE, SELECT, INSERT) meets itself.
func testConcurrentFirstUse(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	backends := []driver.Backend{db.backend(t), db.backend(t), db.backend(t), db.backend(t)}
	if err := backends[0].(*sqllock.Backend).CreateTable(t.Context()); err != nil {
		t.Fatal(err)
	}
	for round := range 10 {
		key := fmt.Sprintf("fresh/%d", round)
		var wg sync.WaitGroup
		results := make(chan driver.AcquireResult, 2*len(backends))
		errs := make(chan error, 2*len(backends))
		for i := range 2 * len(backends) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := backends[i%len(backends)].Acquire(t.Context(), driver.AcquireRequest{Key: key, Token: newToken(), Owner: fmt.Sprint(i), TTL: time.Minute})
				if err != nil {
					errs <- err
					return
				}
				results <- res
			}()
		}
		wg.Wait()
		close(results)
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		granted := 0
		for res := range results {
			if res.Acquired {
				granted++
				if res.Fence != 1 {
					t.Errorf("round %d: first grant has fence %d", round, res.Fence)
				}
			}
		}
		if granted != 1 {
			t.Errorf("round %d: %d grants of a fresh name, want 1", round, granted)
		}
	}
}

// testMySQLAnswersPerStatement runs every statement on one connection, whose
// session keeps the LAST_INSERT_ID of earlier statements: a statement that
// matched no row must still read as "no", not as the session's old value.
func testMySQLAnswersPerStatement(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	pool := db.open(t)
	pool.SetMaxOpenConns(1)
	b := sqllock.New(pool, db.dialect)
	tok := newToken()
	mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: tok, Owner: "o", TTL: time.Minute})
	if renew(t, b, "k", newToken(), time.Minute) {
		t.Error("Renew by a stranger after a grant on the same connection: held")
	}
	if res := release(t, b, "k", newToken()); res.Held {
		t.Errorf("Release by a stranger after a grant on the same connection: %+v", res)
	}
	if res := acquire(t, b, driver.AcquireRequest{Key: "k", Token: newToken(), Owner: "p", TTL: time.Minute}); res.Acquired || res.Holder != "o" {
		t.Errorf("Acquire of a held lock after a grant on the same connection: %+v", res)
	}
	if !renew(t, b, "k", tok, time.Minute) {
		t.Error("the holder's Renew refused")
	}
}

// testFairPollAnsweredAfterCtxEnds checks that a fair waiter's poll whose
// context ends while its statement is on the way is still answered, as the
// fair transaction is (Acquire waits up to 200ms for the answer): the poll
// read and wrote nothing, and an error would make the caller count the
// attempt's outcome as unknown (a reentrant or owner-ID handle then marks a
// hold that does not exist as uncertain).
func testFairPollAnsweredAfterCtxEnds(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	other := db.backend(t)
	pool := db.open(t)
	pool.SetMaxOpenConns(1)
	b := sqllock.New(pool, db.dialect)
	mustAcquire(t, other, writeReq("k", "h", time.Minute))
	w := waiting(fair(writeReq("k", "w", time.Minute)), time.Minute)
	if res := refused(t, b, w); !res.Queued || res.Position != 1 {
		t.Fatalf("fair request behind a holder = %+v, want queued first", res)
	}

	// The pool's one connection is taken: the poll's statement waits for
	// it, its context ends after 30ms, and the connection is free 30ms later.
	conn, err := pool.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(30 * time.Millisecond)
		cancel()
		time.Sleep(30 * time.Millisecond)
		_ = conn.Close()
	}()
	res, err := b.Acquire(ctx, w)
	<-done
	if err != nil || !res.Queued || res.Position != 1 || res.Holder != "h" {
		t.Fatalf("the waiter's poll, its context ended on the way = %+v, %v; want queued first behind h", res, err)
	}
}

// TestMixedStressOnOneNameKeepsOneHolderPostgres has several Clients, each
// with a pool of its own (woken or polling Backends), race on one name with
// fair Locks and TryLocks (whose first request is the one-UPDATE take on
// PostgreSQL), plain Mutexes, RWMutex readers and a Semaphore, with 1 s
// TTLs and contexts cancelled at random. A hold counts while it is surely
// live: it ended before its request's start plus the TTL (no renewal
// needed). No two such holds overlap unless both are shared; an exclusive
// grant's fence is above that of every exclusive hold that ended before its
// request began; and after the Clients close, nothing is held or queued.
// stressFor is how long each stress run of the PostgreSQL one-name tests
// lasts.
var stressFor = flag.Duration("stress.duration", 4*time.Second, "how long each run of TestMixedStressOnOneName* and TestFairGrantsNeverPassALiveWaiter* lasts")

// mixedClients returns n Clients on e, each with a pool of its own, half
// of them woken (NewPostgres) and half polling (New).
func mixedClients(t *testing.T, e lateEngine, n int) []*dlock.Client {
	t.Helper()
	cs := make([]*dlock.Client, n)
	for i := range cs {
		db := e.open(t, nil)
		var b driver.Backend = sqllock.New(db, e.dialect)
		if i%2 == 0 {
			b = sqllock.NewPostgres(db)
		}
		cs[i] = dlock.New(b)
	}
	return cs
}

func TestMixedStressOnOneNameKeepsOneHolderPostgres(t *testing.T) {
	e := postgresLate(t)
	const (
		ttl     = time.Second
		clients = 6
		workers = 3 // per Client
	)
	run := *stressFor
	cs := mixedClients(t, e, clients)
	closed := false
	closeAll := func() {
		if closed {
			return
		}
		closed = true
		for _, c := range cs {
			_ = c.Close()
		}
	}
	t.Cleanup(closeAll)

	type hold struct {
		id         int
		exclusive  bool
		fence      uint64
		start, got time.Time
		what       string
	}
	var (
		mu        sync.Mutex
		active    = map[int]*hold{}
		ended     []*hold // exclusive holds that ended while surely live
		nextID    int
		grants    = map[string]int{}
		failures  = map[string]int{}
		violation []string
	)
	enter := func(h *hold) {
		mu.Lock()
		defer mu.Unlock()
		nextID++
		h.id = nextID
		now := time.Now()
		if !now.Before(h.start.Add(ttl)) {
			return
		}
		for _, o := range active {
			if !now.Before(o.start.Add(ttl)) {
				continue // no longer surely live
			}
			if h.exclusive || o.exclusive {
				violation = append(violation, fmt.Sprintf("%s (fence %d, sent %v) granted at %v while %s (fence %d, sent %v, granted %v) holds",
					h.what, h.fence, h.start.Format("05.000"), h.got.Format("05.000"), o.what, o.fence, o.start.Format("05.000"), o.got.Format("05.000")))
			}
		}
		if h.exclusive {
			for _, o := range ended {
				if !o.got.After(h.start) && o.fence >= h.fence {
					violation = append(violation, fmt.Sprintf("%s: fence %d not above %d of %s, which ended before it was sent", h.what, h.fence, o.fence, o.what))
				}
			}
		}
		active[h.id] = h
		grants[h.what]++
	}
	leave := func(h *hold) {
		mu.Lock()
		defer mu.Unlock()
		if h.id == 0 {
			return
		}
		delete(active, h.id)
		if time.Since(h.start) >= ttl {
			// No longer surely live: a renewal may have failed. Forget
			// the overlaps it may have had (checked at entry only).
			return
		}
		if h.exclusive {
			h.got = time.Now() // its end: every later request comes after it
			ended = append(ended, h)
		}
	}

	stop := time.Now().Add(run)
	var wg sync.WaitGroup
	for ci, c := range cs {
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := mrand.New(mrand.NewPCG(uint64(ci), uint64(w)))
				for time.Now().Before(stop) {
					kind := rng.IntN(8)
					ctx, cancel := context.WithTimeout(t.Context(), time.Duration(rng.IntN(800)+50)*time.Millisecond)
					var l *dlock.Lease
					var err error
					h := &hold{exclusive: true, start: time.Now()}
					opts := []dlock.Option{dlock.WithTTL(ttl), dlock.WithWait(time.Duration(rng.IntN(600)) * time.Millisecond)}
					switch kind {
					case 0, 1:
						h.what = "fair Lock"
						l, err = c.Mutex("k", append(opts, dlock.Fair())...).Lock(ctx)
					case 2, 3:
						h.what = "fair TryLock"
						l, err = c.Mutex("k", append(opts, dlock.Fair())...).TryLock(ctx)
					case 4:
						h.what = "Mutex Lock"
						l, err = c.Mutex("k", opts...).Lock(ctx)
					case 5:
						h.what = "Mutex TryLock"
						l, err = c.Mutex("k", opts...).TryLock(ctx)
					case 6:
						h.what, h.exclusive = "RLock", false
						l, err = c.RWMutex("k", opts...).RLock(ctx)
					case 7:
						h.what, h.exclusive = "Semaphore", false
						l, err = c.Semaphore("k", 2, opts...).Acquire(ctx)
					}
					if err != nil {
						mu.Lock()
						failures[h.what]++
						mu.Unlock()
						cancel()
						continue
					}
					h.got, h.fence = time.Now(), l.Fence()
					if time.Since(h.start) < ttl-200*time.Millisecond {
						enter(h)
						time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
						leave(h)
					}
					uctx := context.Background()
					if rng.IntN(4) == 0 {
						uctx = ctx // sometimes the caller's, which may have ended
					}
					_ = l.Unlock(uctx)
					cancel()
				}
			}()
		}
	}
	wg.Wait()
	closeAll()
	t.Logf("grants %v, failures %v", grants, failures)
	for i, v := range violation {
		if i == 20 {
			t.Errorf("... %d more", len(violation)-20)
			break
		}
		t.Error(v)
	}

	// Nothing is left held, queued, claimed or intended (live).
	db := e.open(t, nil)
	var held, shared, queued, marks int
	if err := db.QueryRowContext(t.Context(), `SELECT
  (SELECT count(*) FROM dlock_locks WHERE token IS NOT NULL AND expires_at > now()),
  (SELECT count(*) FROM dlock_locks_shared WHERE expires_at > now()),
  (SELECT count(*) FROM dlock_locks_queue WHERE expires_at > now()),
  (SELECT count(*) FROM dlock_locks WHERE (intent_token IS NOT NULL AND intent_until > now()) OR (claim_token IS NOT NULL AND claim_until > now()))`).Scan(&held, &shared, &queued, &marks); err != nil {
		t.Fatal(err)
	}
	if held+shared+queued+marks > 0 {
		t.Errorf("after every Client closed: %d exclusive holds, %d shared holds, %d queue entries, %d intents or claims live", held, shared, queued, marks)
		var row string
		if err := db.QueryRowContext(t.Context(), `SELECT row_to_json(m)::text || ' now ' || now()::text || ' gone ' ||
  COALESCE((SELECT json_agg(g)::text FROM dlock_locks_gone g), '')  FROM dlock_locks m`).Scan(&row); err != nil {
			t.Fatal(err)
		}
		t.Log(row)
	}
}

// TestFairGrantsNeverPassALiveWaiterPostgres has several Clients race on
// one name with fair Locks and TryLocks (on PostgreSQL a first request is
// the one-UPDATE take; the others go through the transaction), RWMutex
// readers and a Semaphore, with 1 s TTLs and contexts cancelled at random.
// A trigger on the name's row checks every grant of the one-UPDATE take
// as it is made, with the latest committed state: no live queue entry of
// another token, whose clean-up is not recorded, is there (the grantee has
// none). Only fair requests take the name exclusively, so every grant must
// keep that order.
func TestFairGrantsNeverPassALiveWaiterPostgres(t *testing.T) {
	e := postgresLate(t)
	const (
		ttl     = time.Second
		clients = 10
		workers = 1 // per Client: few waiters, so that the take meets a free name
	)
	run := *stressFor
	admin := e.open(t, nil)
	if err := sqllock.New(admin, e.dialect).CreateTable(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE passed (at timestamptz, token text, fence bigint, waiter text, seq bigint, left_us bigint, own bigint, query text)`,
		`CREATE TABLE takes (at timestamptz)`,
		`CREATE FUNCTION check_fifo() RETURNS trigger LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  IF current_query() NOT LIKE '%fence = fence + 1, holds = 1%' THEN
    RETURN NULL; -- the transaction's grant, which deletes the grantee's entry in the same statement
  END IF;
  INSERT INTO takes VALUES (clock_timestamp());
  INSERT INTO passed
  SELECT clock_timestamp(), NEW.token, NEW.fence, o.token, o.seq,
    (extract(epoch FROM o.expires_at - clock_timestamp()) * 1000000)::bigint,
    (SELECT seq FROM dlock_locks_queue WHERE name = NEW.name AND token = NEW.token),
    regexp_replace(left(current_query(), 90), '\s+', ' ', 'g')
  FROM dlock_locks_queue o
  WHERE o.name = NEW.name AND o.token <> NEW.token
    AND o.expires_at > clock_timestamp() + interval '100 milliseconds'
    AND NOT EXISTS (SELECT FROM dlock_locks_gone g WHERE g.name = o.name AND g.token = o.token)
    AND o.seq < COALESCE((SELECT seq FROM dlock_locks_queue WHERE name = NEW.name AND token = NEW.token), 9223372036854775807);
  RETURN NULL;
END $$`,
		`CREATE TRIGGER check_fifo AFTER UPDATE ON dlock_locks FOR EACH ROW
  WHEN (NEW.token IS NOT NULL AND NEW.token IS DISTINCT FROM OLD.token) EXECUTE FUNCTION check_fifo()`,
	} {
		if _, err := admin.ExecContext(t.Context(), q); err != nil {
			t.Fatal(err)
		}
	}

	cs := mixedClients(t, e, clients)
	defer func() {
		for _, c := range cs {
			_ = c.Close()
		}
	}()
	stop := time.Now().Add(run)
	var wg sync.WaitGroup
	var mu sync.Mutex
	grants := map[string]int{}
	for ci, c := range cs {
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := mrand.New(mrand.NewPCG(uint64(ci), uint64(w)+100))
				for time.Now().Before(stop) {
					ctx, cancel := context.WithTimeout(t.Context(), time.Duration(rng.IntN(800)+50)*time.Millisecond)
					opts := []dlock.Option{dlock.WithTTL(ttl), dlock.WithWait(time.Duration(rng.IntN(600)) * time.Millisecond)}
					var l *dlock.Lease
					var err error
					what := ""
					time.Sleep(time.Duration(rng.IntN(100)) * time.Millisecond)
					switch rng.IntN(10) {
					case 0, 1, 2:
						what = "fair Lock"
						l, err = c.Mutex("k", append(opts, dlock.Fair())...).Lock(ctx)
					case 3, 4, 5, 6:
						what = "fair TryLock"
						l, err = c.Mutex("k", append(opts, dlock.Fair())...).TryLock(ctx)
					case 7, 8:
						what = "RLock"
						l, err = c.RWMutex("k", opts...).RLock(ctx)
					case 9:
						what = "Semaphore"
						l, err = c.Semaphore("k", 2, opts...).Acquire(ctx)
					}
					if err == nil {
						mu.Lock()
						grants[what]++
						mu.Unlock()
						time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
						_ = l.Unlock(context.Background())
					}
					cancel()
				}
			}()
		}
	}
	wg.Wait()
	var takes int
	if err := admin.QueryRowContext(t.Context(), `SELECT count(*) FROM takes`).Scan(&takes); err != nil {
		t.Fatal(err)
	}
	t.Logf("grants %v, of which %d by the one-UPDATE take", grants, takes)
	if takes == 0 {
		t.Log("no grant by the one-UPDATE take: its order went unchecked")
	}
	rows, err := admin.QueryContext(t.Context(), `SELECT at::text, token, fence, waiter, seq, left_us, COALESCE(own, -1), query FROM passed ORDER BY at`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var at, token, waiter string
		var fence, seq, left, own int64
		var query string
		if err := rows.Scan(&at, &token, &fence, &waiter, &seq, &left, &own, &query); err != nil {
			t.Fatal(err)
		}
		t.Errorf("at %s %s (its entry's seq %d; -1: none) was granted (fence %d) past the live waiter %s (seq %d, %d µs left) by %q", at, token, own, fence, waiter, seq, left, query)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}
