package sqllock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
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
