// Why a store could not be used, told apart: unreachable (69), refused
// credentials (77) or a configuration the store does not have or refuses
// (78), from the errors of go-redis, pgx, the MySQL driver and redislock's
// eviction check.

package cli

import (
	"errors"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dlock-go/dlock/redislock"
)

// connectErr is the error of a store that answered the first request with
// err, or could not be reached: exit 77 when it refused the credentials, 78
// when it lacks what the URL names (a database), 69 otherwise; a SQLite file
// dlock cannot open or write is 77 too, with what to change.
func (s *store) connectErr(err error) *exitError {
	if s.sqlitePath != "" {
		msg := oneLine(scrub(err.Error(), s.secrets))
		if hint := readOnlyHint(s.sqlitePath, msg); hint != "" {
			return fail(exitNoPerm, "%s: %s; %s", s.where, msg, hint)
		}
	}
	switch cause, code := classifyConnect(err); code {
	case exitNoPerm:
		return fail(code, "%s refused the credentials: %s", s.where, oneLine(scrub(cause, s.secrets)))
	case exitConfig:
		return fail(code, "%s: %s", s.where, oneLine(scrub(cause, s.secrets)))
	}
	return fail(exitUnavailable, "cannot reach %s: %s", s.where, oneLine(scrub(err.Error(), s.secrets)))
}

// classifyConnect finds, in the error of a store's first request, a refusal
// of the credentials or of what the URL names, and returns the store's own
// words for it (without the driver's other attempts, such as pgx's TLS try
// before a plain connection) with its exit code; exitUnavailable otherwise.
func classifyConnect(err error) (cause string, code int) {
	var evict *redislock.EvictionError
	if errors.As(err, &evict) {
		return "maxmemory-policy " + evict.Policy + " on " + evict.Addr + " may evict lock keys and fence counters " +
			"(two holders, fences going back); set maxmemory-policy noeviction, or accept the risk with allow_eviction=1 in the URL", exitConfig
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		msg := pgErr.Message + " (SQLSTATE " + pgErr.Code + ")"
		switch pgErr.Code {
		case "28P01", "28000", "42501":
			// invalid_password, invalid_authorization_specification,
			// insufficient_privilege
			return msg, exitNoPerm
		case "3D000", "3F000": // invalid_catalog_name, invalid_schema_name
			return msg, exitConfig
		}
	}
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) {
		switch myErr.Number {
		case 1044: // access denied to a database: MySQL says so of a missing one too
			return myErr.Error() + " (the database does not exist, or the user has no rights to it)", exitNoPerm
		case 1045, 1698, 1142: // access denied for a user, without a password; a command denied
			return myErr.Error(), exitNoPerm
		case 1049: // unknown database
			return myErr.Error(), exitConfig
		}
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "WRONGPASS"), strings.Contains(msg, "NOAUTH"), strings.Contains(msg, "NOPERM"),
		strings.Contains(msg, "invalid password"), strings.Contains(msg, "invalid username-password pair"),
		strings.Contains(msg, "etcdserver: authentication failed"), strings.Contains(msg, "etcdserver: permission denied"),
		strings.Contains(msg, "etcdserver: user name is empty"):
		if i := strings.Index(msg, "NOAUTH"); i > 0 && !strings.Contains(msg, "WRONGPASS") {
			msg = msg[i:] + "; give the password in DLOCK_PASSWORD or a --password-file"
		} else if i := strings.Index(msg, "NOPERM"); i > 0 {
			// Redis's reply, without the library's layers ("dlock:
			// acquire NAME: redis ADDR: "), which repeat the lock and
			// the store that dlock's message names already.
			msg = msg[i:]
		}
		return msg, exitNoPerm
	case strings.Contains(msg, "DB index is out of range"):
		return "the database number is out of range for this server (" + msg + "; it has 16 by default, 0 to 15)", exitConfig
	}
	return msg, exitUnavailable
}
