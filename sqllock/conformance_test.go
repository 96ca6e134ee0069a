package sqllock_test

import (
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

// heldRows returns a description of each row of key that has a token.
func heldRows(t *testing.T, db *database, key string) []string {
	t.Helper()
	rows, err := db.admin(t).QueryContext(t.Context(),
		"SELECT token, fence, holds FROM "+sqllock.DefaultTable+" WHERE name = "+placeholder(db.dialect)+" AND token IS NOT NULL", key)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var left []string
	for rows.Next() {
		var token string
		var fence, holds int64
		if err := rows.Scan(&token, &fence, &holds); err != nil {
			t.Fatal(err)
		}
		left = append(left, fmt.Sprintf("row %q: token %s, fence %d, %d holds", key, token, fence, holds))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return left
}

// placeholder is the dialect's first positional parameter.
func placeholder(d sqllock.Dialect) string {
	if d == sqllock.PostgreSQL {
		return "$1"
	}
	return "?"
}
