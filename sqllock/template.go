// dialectSQL: filling a statement template's markers and parameters in for
// one dialect and table.

package sqllock

import (
	"strconv"
	"strings"
	"time"
)

// dialectSQL writes the statements that every dialect runs alike (shared
// holds, fair queues, writer intents, inspection) once, as templates, and
// fills them in for one dialect and table. A template names its parameters
// $1, $2, ... (PostgreSQL's style, a number may come back) and uses these
// markers, so that one text serves the three engines:
//
//	{t} {s} {q} {g}  the lock table, its shared-hold table, its queue table,
//	                 its table of released and withdrawn tokens
//	{now}            the database's clock, fixed within the statement
//	{plus:X}         now plus X units (X a parameter: µs, or ms on SQLite)
//	{left:X}         units from now until the time X (negative when past)
//	{since:X}        units from the time X until now
//	{time:X}         the time X as a value that {at:...} takes back exactly
//	{at:X}           a value read with {time:...}, as a time
//	{max}            the greater of its arguments (none may be NULL)
//	{upsert:COLS}    the start of an upsert's update on conflict over COLS
//	{new:C}          in an upsert's update, the value the insert wanted for C
//	{forupdate}      FOR UPDATE, where the engine locks rows that way
//	{nextfence}      the fence after the row's, which MySQL also hands back
//	                 through LAST_INSERT_ID (see mysql)
//	{matched}        on MySQL, an assignment that makes LAST_INSERT_ID tell
//	                 whether an UPDATE matched (see mysql)
//	{prefix:C}       C starts with $1, byte for byte
//	{fresh:A}        on PostgreSQL, a condition that the row A of {t}
//	                 (A is "alias." or empty) is the version the
//	                 statement's snapshot read (see goneTTL)
//
// On PostgreSQL {now} is statement_timestamp(), not now(): within a
// transaction now() stays at its start, before any wait for a row lock.
type dialectSQL struct {
	d          Dialect
	t, s, q, g string // quoted table names
	unit       time.Duration
}

func newDialectSQL(d Dialect, tables tableNames) *dialectSQL {
	x := &dialectSQL{d: d, t: tables.main, s: tables.shared, q: tables.queue, g: tables.gone, unit: time.Microsecond}
	if d == SQLite {
		x.unit = time.Millisecond
	}
	return x
}

// stmt is a statement filled in for one dialect. MySQL's placeholders are
// positional: order gives the argument, by index, that each ? takes.
type stmt struct {
	query string
	order []int
}

// args returns the arguments in the order the statement takes them.
func (s stmt) args(a ...any) []any {
	if s.order == nil {
		return a
	}
	out := make([]any, len(s.order))
	for i, k := range s.order {
		out[i] = a[k]
	}
	return out
}

// stmt fills in a template.
func (x *dialectSQL) stmt(tmpl string) stmt {
	return x.params(x.expand(tmpl))
}

// expand replaces the markers of a template.
func (x *dialectSQL) expand(tmpl string) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(tmpl, '{')
		if i < 0 {
			b.WriteString(tmpl)
			return b.String()
		}
		j := strings.IndexByte(tmpl[i:], '}')
		if j < 0 {
			panic("sqllock: unterminated marker in " + tmpl)
		}
		b.WriteString(tmpl[:i])
		name, arg, _ := strings.Cut(tmpl[i+1:i+j], ":")
		b.WriteString(x.marker(name, arg))
		tmpl = tmpl[i+j+1:]
	}
}

func (x *dialectSQL) marker(name, arg string) string {
	switch name {
	case "t":
		return x.t
	case "s":
		return x.s
	case "q":
		return x.q
	case "g":
		return x.g
	case "fresh":
		// On PostgreSQL, the row of {t} as the statement found it after
		// waiting for its lock is the version its snapshot read: no
		// transaction changed it in between (see goneTTL).
		if x.d == PostgreSQL {
			return " AND " + arg + "xmin = (SELECT fr.xmin FROM " + x.t + " fr WHERE fr.name = $1)"
		}
		return ""
	case "now":
		return x.now()
	case "plus":
		switch x.d {
		case PostgreSQL:
			return "(statement_timestamp() + (" + arg + ")::bigint * interval '1 microsecond')"
		case MySQL:
			return "(UTC_TIMESTAMP(6) + INTERVAL " + arg + " MICROSECOND)"
		}
		return "(" + sqliteNow + " + " + arg + ")"
	case "left":
		switch x.d {
		case PostgreSQL:
			return "(extract(epoch FROM (" + arg + ") - statement_timestamp()) * 1000000)::bigint"
		case MySQL:
			return "TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), " + arg + ")"
		}
		return "((" + arg + ") - " + sqliteNow + ")"
	case "since":
		switch x.d {
		case PostgreSQL:
			return "(extract(epoch FROM statement_timestamp() - (" + arg + ")) * 1000000)::bigint"
		case MySQL:
			return "TIMESTAMPDIFF(MICROSECOND, " + arg + ", UTC_TIMESTAMP(6))"
		}
		return "(" + sqliteNow + " - (" + arg + "))"
	case "time":
		if x.d == MySQL {
			// A string, whatever the connection's parseTime setting.
			return "DATE_FORMAT(" + arg + ", '%Y-%m-%d %H:%i:%s.%f')"
		}
		return arg
	case "at":
		switch x.d {
		case PostgreSQL:
			return "(" + arg + ")::timestamptz"
		case MySQL:
			return "CAST(" + arg + " AS DATETIME(6))"
		}
		return arg
	case "max":
		if x.d == SQLite {
			return "max"
		}
		return "GREATEST"
	case "upsert":
		if x.d == MySQL {
			return "ON DUPLICATE KEY UPDATE"
		}
		return "ON CONFLICT (" + arg + ") DO UPDATE SET"
	case "new":
		if x.d == MySQL {
			return "VALUES(" + arg + ")"
		}
		return "excluded." + arg
	case "nextfence":
		if x.d == MySQL {
			return "LAST_INSERT_ID(fence + 1)"
		}
		return "fence + 1"
	case "matched":
		if x.d == MySQL {
			return ", fence = LAST_INSERT_ID(fence)"
		}
		return ""
	case "forupdate":
		if x.d == SQLite {
			return ""
		}
		return " FOR UPDATE"
	case "prefix":
		switch x.d {
		case PostgreSQL:
			return "starts_with(" + arg + ", $1)"
		case MySQL:
			return arg + " LIKE $1 ESCAPE '!'"
		}
		// substr and length count characters, alike for both sides; LIKE
		// would ignore the case of ASCII letters.
		return "substr(" + arg + ", 1, length($1)) = $1"
	}
	panic("sqllock: unknown marker {" + name + "}")
}

func (x *dialectSQL) now() string {
	switch x.d {
	case PostgreSQL:
		return "statement_timestamp()"
	case MySQL:
		return "UTC_TIMESTAMP(6)"
	}
	return sqliteNow
}

// params rewrites the $n placeholders of q for the dialect: as they are on
// PostgreSQL, ?n on SQLite, and ? on MySQL with the order of the arguments.
func (x *dialectSQL) params(q string) stmt {
	if x.d == PostgreSQL {
		return stmt{query: q}
	}
	var b strings.Builder
	var order []int
	for {
		i := strings.IndexByte(q, '$')
		if i < 0 {
			b.WriteString(q)
			break
		}
		j := i + 1
		for j < len(q) && q[j] >= '0' && q[j] <= '9' {
			j++
		}
		if j == i+1 {
			panic("sqllock: a $ without a number in " + q)
		}
		n, _ := strconv.Atoi(q[i+1 : j])
		b.WriteString(q[:i])
		if x.d == MySQL {
			b.WriteByte('?')
			order = append(order, n-1)
		} else {
			b.WriteString("?" + q[i+1:j])
		}
		q = q[j:]
	}
	s := stmt{query: b.String(), order: order}
	if x.d == MySQL && s.order == nil {
		s.order = []int{}
	}
	return s
}

// units converts d to the dialect's unit, rounding up.
func (x *dialectSQL) units(d time.Duration) int64 { return units(d, x.unit) }

// duration converts a number of the dialect's units to a duration, 0 when
// negative.
func (x *dialectSQL) duration(n int64) time.Duration { return time.Duration(max(n, 0)) * x.unit }

func itoa(n int) string { return strconv.Itoa(n) }

// placeholders returns "$from, $from+1, ..." for n parameters.
func placeholders(from, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("$" + strconv.Itoa(from+i))
	}
	return b.String()
}
