package testserver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// killTimeout bounds one KillSessions call: the query that lists the
// sessions, the kills, and the wait until they are gone.
const killTimeout = 10 * time.Second

// KillSessions ends every client session connected to database, as an
// operator's KILL CONNECTION would, and returns how many it ended: the
// clients see their connections closed, mid-statement or idle, and must
// reconnect. The session KillSessions itself uses is left alone, and so is
// the server. It returns once the killed sessions are gone from the process
// list, and fails the test when it cannot list or kill them (a session that
// ended on its own meanwhile is not an error).
func (m *MariaDB) KillSessions(t testing.TB, database string) int {
	t.Helper()
	n, err := m.killSessions(database)
	if err != nil {
		t.Fatalf("mariadb %s: kill the sessions of %q: %v", m.Addr(), database, err)
	}
	return n
}

func (m *MariaDB) killSessions(database string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
	defer cancel()
	db, err := sql.Open("mysql", m.DSN(""))
	if err != nil {
		return 0, err
	}
	defer db.Close()
	// One connection for everything, so that CONNECTION_ID() is the
	// session that must not kill itself.
	conn, err := db.Conn(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ids, err := queryIDs(ctx, conn,
		"SELECT ID FROM information_schema.PROCESSLIST WHERE DB = ? AND ID <> CONNECTION_ID()", database)
	if err != nil {
		return 0, fmt.Errorf("list sessions: %w", err)
	}
	killed := 0
	for _, id := range ids {
		_, err := conn.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id))
		var me *mysql.MySQLError
		switch {
		case err == nil:
			killed++
		case errors.As(err, &me) && me.Number == 1094: // ER_NO_SUCH_THREAD: it ended by itself
		default:
			return killed, fmt.Errorf("kill session %d: %w", id, err)
		}
	}
	// KILL only marks the session; wait until its thread has gone.
	if len(ids) == 0 {
		return 0, nil
	}
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	query := "SELECT ID FROM information_schema.PROCESSLIST WHERE ID IN (?" + strings.Repeat(", ?", len(ids)-1) + ")"
	return killed, waitGone(ctx, conn, query, args...)
}

// KillSessions ends every client session connected to database with
// pg_terminate_backend, as an operator would, and returns how many it ended:
// the clients see their connections closed, mid-statement or idle, and must
// reconnect; a session inside a transaction has it rolled back. The session
// KillSessions itself uses is left alone, and so are the server's own
// processes (autovacuum and the like). It returns once the ended sessions
// have exited, and fails the test when it cannot end them (a session that
// ended on its own meanwhile is not an error).
func (p *Postgres) KillSessions(t testing.TB, database string) int {
	t.Helper()
	n, err := p.killSessions(database)
	if err != nil {
		t.Fatalf("postgres %s: kill the sessions of %q: %v", p.Addr(), database, err)
	}
	return n
}

func (p *Postgres) killSessions(database string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
	defer cancel()
	db, err := sql.Open("pgx", p.URL(""))
	if err != nil {
		return 0, err
	}
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	// First the list, then the kills: within one statement the server
	// may call pg_terminate_backend before it has checked the other
	// conditions, on this session too.
	ids, err := queryIDs(ctx, conn, `
		SELECT pid FROM pg_stat_activity
		WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend'`,
		database)
	if err != nil {
		return 0, fmt.Errorf("list sessions: %w", err)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	// pg_terminate_backend signals the backend and returns; false means
	// there was no such backend any more. (With a timeout it would wait
	// for each backend in turn, polling every 100ms.)
	killed, err := queryIDs(ctx, conn, "SELECT pid FROM unnest($1::int[]) AS pid WHERE pg_terminate_backend(pid)", ids)
	if err != nil {
		return 0, fmt.Errorf("terminate sessions: %w", err)
	}
	if len(killed) == 0 {
		return 0, nil
	}
	return len(killed), waitGone(ctx, conn, "SELECT pid FROM pg_stat_activity WHERE pid = ANY($1)", killed)
}

// waitGone runs query, which lists the sessions killed that are still
// there, until it lists none or ctx ends.
func waitGone(ctx context.Context, conn *sql.Conn, query string, args ...any) error {
	for {
		left, err := queryIDs(ctx, conn, query, args...)
		if err != nil {
			return fmt.Errorf("wait for the killed sessions to end: %w", err)
		}
		if len(left) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sessions %v still there %v after they were killed", left, killTimeout)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// queryIDs runs a query that returns one integer column.
func queryIDs(ctx context.Context, conn *sql.Conn, query string, args ...any) ([]int64, error) {
	rows, err := conn.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	slices.Sort(ids)
	return ids, nil
}
