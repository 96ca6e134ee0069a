// Opening the store a backend URL names (Redis, Redlock or SQL) and checking
// that it answers, and the default backend.

package cli

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/bench"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/redlock"
)

// defaultConnectTimeout bounds opening the store and its first answer.
const defaultConnectTimeout = 5 * time.Second

// sqliteBusyTimeout is how long SQLite waits for another process's write
// lock on the file before it reports "database is locked". Statements of
// dlock are short, so this is only reached when something is wrong.
const sqliteBusyTimeout = 5000 // ms

// store is an open backend and what must be closed with it.
type store struct {
	backend   driver.Backend
	inspector driver.Inspector // nil when the backend cannot describe its locks
	where     string
	// addr is the address the backend's own errors name ("redis ADDR: "),
	// "" when they name none.
	addr    string
	secrets []string
	closeFn func() error
	// sqlitePath is the SQLite file, for the hint of an error that says
	// it cannot be written; "" for other stores.
	sqlitePath string
	// storeTTL, when not nil, is how long the store may keep a lock of a
	// TTL that nobody releases, when that is longer than the TTL (etcd's
	// leases).
	storeTTL func(ttl time.Duration) time.Duration

	// The store's clients, for dlock bench's baselines and counters: its
	// Redis clients (one per node for Redlock), or its SQL handle and
	// dialect.
	rdbs    []redis.UniversalClient
	db      *sql.DB
	dialect sqlDialect
}

// connectHooks let dlock bench watch what a store's clients send.
type connectHooks struct {
	// redis, when not nil, is added to every Redis client of the store.
	redis redis.Hook
	// statements, when not nil, counts the statements of the SQL handle.
	statements *bench.StatementCounter
	// readOnly: the command only reads the store (see app.readOnly): on
	// SQL, dlock's tables are not created (nor a SQLite file switched to
	// WAL), and a database without them reads as one with no lock held.
	readOnly bool
	// check, when not nil, vets the backend once it is made and before the
	// store is reached: what it refuses (a kind of lock the store does not
	// have) is refused whether or not the store answers.
	check func(be driver.Backend, where string) error
	// log, when not nil, takes the warnings of the Redis and Redlock
	// backends (app.libLogger); slog.Default otherwise.
	log *slog.Logger
}

// Close closes the store's client or database handle.
func (s *store) Close() error {
	if s.closeFn == nil {
		return nil
	}
	return s.closeFn()
}

// storeErr turns an error of a call to the store's backend into dlock's
// one-line message with exit code 69, without passwords: op names the
// operation and the lock, which a backend's errors leave to their caller,
// then where the store is, unless the backend's message names its address.
func (s *store) storeErr(op string, err error) *exitError {
	return s.errOf(op, err, false)
}

// libErr is storeErr for an error of a call through the dlock library,
// whose message names the operation and the lock already: dlock adds only
// where the store is (see storeErr). op is said with a classified error,
// which is given in the store's own words.
func (s *store) libErr(op string, err error) *exitError {
	return s.errOf(op, err, true)
}

// errOf is storeErr, or libErr when named.
func (s *store) errOf(op string, err error, named bool) *exitError {
	msg := oneLine(scrub(err.Error(), s.secrets))
	code := exitUnavailable
	if s.sqlitePath != "" {
		if hint := readOnlyHint(s.sqlitePath, msg); hint != "" {
			msg, code = msg+"; "+hint, exitNoPerm
		}
	}
	if cause, c := classifyConnect(err); c != exitUnavailable {
		// Refused rights (an ACL without a command), a missing database,
		// an eviction policy: said in the store's own words, without the
		// library's layers, which repeat the lock's name.
		return fail(c, "%s: %s: %s", op, s.where, oneLine(scrub(cause, s.secrets)))
	}
	msg = strings.TrimPrefix(msg, "dlock: ")
	parts := []string{op, s.where, msg}
	if named {
		parts[0] = ""
	}
	if s.addr != "" && strings.Contains(msg, s.addr) {
		parts[1] = ""
	}
	return fail(code, "%s", strings.Join(slices.DeleteFunc(parts, func(p string) bool { return p == "" }), ": "))
}

// quietRedisLogger drops go-redis's own log lines (reconnects, sentinel
// events), which would otherwise go to stderr between dlock's messages.
type quietRedisLogger struct{}

func (quietRedisLogger) Printf(context.Context, string, ...any) {}

var silenceRedis sync.Once

// connect opens the store b describes and checks that it answers, all
// within timeout. Its errors are *exitError: 69 when the store cannot be
// reached or fails.
func connect(ctx context.Context, b *backendURL, timeout time.Duration) (*store, error) {
	return connectHooked(ctx, b, timeout, connectHooks{})
}

// connectHooked is connect, with hooks on the store's clients.
func connectHooked(ctx context.Context, b *backendURL, timeout time.Duration, hooks connectHooks) (*store, error) {
	silenceRedis.Do(func() { redis.SetLogger(quietRedisLogger{}) })
	s := &store{where: b.where, secrets: b.secrets}
	var ping func(ctx context.Context) error
	switch b.kind {
	case kindRedis, kindSentinel, kindCluster:
		rdb := newRedisClient(b, timeout, false)
		if hooks.redis != nil {
			rdb.AddHook(hooks.redis)
		}
		s.closeFn, s.rdbs = rdb.Close, []redis.UniversalClient{rdb}
		if b.kind == kindRedis && b.redis != nil {
			s.addr = b.redis.Addr // redislock's errors name it (see storeErr)
		}
		ping = func(ctx context.Context) error {
			if b.failover != nil {
				if err := askSentinels(ctx, b.failover); err != nil {
					return err
				}
			}
			// A client of its own, without go-redis's retries, so that a
			// refused connection is reported at once, not after backoff.
			probe := newRedisClient(b, timeout, true)
			defer probe.Close()
			return probe.Ping(ctx).Err()
		}
		var opts []redislock.Option
		if b.replicaAck > 0 {
			opts = append(opts, redislock.WithReplicaAck(b.replicaAck, b.replicaAckTimeout))
		}
		if b.allowEviction {
			opts = append(opts, redislock.WithEvictionAllowed())
		}
		if hooks.log != nil {
			opts = append(opts, redislock.WithLogger(hooks.log))
		}
		rb := redislock.New(rdb, opts...)
		s.backend, s.inspector = rb, rb
	case kindRedlock:
		var err error
		if s, ping, err = connectRedlock(b, timeout, hooks.redis, hooks.log); err != nil {
			return nil, err
		}
	case kindEtcd:
		cli, err := newEtcdClient(b.etcd, timeout)
		if err != nil {
			// clientv3.New logs in when given a user: a refused password
			// comes back here.
			return nil, s.connectErr(err)
		}
		s.closeFn = cli.Close
		eb := etcdlock.New(cli, etcdOptions(b.etcd)...)
		s.backend, s.inspector = eb, eb
		s.storeTTL = etcdlock.StoreTTL
		ping = func(ctx context.Context) error {
			// A linearizable read: it needs a leader, as every lock
			// operation does.
			ns := b.etcd.namespace
			if ns == "" {
				ns = etcdlock.DefaultNamespace
			}
			_, err := cli.Get(ctx, ns, clientv3.WithPrefix(), clientv3.WithCountOnly())
			return err
		}
	case kindSQLite, kindMySQL, kindPostgres:
		db, dialect, err := openSQL(b, timeout, hooks.statements)
		if err != nil {
			return nil, err
		}
		s.closeFn, s.db, s.dialect = db.Close, db, dialect
		if b.kind == kindSQLite {
			s.sqlitePath = b.path
		}
		ping = db.PingContext
		be, err := newSQLBackend(db, dialect, hooks.readOnly)
		if err != nil {
			_ = db.Close()
			return nil, fail(exitUnavailable, "%s: %v", s.where, err)
		}
		s.backend = be
		s.inspector, _ = be.(driver.Inspector)
		if hooks.readOnly && s.inspector != nil {
			s.inspector = &tablesOptional{ro: s.inspector, full: func() driver.Inspector {
				full, _ := newSQLBackend(db, dialect, false)
				in, _ := full.(driver.Inspector)
				return in
			}}
		}
	default:
		return nil, fail(exitUsage, "backend %q is not supported", b.kind)
	}
	if hooks.check != nil {
		if err := hooks.check(s.backend, s.where); err != nil {
			_ = s.Close()
			return nil, err
		}
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := ping(pctx); err != nil {
		_ = s.Close()
		var ne net.Error
		timedOut := pctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
		if timedOut && ctx.Err() == nil {
			hint := ""
			if b.redis != nil && b.redis.TLSConfig != nil {
				// A server without TLS waits for the end of a line that the
				// TLS handshake never sends: no error, only silence.
				hint = "; the URL asks for TLS (rediss://): is the server's port a TLS one?"
			}
			return nil, fail(exitUnavailable, "no answer from %s within %v (--connect-timeout)%s", s.where, timeout, hint)
		}
		return nil, s.connectErr(err)
	}
	return s, nil
}

// newRedisClient makes the go-redis client for b, with dial timeouts no
// longer than the connect timeout, and socket deadlines taken from the
// context of each call (ContextTimeoutEnabled): without it, a server that
// accepts connections but never answers holds the first call for the full
// read timeout, whatever --connect-timeout says.
func newRedisClient(b *backendURL, timeout time.Duration, noRetries bool) redis.UniversalClient {
	dial := func(d time.Duration) time.Duration {
		if d <= 0 || d > timeout {
			return timeout
		}
		return d
	}
	retries := func(n int) int {
		if noRetries {
			return -1
		}
		return n
	}
	switch {
	case b.failover != nil:
		o := *b.failover
		o.DialTimeout = dial(o.DialTimeout)
		o.ContextTimeoutEnabled = true
		o.MaxRetries = retries(o.MaxRetries)
		return redis.NewFailoverClient(&o)
	case b.cluster != nil:
		o := *b.cluster
		o.DialTimeout = dial(o.DialTimeout)
		o.ContextTimeoutEnabled = true
		o.MaxRetries = retries(o.MaxRetries)
		return redis.NewClusterClient(&o)
	default:
		o := *b.redis
		o.DialTimeout = dial(o.DialTimeout)
		o.ContextTimeoutEnabled = true
		o.MaxRetries = retries(o.MaxRetries)
		return redis.NewClient(&o)
	}
}

// connectRedlock opens one client per node of a redlock:// URL, with hook
// when not nil. Its ping succeeds once a quorum of nodes answers, as Redlock
// itself would.
func connectRedlock(b *backendURL, timeout time.Duration, hook redis.Hook, log *slog.Logger) (*store, func(context.Context) error, error) {
	clients := make([]redis.UniversalClient, len(b.redlock.nodes))
	for i, o := range b.redlock.nodes {
		clients[i] = newRedisClient(&backendURL{redis: o}, timeout, false)
		if hook != nil {
			clients[i].AddHook(hook)
		}
	}
	s := &store{where: b.where, secrets: b.secrets, rdbs: clients}
	s.closeFn = func() error {
		var first error
		for _, c := range clients {
			if err := c.Close(); err != nil && first == nil {
				first = err
			}
		}
		return first
	}
	var opts []redlock.Option
	if b.redlock.nodeTimeout > 0 {
		opts = append(opts, redlock.WithNodeTimeout(b.redlock.nodeTimeout))
	}
	if b.allowEviction {
		opts = append(opts, redlock.WithEvictionAllowed())
	}
	if log != nil {
		opts = append(opts, redlock.WithLogger(log))
	}
	rl, err := redlock.New(clients, opts...)
	if err != nil {
		_ = s.Close()
		return nil, nil, fail(exitUsage, "%s: %v", s.where, err)
	}
	s.backend, s.inspector = rl, rl
	ping := func(ctx context.Context) error {
		type answer struct {
			addr string
			err  error
		}
		answers := make(chan answer, len(clients))
		for _, o := range b.redlock.nodes {
			go func() {
				probe := newRedisClient(&backendURL{redis: o}, timeout, true)
				defer probe.Close()
				answers <- answer{o.Addr, probe.Ping(ctx).Err()}
			}()
		}
		quorum := len(clients)/2 + 1
		var ok int
		var failed []string
		for range clients {
			a := <-answers
			if a.err == nil {
				if ok++; ok == quorum {
					return nil
				}
				continue
			}
			failed = append(failed, a.addr+": "+a.err.Error())
			if len(failed) > len(clients)-quorum {
				return fmt.Errorf("%d of %d nodes failed, a quorum needs %d: %s", len(failed), len(clients), quorum, strings.Join(failed, "; "))
			}
		}
		return nil
	}
	return s, ping, nil
}

// askSentinels asks each sentinel in turn for the master's address and
// returns nil at the first answer. go-redis's failover client retries
// unreachable sentinels until the context ends and then reports only that;
// this says what went wrong.
func askSentinels(ctx context.Context, o *redis.FailoverOptions) error {
	var last error
	for _, addr := range o.SentinelAddrs {
		sc := redis.NewSentinelClient(&redis.Options{
			Addr:                  addr,
			Username:              o.SentinelUsername,
			Password:              o.SentinelPassword,
			DialTimeout:           o.DialTimeout,
			MaxRetries:            -1,
			ContextTimeoutEnabled: true,
		})
		_, err := sc.GetMasterAddrByName(ctx, o.MasterName).Result()
		_ = sc.Close()
		switch {
		case err == nil:
			return nil
		case errors.Is(err, redis.Nil):
			last = fmt.Errorf("sentinel %s knows no master named %q", addr, o.MasterName)
		default:
			last = fmt.Errorf("sentinel %s: %w", addr, err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return last
}

// sqlDialect names the SQL dialect for newSQLBackend.
type sqlDialect int

const (
	dialectSQLite sqlDialect = iota + 1
	dialectMySQL
	dialectPostgres
)

// openSQL opens the database handle for b, its statements counted by
// counter when not nil. It does no I/O except, for the default SQLite file,
// creating its directory.
func openSQL(b *backendURL, timeout time.Duration, counter *bench.StatementCounter) (*sql.DB, sqlDialect, error) {
	open := func(conn sqldriver.Connector) *sql.DB {
		if counter != nil {
			conn = counter.Connector(conn)
		}
		return sql.OpenDB(conn)
	}
	switch b.kind {
	case kindSQLite:
		dir := filepath.Dir(b.path)
		st, err := os.Stat(dir)
		if err != nil || !st.IsDir() {
			return nil, 0, fail(exitUnavailable, "%s: directory %s does not exist", b.where, dir)
		}
		if err := createShared(b.path, st); err != nil {
			return nil, 0, fail(exitUnavailable, "%s: %v", b.where, err)
		}
		var db *sql.DB
		if counter != nil {
			db, err = counter.OpenCounted("sqlite", sqliteDSN(b.path))
		} else {
			db, err = sql.Open("sqlite", sqliteDSN(b.path))
		}
		if err != nil {
			return nil, 0, fail(exitUnavailable, "%s: %v", b.where, err)
		}
		return db, dialectSQLite, nil
	case kindMySQL:
		cfg := b.mysql.Clone()
		if cfg.Timeout <= 0 || cfg.Timeout > timeout {
			cfg.Timeout = timeout
		}
		conn, err := mysql.NewConnector(cfg)
		if err != nil {
			return nil, 0, fail(exitUsage, "%s: %s", b.where, oneLine(scrub(err.Error(), b.secrets)))
		}
		return open(conn), dialectMySQL, nil
	case kindPostgres:
		cfg := b.postgres.Copy()
		if cfg.ConnectTimeout <= 0 || cfg.ConnectTimeout > timeout {
			cfg.ConnectTimeout = timeout
		}
		return open(stdlib.GetConnector(*cfg)), dialectPostgres, nil
	}
	return nil, 0, errors.New("not an SQL backend")
}

// sqliteDSN is modernc.org/sqlite's data source name for the file at path:
// a "file:" URI, so that any character may appear in the path, with a busy
// timeout. It sets no journal_mode: sqllock switches the file to write-ahead
// logging (which lets readers such as dlock ls run beside writers) when it
// creates the table, and retries while the file is busy, whereas a
// journal_mode pragma here runs on every new connection, and on a fresh file
// opened by several processes at once fails some with SQLITE_BUSY without
// waiting for the busy timeout.
func sqliteDSN(path string) string {
	u := url.URL{Path: path}
	q := url.Values{"_pragma": {fmt.Sprintf("busy_timeout(%d)", sqliteBusyTimeout)}}
	return "file:" + u.EscapedPath() + "?" + q.Encode()
}

// defaultSQLitePath is the embedded default store: locks.db in
// $XDG_STATE_HOME/dlock, or ~/.local/state/dlock when XDG_STATE_HOME is not
// set (or not absolute, as the XDG spec asks).
func defaultSQLitePath() (string, error) {
	base := os.Getenv("XDG_STATE_HOME")
	if !filepath.IsAbs(base) {
		home, err := os.UserHomeDir()
		if err != nil || home == "" {
			return "", errors.New("neither XDG_STATE_HOME nor HOME is set; give --backend or DLOCK_BACKEND")
		}
		base = filepath.Join(home, ".local", "state")
	}
	return filepath.Join(base, "dlock", "locks.db"), nil
}

// defaultBackend returns the default store's URL, creating its directory
// (mode 0700: lock names and owners are nobody else's business) on first use
// when create is set.
func defaultBackend(create bool) (*backendURL, error) {
	path, err := defaultSQLitePath()
	if err != nil {
		return nil, fail(exitConfig, "default store: %v", err)
	}
	b := &backendURL{kind: kindSQLite, path: path, where: "SQLite file " + path, isDefault: true}
	if !create {
		return b, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fail(exitUnavailable, "default store: cannot create %s: %v", filepath.Dir(path), unwrapPathErr(err))
	}
	return b, nil
}

// unwrapPathErr drops the path an *os.PathError repeats.
func unwrapPathErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// expiresWithin is how long, at most, the store keeps a lock of ttl that
// its holder could not release.
func (s *store) expiresWithin(ttl time.Duration) time.Duration {
	if s.storeTTL != nil {
		return max(ttl, s.storeTTL(ttl))
	}
	return ttl
}
