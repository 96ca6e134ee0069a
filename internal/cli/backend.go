package cli

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
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
}

const schemeList = "sqlite, redis, rediss, redis+sentinel, redis+cluster, redlock, mysql, postgres or postgresql"

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

	path     string // kindSQLite: the database file
	redis    *redis.Options
	failover *redis.FailoverOptions
	cluster  *redis.ClusterOptions
	redlock  *redlockURL

	replicaAck        int           // Redis: WAIT for this many replicas; 0 off
	replicaAckTimeout time.Duration // Redis: WAIT's timeout
	allowEviction     bool          // Redis, Redlock: allow_eviction=1
	mysql             *mysql.Config
	postgres          *pgx.ConnConfig
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

// parseRedis reads redis:// and rediss:// with go-redis's own parser, which
// also takes its query options (dial_timeout=3s, ...).
func parseRedis(raw string) (*backendURL, error) {
	u, err := parseNetURL(raw, false)
	if err != nil {
		return nil, err
	}
	query := u.Query()
	n, timeout, err := takeReplicaAck(query)
	if err != nil {
		return nil, err
	}
	allowEviction, err := takeAllowEviction(query)
	if err != nil {
		return nil, err
	}
	if u.RawQuery != "" {
		// go-redis refuses parameters it does not know: hand it the rest.
		base, _, _ := strings.Cut(raw, "?")
		if raw = base; len(query) > 0 {
			raw += "?" + query.Encode()
		}
	}
	opts, err := redis.ParseURL(raw)
	if err != nil {
		return nil, errors.New(strings.TrimPrefix(err.Error(), "redis: "))
	}
	b := &backendURL{redis: opts, user: opts.Username, where: fmt.Sprintf("redis at %s (db %d)", opts.Addr, opts.DB),
		replicaAck: n, replicaAckTimeout: timeout, allowEviction: allowEviction}
	if pw, ok := u.User.Password(); ok && pw != "" {
		b.secrets = append(b.secrets, pw)
	}
	return b, nil
}

// parseRedisMulti reads the host lists of redis+sentinel:// and
// redis+cluster://, which net/url does not parse: the user information ends
// at the last '@', the hosts at the next '/', '?' or '#'.
func parseRedisMulti(kind backendKind, raw string) (*backendURL, error) {
	_, rest, _ := strings.Cut(raw, ":")
	if !strings.HasPrefix(rest, "//") {
		return nil, fmt.Errorf("want %s://host:port,host:port,..., with two slashes", kind)
	}
	rest = rest[2:]
	if i := strings.IndexByte(rest, '#'); i >= 0 {
		return nil, errors.New("a fragment ('#...') has no meaning here; percent-encode '#' in a password as %23")
	}
	var user, pass string
	var hasUser bool
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		info := rest[:at]
		rest = rest[at+1:]
		hasUser = true
		u, p, _ := strings.Cut(info, ":")
		var err1, err2 error
		user, err1 = url.PathUnescape(u)
		pass, err2 = url.PathUnescape(p)
		if err1 != nil || err2 != nil {
			return nil, errors.New("bad percent-encoding in the user or password")
		}
	}
	hostPart, pathQuery, _ := cutAny(rest, "/?")
	path, rawQuery, _ := strings.Cut(pathQuery, "?")
	query, err := url.ParseQuery(rawQuery)
	if err != nil {
		return nil, errors.New("bad query string")
	}
	defPort := redisPort
	if kind == kindSentinel {
		defPort = sentinelPort
	}
	var addrs []string
	for h := range strings.SplitSeq(hostPart, ",") {
		addr, err := hostPort(h, defPort)
		if err != nil {
			return nil, err
		}
		addrs = append(addrs, addr)
	}
	path = strings.Trim(path, "/")
	b := &backendURL{user: user}
	if b.allowEviction, err = takeAllowEviction(query); err != nil {
		return nil, err
	}
	if kind != kindRedlock {
		if b.replicaAck, b.replicaAckTimeout, err = takeReplicaAck(query); err != nil {
			return nil, err
		}
	}
	if pass != "" {
		b.secrets = append(b.secrets, pass)
	}
	switch kind {
	case kindSentinel:
		if path == "" || strings.Contains(path, "/") {
			return nil, errors.New("want the master's name as the path: redis+sentinel://host:26379,host:26379/MASTERNAME")
		}
		master, err := url.PathUnescape(path)
		if err != nil {
			return nil, errors.New("bad percent-encoding in the master name")
		}
		o := &redis.FailoverOptions{MasterName: master, SentinelAddrs: addrs}
		if hasUser {
			o.Username, o.Password = user, pass
		}
		for k, vs := range query {
			v := vs[len(vs)-1]
			switch k {
			case "db":
				n, err := strconv.Atoi(v)
				if err != nil || n < 0 {
					return nil, fmt.Errorf("db=%q is not a database number", printable(v, 20))
				}
				o.DB = n
			case "sentinel_username":
				o.SentinelUsername = v
			case "sentinel_password":
				o.SentinelPassword = v
			default:
				return nil, fmt.Errorf("unknown parameter %q; redis+sentinel takes db, sentinel_username, sentinel_password, replica_ack, replica_ack_timeout and allow_eviction", printable(k, 40))
			}
		}
		b.failover = o
		b.where = fmt.Sprintf("redis master %q via sentinels %s (db %d)", master, strings.Join(addrs, ","), o.DB)
	case kindCluster:
		if path != "" && path != "0" {
			return nil, errors.New("a Redis Cluster has only database 0; drop the path")
		}
		if len(query) > 0 {
			return nil, errors.New("redis+cluster takes only replica_ack, replica_ack_timeout and allow_eviction")
		}
		o := &redis.ClusterOptions{Addrs: addrs}
		if hasUser {
			o.Username, o.Password = user, pass
		}
		b.cluster = o
		b.where = "redis cluster at " + strings.Join(addrs, ",")
	case kindRedlock:
		r, err := parseRedlock(addrs, path, query)
		if err != nil {
			return nil, err
		}
		for _, o := range r.nodes {
			if hasUser {
				o.Username, o.Password = user, pass
			}
		}
		b.redlock = r
		b.where = fmt.Sprintf("redlock over %d nodes %s (db %d)", len(addrs), strings.Join(addrs, ","), r.nodes[0].DB)
	}
	return b, nil
}

// defaultReplicaAckTimeout is WAIT's timeout when a URL asks for
// replica_ack without replica_ack_timeout: short next to the default TTL's
// renewal interval (10s / 3).
const defaultReplicaAckTimeout = 100 * time.Millisecond

// takeAllowEviction reads and removes the allow_eviction parameter of a
// Redis or Redlock URL (see redislock.WithEvictionAllowed).
func takeAllowEviction(query url.Values) (bool, error) {
	v, ok := query["allow_eviction"]
	if !ok {
		return false, nil
	}
	delete(query, "allow_eviction")
	switch v[len(v)-1] {
	case "1", "true":
		return true, nil
	case "0", "false":
		return false, nil
	}
	return false, fmt.Errorf("allow_eviction=%q: want 1 or 0", printable(v[len(v)-1], 20))
}

// takeReplicaAck reads and removes the replica_ack and replica_ack_timeout
// parameters of a Redis URL (see redislock.WithReplicaAck).
func takeReplicaAck(query url.Values) (n int, timeout time.Duration, err error) {
	if v, ok := query["replica_ack"]; ok {
		if n, err = strconv.Atoi(v[len(v)-1]); err != nil || n < 0 {
			return 0, 0, fmt.Errorf("replica_ack=%q is not a number of replicas", printable(v[len(v)-1], 20))
		}
		delete(query, "replica_ack")
	}
	timeout = defaultReplicaAckTimeout
	if v, ok := query["replica_ack_timeout"]; ok {
		timeout, err = time.ParseDuration(v[len(v)-1])
		if err != nil || timeout <= 0 {
			return 0, 0, fmt.Errorf("replica_ack_timeout=%q is not a positive duration such as 100ms", printable(v[len(v)-1], 20))
		}
		if n == 0 {
			return 0, 0, errors.New("replica_ack_timeout needs replica_ack=N with N of at least 1")
		}
		delete(query, "replica_ack_timeout")
	}
	return n, timeout, nil
}

// minRedlockNodes is the fewest nodes a redlock:// URL may list: with fewer,
// a quorum cannot survive the loss of one node.
const minRedlockNodes = 3

// redlockURL is a parsed redlock:// URL.
type redlockURL struct {
	nodes       []*redis.Options
	nodeTimeout time.Duration // 0: redlock's default
}

// parseRedlock reads the nodes, database and parameters of a redlock:// URL.
func parseRedlock(addrs []string, path string, query url.Values) (*redlockURL, error) {
	if len(addrs) < minRedlockNodes {
		return nil, fmt.Errorf("redlock needs at least %d independent nodes (an odd number is best), not %d; for one node use redis://", minRedlockNodes, len(addrs))
	}
	seen := make(map[string]bool)
	for _, a := range addrs {
		if seen[a] {
			return nil, fmt.Errorf("node %s is listed twice; Redlock's nodes must be independent servers", a)
		}
		seen[a] = true
	}
	db := 0
	if path != "" {
		n, err := strconv.Atoi(path)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("path %q is not a database number", printable(path, 20))
		}
		db = n
	}
	r := &redlockURL{}
	for k, vs := range query {
		v := vs[len(vs)-1]
		switch k {
		case "node_timeout":
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return nil, fmt.Errorf("node_timeout=%q is not a positive duration such as 50ms", printable(v, 20))
			}
			r.nodeTimeout = d
		default:
			return nil, fmt.Errorf("unknown parameter %q; redlock takes node_timeout", printable(k, 40))
		}
	}
	for _, a := range addrs {
		r.nodes = append(r.nodes, &redis.Options{Addr: a, DB: db})
	}
	return r, nil
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

// passwordSpan returns the part of raw that a careful reader takes for a
// password: from the first ':' after "//" to the last '@'. It errs towards
// taking too much, which only hides more of an echoed URL.
func passwordSpan(raw string) string {
	i := strings.Index(raw, "://")
	if i < 0 {
		return ""
	}
	rest := raw[i+3:]
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return ""
	}
	c := strings.IndexByte(rest[:at], ':')
	if c < 0 {
		return ""
	}
	return rest[c+1 : at]
}

// secretParam matches the query parameters whose values are secrets:
// password= and sslpassword= (PostgreSQL), sentinel_password= (Redis
// Sentinel). Only these names: a pattern such as "contains pass" would also
// take allowCleartextPasswords=1 (MySQL) for a secret, and scrub every "1"
// from the driver's messages.
var secretParam = regexp.MustCompile(`(?i)([?&](?:password|sslpassword|sentinel_password)=)([^&#]*)`)

// redact returns raw with its passwords replaced by "xxxxx", for messages.
func redact(raw string) string {
	if span := passwordSpan(raw); span != "" {
		i := strings.Index(raw, "://") + 3
		c := i + strings.IndexByte(raw[i:], ':')
		raw = raw[:c+1] + "xxxxx" + raw[c+1+len(span):]
	}
	return secretParam.ReplaceAllString(raw, "${1}xxxxx")
}

// querySecrets returns the values of the secret query parameters of raw.
func querySecrets(raw string) []string {
	var out []string
	for _, m := range secretParam.FindAllStringSubmatch(raw, -1) {
		if m[2] == "" {
			continue
		}
		out = append(out, m[2])
		if dec, err := url.QueryUnescape(m[2]); err == nil && dec != m[2] {
			out = append(out, dec)
		}
	}
	return out
}

// scrub replaces every secret, and its percent-encoded forms, in msg. An
// occurrence inside a longer word is left alone ("p" in "tcp"): drivers do
// not put passwords in their messages, and this is the safety net for one
// that would, not a reason to garble every message of a short password. For
// the same reason a secret that is too short, or a number or a boolean
// (scrubbable says which), is left alone: scrubbing "1" or "true" would
// blank port numbers, addresses and flags, and tell nothing a reader could
// not guess.
func scrub(msg string, secrets []string) string {
	for _, s := range secrets {
		if !scrubbable(s) {
			continue
		}
		for _, form := range []string{s, url.PathEscape(s), url.QueryEscape(s), url.UserPassword("", s).String()[1:]} {
			if form != "" {
				msg = replaceWord(msg, form, "xxxxx")
			}
		}
	}
	return msg
}

// minSecretLen is the length below which scrub leaves a secret alone.
const minSecretLen = 4

// scrubbable reports whether scrub replaces s: not when it is shorter than
// minSecretLen, only digits, or a boolean word.
func scrubbable(s string) bool {
	if len(s) < minSecretLen {
		return false
	}
	if strings.Trim(s, "0123456789") == "" {
		return false
	}
	switch strings.ToLower(s) {
	case "true", "false", "yes", "no", "on", "off":
		return false
	}
	return true
}

// dropUserName drops from secrets those equal to the user name: the name
// is not hidden in messages ("access denied for user 'app'"), and a
// password that equals it would blank it everywhere while hiding nothing.
func dropUserName(secrets []string, user string) []string {
	if user == "" {
		return secrets
	}
	out := secrets[:0]
	for _, s := range secrets {
		if s != user {
			out = append(out, s)
		}
	}
	return out
}

// replaceWord replaces the occurrences of old in s that are not part of a
// longer run of letters and digits.
func replaceWord(s, old, repl string) string {
	var b strings.Builder
	from := 0
	for {
		i := strings.Index(s[from:], old)
		if i < 0 {
			b.WriteString(s[from:])
			return b.String()
		}
		i += from
		end := i + len(old)
		inWord := (i > 0 && isAlnum(s[i-1]) && isAlnum(old[0])) ||
			(end < len(s) && isAlnum(s[end]) && isAlnum(old[len(old)-1]))
		b.WriteString(s[from:i])
		if inWord {
			b.WriteString(old)
		} else {
			b.WriteString(repl)
		}
		from = end
	}
}

func isAlnum(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// cutAny cuts s around the first of chars; found is false when none occurs.
func cutAny(s, chars string) (before, after string, found bool) {
	if i := strings.IndexAny(s, chars); i >= 0 {
		return s[:i], s[i:], true
	}
	return s, "", false
}

// printable shortens s to n bytes for a message; %q then escapes it.
func printable(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
