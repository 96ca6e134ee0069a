package sqllock_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/sqllock"
)

// testMySQLLocking checks the two InnoDB behaviours that the transactions
// of sqllock rely on under REPEATABLE READ: INSERT ... ON DUPLICATE KEY
// UPDATE that changes nothing still locks the existing row exclusively, and
// a transaction's snapshot is taken at its first consistent read, not at
// START TRANSACTION, so a read after the lock sees what was committed
// before it was granted.
func testMySQLLocking(t *testing.T, newDB newDatabase) {
	db := newDB(t)
	b := db.backend(t)
	tok := newToken()
	mustAcquire(t, b, driver.AcquireRequest{Key: "k", Token: tok, Owner: "o", TTL: time.Minute})
	release(t, b, "k", tok)
	ctx := t.Context()
	pool := db.open(t) // of this test alone: a session of it changes a variable
	const lock = `INSERT INTO dlock_locks (name, token, owner, fence, holds, acquired_at, expires_at)
VALUES ('k', NULL, '', 0, 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE fence = fence`

	tx, err := pool.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, lock); err != nil {
		t.Fatal(err)
	}

	// Another session commits a shared hold without the lock (nothing in
	// sqllock does; the test does, to see what the snapshot holds).
	other, err := pool.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.ExecContext(ctx, `INSERT INTO dlock_locks_shared (name, token, owner, fence, lim, acquired_at, expires_at)
VALUES ('k', 'x', 'o', 9, 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 60 SECOND)`); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM dlock_locks_shared WHERE name = 'k'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("the locked transaction's first read sees %d shared holds, want 1 committed before it", n)
	}

	// The row is locked: another session's update of it waits.
	if _, err := other.ExecContext(ctx, `SET SESSION innodb_lock_wait_timeout = 1`); err != nil {
		t.Fatal(err)
	}
	uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = other.ExecContext(uctx, `UPDATE dlock_locks SET fence = fence WHERE name = 'k'`)
	if err == nil || !strings.Contains(err.Error(), "1205") {
		t.Errorf("update of the row locked by ON DUPLICATE KEY UPDATE: %v, want a lock wait timeout (1205)", err)
	}
}

// TestFairTakeOfFreeNameDoesNotDeadlockWithQueueingTransaction: on MySQL a
// fair request's first statement (tplTakeFirst's UPDATE) must not hold
// locks in the queue table while it waits for the name's row: the
// transaction that holds the row inserts its token's entry there, and
// InnoDB would break the cycle by rolling one of them back (1213). Every
// transaction of sqllock locks the name's row before it touches the queue
// (see txs); MariaDB reads the UPDATE's lookups by primary key (the
// token's entry and clean-up record) as constant tables while it
// optimizes, with shared next-key locks under REPEATABLE READ, before the
// UPDATE locks the row. The transaction's INSERT is held until the UPDATE
// waits for the row.
func TestFairTakeOfFreeNameDoesNotDeadlockWithQueueingTransaction(t *testing.T) {
	e := mariadbLate(t)
	h := newHolder("")
	var letOnce sync.Once
	let := func() { letOnce.Do(func() { close(h.let) }) }
	joiner := sqllock.New(e.open(t, h), e.dialect)
	t.Cleanup(let)
	other := newLateClient(t, e, e.open(t, nil))
	taker := sqllock.New(e.open(t, nil), e.dialect)
	admin := e.open(t, nil)
	ctx := t.Context()

	held, err := other.Mutex("f", dlock.Fair(), dlock.WithTTL(30*time.Second), dlock.WithAutoRenew(false)).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(ctx)
	for _, b := range []*sqllock.Backend{joiner, taker} {
		if err := b.CreateTable(ctx); err != nil { // DDL would wait for the held transaction
			t.Fatal(err)
		}
	}
	deadlocks := func() int64 {
		var name string
		var n int64
		if err := admin.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'").Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := deadlocks()

	fairReq := func(token string) driver.AcquireRequest {
		return driver.AcquireRequest{Key: "f", Token: token, Owner: token, TTL: time.Minute,
			Fair: true, Wait: true, QueueTTL: time.Minute}
	}
	h.arm("INSERT INTO `dlock_locks_queue`") // tplEnqueue, with the row locked
	joined := make(chan answer, 1)
	go func() {
		res, err := joiner.Acquire(ctx, fairReq("b"))
		joined <- answer{res, err}
	}()
	select {
	case <-h.held:
	case a := <-joined:
		t.Fatalf("the joiner ended (%+v, %v) without its queue entry's INSERT", a.res, a.err)
	case <-time.After(10 * time.Second):
		t.Fatal("the joiner's INSERT was never written")
	}
	taken := make(chan answer, 1)
	go func() {
		res, err := taker.Acquire(ctx, fairReq("a"))
		taken <- answer{res, err}
	}()
	// The taker's first statement waits for the row that the joiner's
	// transaction holds (the joiner's session is idle, its INSERT held).
	for deadline := time.Now().Add(10 * time.Second); ; {
		var n int
		if err := admin.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.processlist
WHERE info LIKE '%dlock_locks%' AND info NOT LIKE '%processlist%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			time.Sleep(200 * time.Millisecond)
			break
		}
		if time.Now().After(deadline) {
			rows, _ := admin.QueryContext(ctx, "SELECT id, COALESCE(state,''), COALESCE(LEFT(info, 120),'') FROM information_schema.processlist")
			for rows.Next() {
				var id int
				var st, info string
				_ = rows.Scan(&id, &st, &info)
				t.Logf("session %d %s: %q", id, st, info)
			}
			rows.Close()
			t.Fatal("the taker's request never waited for the row")
		}
		time.Sleep(10 * time.Millisecond)
	}
	let()
	for _, c := range []chan answer{joined, taken} {
		select {
		case a := <-c:
			if a.err != nil || !a.res.Queued {
				t.Errorf("fair request behind a holder = %+v, %v; want queued", a.res, a.err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("a fair request did not return")
		}
	}
	if n := deadlocks() - before; n != 0 {
		var typ, name, status string
		_ = admin.QueryRowContext(ctx, "SHOW ENGINE INNODB STATUS").Scan(&typ, &name, &status)
		if i, j := strings.Index(status, "LATEST DETECTED DEADLOCK"), strings.Index(status, "\nTRANSACTIONS\n"); i >= 0 && j > i {
			t.Log(status[i:j])
		}
		t.Errorf("%d deadlocks between the fair request's UPDATE and the transaction that holds the row, want none", n)
	}
}
