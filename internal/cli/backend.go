// Backend URLs: their schemes and parsed form, the dispatch to each store's
// parser, the SQLite, MySQL and PostgreSQL forms, and the checks of hosts and
// ports that every form shares.

package cli

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// Backend URLs, as given to --backend or DLOCK_BACKEND:
//
//	sqlite:///abs/path/file.db          SQLite file, absolute path (three slashes)
//	sqlite:relative/path/file.db        SQLite file, relative to the current directory
//	redis://[user:pass@]host:port/db    one Redis node; rediss:// for TLS
//	redis+sentinel://[user:pass@]h1:26379,h2:26379/MASTER[?db=N]
//	redis+cluster://[user:pass@]h1:7000,h2:7001
//	    the three Redis forms also take replica_ack=N[&replica_ack_timeout=100ms]
//	    every Redis form (Redlock too) takes allow_eviction=1: grant locks
//	    although maxmemory-policy is not noeviction (see redislock.EvictionError)
//	redlock://[user:pass@]h1:6379,h2:6379,h3:6379[/db][?node_timeout=50ms]
//	                                    independent Redis nodes, Redlock quorum
//	mysql://user:pass@host:3306/dbname[?driver params]
//	postgres://user:pass@host:5432/dbname[?params]   (or postgresql://)
//	etcd://[user:pass@]h1:2379,h2:2379,h3:2379[?params]   etcds:// for TLS
//	    params: tls=1, ca=FILE, cert=FILE&key=FILE, insecure_skip_verify=1,
//	    namespace=PREFIX (default "dlock/"), op_timeout=3s, handoff=0
//
// "sqlite://relative/path" is refused rather than guessed at: in URL syntax
// "relative" is a host, and reading it as a directory would silently lock in
// a different file from the one a user who meant "/relative/path" expects.
//
// Passwords with '/', '?', '#' or '@' must be percent-encoded. Parse errors
// echo the URL only with its passwords replaced by "xxxxx".

// backendKind names a store.
type backendKind string

const (
	kindSQLite   backendKind = "sqlite"
	kindRedis    backendKind = "redis"
	kindSentinel backendKind = "redis+sentinel"
	kindCluster  backendKind = "redis+cluster"
	kindRedlock  backendKind = "redlock"
	kindMySQL    backendKind = "mysql"
	kindPostgres backendKind = "postgres"
	kindEtcd     backendKind = "etcd"
)

// schemes maps every accepted URL scheme to its store.
var schemes = map[string]backendKind{
	"sqlite":         kindSQLite,
	"redis":          kindRedis,
	"rediss":         kindRedis,
	"redis+sentinel": kindSentinel,
	"redis+cluster":  kindCluster,
	"redlock":        kindRedlock,
	"mysql":          kindMySQL,
	"postgres":       kindPostgres,
	"postgresql":     kindPostgres,
	"etcd":           kindEtcd,
	"etcds":          kindEtcd,
}

const schemeList = "sqlite, redis, rediss, redis+sentinel, redis+cluster, redlock, mysql, postgres, postgresql, etcd or etcds"

// Default ports, when a URL gives none.
const (
	redisPort    = "6379"
	sentinelPort = "26379"
	mysqlPort    = "3306"
)

// backendURL is a parsed backend URL: which store, where, and the options of
// its client, ready for connect.
type backendURL struct {
	kind backendKind
	// where describes the store for messages: address and database, never a
	// password.
	where string
	// secrets are the passwords in the URL, scrubbed from every store error
	// before it is printed (see scrub for those that are not).
	secrets []string
	// user is the user name the store is given, if any; it is not secret.
	user string

	path      string // kindSQLite: the database file
	isDefault bool   // kindSQLite: the default store in the state directory
	redis     *redis.Options
	failover  *redis.FailoverOptions
	cluster   *redis.ClusterOptions
	redlock   *redlockURL

	replicaAck        int           // Redis: WAIT for this many replicas; 0 off
	replicaAckTimeout time.Duration // Redis: WAIT's timeout
	allowEviction     bool          // Redis, Redlock: allow_eviction=1
	mysql             *mysql.Config
	postgres          *pgx.ConnConfig
	etcd              *etcdURL
}

// parseBackendURL parses raw. Its errors are one line without the URL, which
// the caller quotes, redacted; they never contain a password.
func parseBackendURL(raw string) (*backendURL, error) {
	scheme, rest, ok := strings.Cut(raw, ":")
	if !ok || scheme == "" {
		if strings.HasPrefix(raw, "/") || strings.HasSuffix(raw, ".db") {
			return nil, errors.New("not a URL; for a SQLite file write sqlite:///absolute/path.db")
		}
		return nil, errors.New("not a URL; want SCHEME://..., for example redis://localhost:6379/0")
	}
	kind, ok := schemes[strings.ToLower(scheme)]
	if !ok {
		if !strings.HasPrefix(rest, "//") {
			return nil, errors.New("not a URL; want SCHEME://..., for example redis://localhost:6379/0")
		}
		return nil, fmt.Errorf("unknown scheme %q; use %s", printable(scheme, 20), schemeList)
	}
	scheme = strings.ToLower(scheme)
	raw = scheme + ":" + rest
	var (
		b   *backendURL
		err error
	)
	switch kind {
	case kindSQLite:
		b, err = parseSQLite(raw)
	case kindRedis:
		b, err = parseRedis(raw)
	case kindSentinel, kindCluster, kindRedlock:
		b, err = parseRedisMulti(kind, raw)
	case kindMySQL:
		b, err = parseMySQL(raw)
	case kindPostgres:
		b, err = parsePostgres(raw)
	case kindEtcd:
		b, err = parseEtcd(raw)
	}
	if err != nil {
		return nil, err
	}
	b.kind = kind
	b.secrets = dropUserName(append(b.secrets, querySecrets(raw)...), b.user)
	return b, nil
}

// parseSQLite reads sqlite:///abs/path or sqlite:rel/path.
func parseSQLite(raw string) (*backendURL, error) {
	rest := strings.TrimPrefix(raw, "sqlite:")
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		return nil, errors.New("sqlite URL takes no query or fragment; dlock sets the pragmas it needs")
	}
	var p string
	switch {
	case strings.HasPrefix(rest, "///"):
		p = rest[2:]
	case strings.HasPrefix(rest, "//"):
		// Not echoed: what stands there could be "user:password@host".
		return nil, errors.New("two slashes would make the next part a host; write sqlite:///absolute/path.db (three slashes) or sqlite:relative/path.db")
	default:
		p = rest
	}
	path, err := url.PathUnescape(p)
	if err != nil {
		return nil, errors.New("bad percent-encoding in the path")
	}
	switch {
	case path == "" || path == "/":
		return nil, errors.New("no file path; write sqlite:///absolute/path.db")
	case strings.HasPrefix(path, ":memory:") || strings.Contains(path, "mode=memory"):
		return nil, errors.New("an in-memory SQLite database cannot be shared between processes; give a file path")
	case strings.HasSuffix(path, "/"):
		return nil, errors.New("the path names a directory; give a file path, for example sqlite:///var/lib/dlock/locks.db")
	case strings.ContainsRune(path, 0):
		return nil, errors.New("the path contains a NUL byte")
	}
	return &backendURL{path: path, where: "SQLite file " + path}, nil
}

// parseMySQL reads mysql://user:pass@host:port/dbname?params; the
// parameters are go-sql-driver/mysql's DSN parameters (tls=true, ...).
func parseMySQL(raw string) (*backendURL, error) {
	u, err := parseNetURL(raw, false)
	if err != nil {
		return nil, err
	}
	db := strings.TrimPrefix(u.Path, "/")
	if db == "" || strings.Contains(db, "/") {
		return nil, errors.New("want a database name as the path: mysql://user:pass@host:3306/DBNAME")
	}
	cfg := mysql.NewConfig()
	if u.RawQuery != "" {
		if cfg, err = mysql.ParseDSN("/?" + u.RawQuery); err != nil {
			return nil, errors.New(scrub("bad parameter: "+err.Error(), querySecrets(raw)))
		}
	}
	addr, err := hostPort(u.Host, mysqlPort)
	if err != nil {
		return nil, err
	}
	if !strings.Contains(u.RawQuery, "interpolateParams") {
		// One round trip per statement instead of prepare, execute, close:
		// the lock's statements run about twice as fast (docs/SQL.md).
		cfg.InterpolateParams = true
	}
	cfg.Net = "tcp"
	cfg.Addr = addr
	cfg.DBName = db
	cfg.User = u.User.Username()
	b := &backendURL{mysql: cfg, user: cfg.User, where: fmt.Sprintf("mysql at %s (database %s)", addr, db)}
	if pw, ok := u.User.Password(); ok {
		cfg.Passwd = pw
		if pw != "" {
			b.secrets = append(b.secrets, pw)
		}
	}
	return b, nil
}

// parsePostgres reads postgres:// and postgresql:// with pgx's parser, which
// also applies the usual PG* environment variables and libpq parameters.
func parsePostgres(raw string) (*backendURL, error) {
	u, err := parseNetURL(raw, true)
	if err != nil {
		return nil, err
	}
	var secrets []string
	if pw, ok := u.User.Password(); ok && pw != "" {
		secrets = append(secrets, pw)
	}
	cfg, err := pgx.ParseConfig(raw)
	if err != nil {
		msg := err.Error()
		// pgconn's message quotes the (redacted) URL first; drop it, the
		// caller quotes the URL.
		if i := strings.Index(msg, "`: "); i >= 0 {
			msg = msg[i+3:]
		}
		return nil, errors.New(oneLine(scrub(msg, append(secrets, querySecrets(raw)...))))
	}
	where := fmt.Sprintf("postgres at %s (database %s)", net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), cfg.Database)
	if strings.HasPrefix(cfg.Host, "/") {
		where = fmt.Sprintf("postgres at %s (database %s)", cfg.Host, cfg.Database)
	}
	return &backendURL{postgres: cfg, user: cfg.User, where: where, secrets: secrets}, nil
}

// parseNetURL parses a URL with net/url (one host, or a comma-separated list
// when multiHost) and checks that net/url
// split it where a reader would: a password with an unencoded '/', '?' or
// '#' would otherwise end up, in part, as the host or port, and be echoed in
// messages. Its errors never quote net/url's, which contain the input.
func parseNetURL(raw string, multiHost bool) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		msg := "not a valid URL"
		if errors.As(err, &ue) {
			switch s := ue.Err.Error(); {
			case strings.Contains(s, "invalid port"):
				msg = "the port is not a number (percent-encode '/', '?', '#' and '@' in a password)"
			case strings.Contains(s, "invalid userinfo"):
				msg = "bad character in the user or password; percent-encode it"
			case strings.Contains(s, "invalid URL escape"):
				msg = "bad percent-encoding"
			case strings.Contains(s, "invalid character") && strings.Contains(s, "host"):
				msg = "bad character in the host name"
			case strings.Contains(s, "missing ']'"):
				msg = "unclosed '[' in an IPv6 address"
			case strings.Contains(s, "control character"):
				msg = "the URL contains a control character"
			}
		}
		return nil, errors.New(msg)
	}
	_, rest, _ := strings.Cut(raw, ":")
	if !strings.HasPrefix(rest, "//") || u.Opaque != "" {
		return nil, fmt.Errorf("want %s://host:port/..., with two slashes", u.Scheme)
	}
	if span := passwordSpan(raw); span != "" {
		pw, _ := u.User.Password()
		if dec, err := url.PathUnescape(span); err != nil || dec != pw {
			return nil, errors.New("the password seems to contain '/', '?', '#' or '@'; percent-encode them (%2F, %3F, %23, %40)")
		}
	}
	if u.Fragment != "" || strings.Contains(raw, "#") {
		return nil, errors.New("a fragment ('#...') has no meaning here; percent-encode '#' in a password as %23")
	}
	if u.Host != "" {
		hosts := []string{u.Host}
		if multiHost {
			hosts = strings.Split(u.Host, ",")
		}
		for _, h := range hosts {
			if _, err := hostPort(h, "1"); err != nil {
				return nil, err
			}
		}
	}
	return u, nil
}

// hostPort checks one "host[:port]" and returns it with defPort added when
// it has none.
func hostPort(h, defPort string) (string, error) {
	if h == "" {
		return "", errors.New("empty host")
	}
	host, port := h, defPort
	switch {
	case strings.HasPrefix(h, "["):
		end := strings.IndexByte(h, ']')
		if end < 0 {
			return "", errors.New("unclosed '[' in an IPv6 address")
		}
		host = h[1:end]
		switch after := h[end+1:]; {
		case after == "":
		case strings.HasPrefix(after, ":"):
			port = after[1:]
		default:
			return "", fmt.Errorf("unexpected %q after an IPv6 address", printable(after, 20))
		}
	case strings.Count(h, ":") > 1:
		return "", errors.New("write an IPv6 address in brackets: [::1]:6379")
	default:
		if i := strings.IndexByte(h, ':'); i >= 0 {
			host, port = h[:i], h[i+1:]
		}
	}
	if host == "" {
		return "", errors.New("empty host")
	}
	if strings.ContainsAny(host, " /\\?#@,") {
		return "", errors.New("bad character in the host name")
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		return "", errors.New("the port is not a number")
	}
	if n < 1 || n > 65535 {
		return "", fmt.Errorf("port %d is out of range (1-65535)", n)
	}
	return net.JoinHostPort(host, port), nil
}

// cutAny cuts s around the first of chars; found is false when none occurs.
func cutAny(s, chars string) (before, after string, found bool) {
	if i := strings.IndexAny(s, chars); i >= 0 {
		return s[:i], s[i:], true
	}
	return s, "", false
}

// printable shortens s to n bytes for a message; %q then escapes it.
func printable(s string, n int) string { return shorten(s, n) }
