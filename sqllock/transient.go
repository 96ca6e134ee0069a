// Telling the database errors that may heal by themselves from the others.

package sqllock

import (
	"context"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"
	"syscall"

	"github.com/dlock-go/dlock/driver"
)

// transient reports whether err, a failure of one call of the Backend, may
// heal by itself (see driver.ErrTransient): a connection that dropped, was
// refused or timed out, a deadlock or serialization failure, a server that
// is shutting down, starting or full, one that turned read-only during a
// failover, a SQLite file locked by another writer. Credentials refused, a
// statement the database cannot run (a missing table or column, a syntax
// error, a permission denied) and every other error stay unmarked, as does
// every error when ctx, the caller's context, has ended: then the call was
// cut short by its caller, and trying again is the caller's decision.
//
// The drivers' error types are matched by their methods and messages, so
// that the package links none of them.
func transient(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	// A server's answer decides when there is one: a refused login
	// reaches the client as a connection error that wraps it.
	if code, ok := sqlState(err); ok {
		return transientState(code)
	}
	if n, ok := mysqlNumber(err); ok {
		return transientMySQL(n)
	}
	if isBusy(err) {
		return true // SQLITE_BUSY, SQLITE_LOCKED
	}
	return brokenConn(err)
}

// markTransient returns err marked with driver.Transient when it is
// transient, and err itself otherwise.
func markTransient(ctx context.Context, err error) error {
	if transient(ctx, err) {
		return driver.Transient(err)
	}
	return err
}

// sqlState returns the SQLSTATE of a PostgreSQL error (pgx's
// *pgconn.PgError).
func sqlState(err error) (string, bool) {
	var coded interface{ SQLState() string }
	if !errors.As(err, &coded) {
		return "", false
	}
	return coded.SQLState(), true
}

// transientState reports whether a PostgreSQL SQLSTATE may heal: a
// serialization failure or deadlock (40001, 40P01), a server shutting down,
// crashed or starting (57P01, 57P02, 57P03), a connection exception (class
// 08), too many connections (53300), a read-only transaction (25006: a
// standby, as during a failover), a statement that ran past the server's
// statement_timeout or lock_timeout (57014, 55P03).
func transientState(code string) bool {
	switch code {
	case "40001", "40P01", "57P01", "57P02", "57P03", "53300", "25006", "57014", "55P03":
		return true
	}
	return strings.HasPrefix(code, "08")
}

// mysqlErrorNumber finds the number of a MySQL server error in
// go-sql-driver/mysql's message, "Error 1213 (40001): ...".
var mysqlErrorNumber = regexp.MustCompile(`\bError (\d{4})\b`)

// mysqlNumber returns the error number of a MySQL or MariaDB server error
// (go-sql-driver/mysql's *MySQLError, whose Number field has no method).
func mysqlNumber(err error) (int, bool) {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if !strings.HasSuffix(fmt.Sprintf("%T", e), "mysql.MySQLError") {
			continue
		}
		m := mysqlErrorNumber.FindStringSubmatch(e.Error())
		if m == nil {
			return 0, false
		}
		n, _ := strconv.Atoi(m[1])
		return n, true
	}
	return 0, false
}

// transientMySQL reports whether a MySQL or MariaDB error number may heal:
// too many connections (1040), a server shutting down (1053), a lock wait
// timeout (1205), a deadlock (1213), a read-only server (1290 with
// --read-only, 1836 in read-only mode: as during a failover), a statement
// or connection killed (1317, 1927), and the client's "server has gone
// away" and "lost connection" (2006, 2013).
func transientMySQL(n int) bool {
	switch n {
	case 1040, 1053, 1205, 1213, 1290, 1317, 1836, 1927, 2006, 2013:
		return true
	}
	return false
}

// brokenConn reports whether err says that a connection failed: it was
// refused, reset, closed under the call, or one call on it timed out.
func brokenConn(err error) bool {
	var dns *net.DNSError
	if errors.As(err, &dns) && dns.IsNotFound {
		return false // a host name that does not resolve: a configuration error
	}
	if errors.Is(err, sqldriver.ErrBadConn) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) {
		return true
	}
	for _, errno := range []syscall.Errno{syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE, syscall.ETIMEDOUT, syscall.EHOSTUNREACH, syscall.ENETUNREACH} {
		if errors.Is(err, errno) {
			return true
		}
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true // a timeout, a dial that failed, a read or write that failed
	}
	// What the drivers say of a connection they gave up: go-sql-driver's
	// ErrInvalidConn, pgconn's closed or failed connections.
	msg := err.Error()
	for _, s := range []string{"invalid connection", "bad connection", "conn closed", "connection reset", "broken pipe", "unexpected EOF", "failed to connect"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
