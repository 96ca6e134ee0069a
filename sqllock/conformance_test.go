package sqllock_test

import (
	"database/sql"
	"fmt"
	"testing"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/locktest"
	"github.com/dlock-go/dlock/sqllock"
)

// conformance runs the locktest suite with a fresh database per case. Each
// Client gets a pool of its own, as separate processes would. Delete frees
// the row as ForceRelease does, keeping its fence.
func conformance(t *testing.T, newDB newDatabase) {
	locktest.Run(t, func(t *testing.T) *locktest.Store {
		db := newDB(t)
		admin := db.backend(t)
		if err := admin.CreateTable(t.Context()); err != nil {
			t.Fatal(err)
		}
		return &locktest.Store{
			NewBackend: func(t *testing.T) driver.Backend { return db.clientBackend(t) },
			Delete: func(t *testing.T, key string) {
				if _, ok, err := admin.ForceRelease(t.Context(), key); err != nil || !ok {
					t.Fatalf("ForceRelease(%q) = %v, %v; want a lock removed", key, ok, err)
				}
			},
			Leftovers: func(t *testing.T, key string) []string {
				return heldRows(t, db, key)
			},
			Kill: func(t *testing.T) { db.down(t) },
		}
	})
}

// heldRows returns a description of what the tables keep for key beyond
// the name's row with its fence: an exclusive holder's token (live or
// not), a writer's intent, a shared_until still ahead, and any row of the
// shared-hold and queue tables.
func heldRows(t *testing.T, db *database, key string) []string {
	t.Helper()
	p := placeholder(db.dialect)
	now := map[sqllock.Dialect]string{
		sqllock.SQLite:     "CAST(round(unixepoch('subsec') * 1000) AS INTEGER)",
		sqllock.MySQL:      "UTC_TIMESTAMP(6)",
		sqllock.PostgreSQL: "now()",
	}[db.dialect]
	var left []string
	query(t, db, "SELECT token, intent_token, shared_until > "+now+", fence FROM "+sqllock.DefaultTable+
		" WHERE name = "+p+" AND (token IS NOT NULL OR intent_token IS NOT NULL OR shared_until > "+now+")",
		func(rows *sql.Rows) error {
			var token, intent sql.NullString
			var shared sql.NullBool
			var fence int64
			if err := rows.Scan(&token, &intent, &shared, &fence); err != nil {
				return err
			}
			left = append(left, fmt.Sprintf("row %q: token %v, intent %v, shared_until ahead %v, fence %d", key, token, intent, shared, fence))
			return nil
		}, key)
	for _, table := range []string{sqllock.DefaultTable + "_shared", sqllock.DefaultTable + "_queue"} {
		query(t, db, "SELECT token FROM "+table+" WHERE name = "+p, func(rows *sql.Rows) error {
			var token string
			if err := rows.Scan(&token); err != nil {
				return err
			}
			left = append(left, fmt.Sprintf("%s row %q: token %s", table, key, token))
			return nil
		}, key)
	}
	return left
}

// query runs a query on an admin pool and calls fn for each row.
func query(t *testing.T, db *database, q string, fn func(*sql.Rows) error, args ...any) {
	t.Helper()
	// A pool of its own, closed at once: noLeftovers asks again and again
	// while it waits, and pools kept to the test's end would use up the
	// server's connections.
	pool, err := sql.Open(db.driverName, db.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rows, err := pool.QueryContext(t.Context(), q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows); err != nil {
			t.Fatal(err)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}

// placeholder is the dialect's first positional parameter.
func placeholder(d sqllock.Dialect) string {
	if d == sqllock.PostgreSQL {
		return "$1"
	}
	return "?"
}
