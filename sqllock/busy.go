// Running a SQLite statement again after SQLITE_BUSY or SQLITE_LOCKED.

package sqllock

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// Backoff between attempts of a SQLite statement that found the file
// locked.
const (
	minBusyDelay = time.Millisecond
	maxBusyDelay = 50 * time.Millisecond
)

// retryBusy runs op, and on SQLite runs it again, after a short jittered
// backoff, for as long as it fails with SQLITE_BUSY or SQLITE_LOCKED and
// ctx lasts; the last error is returned when ctx ends. On MySQL and
// PostgreSQL it runs op once.
//
// busy_timeout does not cover every wait: SQLite returns SQLITE_BUSY at once,
// without calling the busy handler, when waiting could deadlock (a
// connection that reads and wants to write while another waits to commit,
// as when several processes switch a fresh file to WAL together), and in WAL
// mode when a write finds its read snapshot stale (SQLITE_BUSY_SNAPSHOT).
// Such a statement has changed nothing, so running it again is safe: a
// write that fails with SQLITE_BUSY is rolled back whole.
//
// On every engine, a transaction that the server chose as a deadlock's
// victim (MySQL 1213, PostgreSQL 40P01, 40001) was rolled back whole and
// is run again, a few times: the server asks for exactly that.
func retryBusy[T any](ctx context.Context, d Dialect, op func() (T, error)) (T, error) {
	res, err := op()
	for i := 0; i < maxDeadlockRetries && err != nil && deadlocked(err) && ctx.Err() == nil; i++ {
		t := time.NewTimer(time.Duration(1+rand.N(5)) * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return res, err
		case <-t.C:
		}
		res, err = op()
	}
	if d != SQLite {
		return res, err
	}
	delay := minBusyDelay
	for err != nil && isBusy(err) && ctx.Err() == nil {
		// Uniform in [delay/2, delay): processes that collided spread out.
		t := time.NewTimer(delay/2 + rand.N(delay/2))
		select {
		case <-ctx.Done():
			t.Stop()
			return res, err
		case <-t.C:
		}
		delay = min(2*delay, maxBusyDelay)
		res, err = op()
	}
	return res, err
}

// maxDeadlockRetries bounds how often retryBusy runs a deadlock's victim
// again.
const maxDeadlockRetries = 5

// deadlocked reports whether err says the server rolled the transaction
// back to break a deadlock or a serialization conflict.
func deadlocked(err error) bool {
	if n, ok := mysqlNumber(err); ok {
		return n == 1213
	}
	if code, ok := sqlState(err); ok {
		return code == "40P01" || code == "40001"
	}
	return false
}

// isBusy reports whether err is SQLite's SQLITE_BUSY or SQLITE_LOCKED, with
// any extended code (SQLITE_BUSY_SNAPSHOT, SQLITE_BUSY_RECOVERY, ...).
// modernc.org/sqlite reports them as a *sqlite.Error whose Code method
// returns the extended result code, whose low byte is the primary one; the
// interface spares this package an import of the driver, which MySQL and
// PostgreSQL users would link for nothing.
func isBusy(err error) bool {
	const (
		sqliteBusy   = 5 // SQLITE_BUSY
		sqliteLocked = 6 // SQLITE_LOCKED
	)
	var coded interface{ Code() int }
	if !errors.As(err, &coded) {
		return false
	}
	switch coded.Code() & 0xff {
	case sqliteBusy, sqliteLocked:
		return true
	}
	return false
}

// retryGated is retryBusy for a lock operation of b: on a SQLiteBackend,
// each run of op holds the write gate (see writeGate), a holder's
// operation (urgent) before waiters', and the backoff after SQLITE_BUSY is
// spent out of it.
func retryGated[T any](ctx context.Context, b *Backend, urgent bool, op func() (T, error)) (T, error) {
	if b.gate == nil {
		return retryBusy(ctx, b.dialect, op)
	}
	return retryBusy(ctx, b.dialect, func() (T, error) {
		leave := b.gate.enter(ctx, urgent)
		defer leave()
		return op()
	})
}
