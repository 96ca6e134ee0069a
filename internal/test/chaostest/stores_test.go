package chaostest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/locktest/chaos"
	"github.com/dlock-go/dlock/memlock"
	"github.com/dlock-go/dlock/redislock"
	"github.com/dlock-go/dlock/redlock"
	"github.com/dlock-go/dlock/sqllock"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// The kinds of store a scenario runs on, in the order of the subtests.
const (
	kindMemlock  = "memlock"
	kindRedis    = "redis"
	kindRedlock  = "redlock"
	kindSQLite   = "sqlite"
	kindMariaDB  = "mariadb"
	kindPostgres = "postgres"
	kindEtcd     = "etcd" // a 3-member cluster; not in allKinds: TestEtcd runs its scenarios
)

// allKinds are every store; storeKinds those that run in a server or a
// file, which other processes can reach (memlock lives in the test's
// memory).
var (
	allKinds   = []string{kindMemlock, kindRedis, kindRedlock, kindSQLite, kindMariaDB, kindPostgres}
	storeKinds = allKinds[1:]
)

// storeSpec says how any process reaches a store; it is JSON-encoded for
// child processes.
type storeSpec struct {
	Kind  string   `json:"kind"`            // one of the kind constants
	Addrs []string `json:"addrs,omitempty"` // redis/redlock host:port, through the proxies when the store has them
	DSN   string   `json:"dsn,omitempty"`   // SQLite file DSN, MariaDB DSN, PostgreSQL URL; memlock: its key in memStores
	// NodeTimeout is redlock's WithNodeTimeout, or 0 for its default.
	NodeTimeout time.Duration `json:"node_timeout,omitempty"`
	// dial, when set, makes the connections of a redis store's client (a
	// fault-injecting Dialer); in this process only.
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// memStores holds the memlock stores of the running tests, by the DSN of
// their storeSpec, so that open finds them (in this process only).
var (
	memStores sync.Map // string → *memlock.Backend
	memSeq    atomic.Int64
)

// Timeouts of the store clients that open makes.
const (
	// redisTimeout bounds a go-redis dial and the calls made without a
	// context deadline (the client gives acquire, renew and release one,
	// which go-redis honours on the socket: ContextTimeoutEnabled).
	redisTimeout = time.Second
)

// open makes a new backend on the store, as a new process would, with
// connections of its own, and returns it with a function that closes them
// (to be called after the dlock client on the backend is closed). Child
// processes call it too, so it takes no *testing.T.
//
// The go-redis clients do not retry (MaxRetries -1): a request whose
// connection broke is reported to the backend as an error, so every answer
// in the history is the answer to the one request sent, and a call whose
// effect is unknown is recorded as such.
func (s storeSpec) open() (driver.Backend, func() error, error) {
	switch s.Kind {
	case kindMemlock:
		b, ok := memStores.Load(s.DSN)
		if !ok {
			return nil, nil, fmt.Errorf("chaostest: memlock store %q: not in this process", s.DSN)
		}
		return b.(*memlock.Backend), func() error { return nil }, nil
	case kindRedis:
		if len(s.Addrs) != 1 {
			return nil, nil, fmt.Errorf("chaostest: redis store: %d addresses, want 1", len(s.Addrs))
		}
		opts := redisOptions(s.Addrs[0])
		opts.Dialer = s.dial
		rdb := redis.NewClient(opts)
		return redislock.New(rdb), rdb.Close, nil
	case kindRedlock:
		if len(s.Addrs) == 0 {
			return nil, nil, errors.New("chaostest: redlock store: no addresses")
		}
		clients := make([]redis.UniversalClient, len(s.Addrs))
		for i, addr := range s.Addrs {
			clients[i] = newRedisClient(addr)
		}
		closeAll := func() error {
			var errs []error
			for _, c := range clients {
				errs = append(errs, c.Close())
			}
			return errors.Join(errs...)
		}
		var opts []redlock.Option
		if s.NodeTimeout > 0 {
			opts = append(opts, redlock.WithNodeTimeout(s.NodeTimeout))
		}
		b, err := redlock.New(clients, opts...)
		if err != nil {
			_ = closeAll()
			return nil, nil, fmt.Errorf("chaostest: redlock store: %w", err)
		}
		// Connect to every node now, as a process would at startup: a
		// first call that must also dial can miss its node timeout on a
		// loaded machine. A node that is down is not an error here.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = b.Ping(ctx)
		cancel()
		return b, closeAll, nil
	case kindEtcd:
		cfg := clientv3.Config{Endpoints: s.Addrs, DialTimeout: redisTimeout, Logger: zap.NewNop()}
		etcdlock.Configure(&cfg) // keep-alives, as an application should set them
		c, err := clientv3.New(cfg)
		if err != nil {
			return nil, nil, fmt.Errorf("chaostest: etcd store: %w", err)
		}
		return etcdlock.New(c), c.Close, nil
	case kindSQLite, kindMariaDB, kindPostgres:
		db, d, err := s.openDB()
		if err != nil {
			return nil, nil, err
		}
		switch d {
		case sqllock.PostgreSQL:
			return sqllock.NewPostgres(db), db.Close, nil
		case sqllock.SQLite:
			return sqllock.NewSQLite(db), db.Close, nil // as the CLI does
		}
		return sqllock.New(db, d), db.Close, nil
	}
	return nil, nil, fmt.Errorf("chaostest: unknown store kind %q", s.Kind)
}

// newRedisClient returns a go-redis client for addr as open uses it.
func newRedisClient(addr string) *redis.Client { return redis.NewClient(redisOptions(addr)) }

// redisOptions are the options of open's go-redis clients.
func redisOptions(addr string) *redis.Options {
	return &redis.Options{
		Addr:                  addr,
		MaxRetries:            -1,
		DialTimeout:           redisTimeout,
		ReadTimeout:           redisTimeout,
		WriteTimeout:          redisTimeout,
		ContextTimeoutEnabled: true,
	}
}

// openDB opens a pool on a SQL store, as the sqllock documentation
// recommends for its dialect.
func (s storeSpec) openDB() (*sql.DB, sqllock.Dialect, error) {
	var (
		driverName string
		d          sqllock.Dialect
	)
	switch s.Kind {
	case kindSQLite:
		driverName, d = "sqlite", sqllock.SQLite
	case kindMariaDB:
		driverName, d = "mysql", sqllock.MySQL
	case kindPostgres:
		driverName, d = "pgx", sqllock.PostgreSQL
	default:
		return nil, 0, fmt.Errorf("chaostest: %s is not a SQL store", s.Kind)
	}
	db, err := sql.Open(driverName, s.DSN)
	if err != nil {
		return nil, 0, fmt.Errorf("chaostest: open %s store: %w", s.Kind, err)
	}
	if d == sqllock.SQLite {
		db.SetMaxOpenConns(1)
	}
	return db, d, nil
}

// storeOptions configures startStore.
type storeOptions struct {
	// AOF runs redis-server with appendonly yes and appendfsync always, so
	// that a killed server restarts with every write it acknowledged.
	AOF bool
	// Proxy puts a testserver.Proxy between the clients and a redis,
	// MariaDB or PostgreSQL server (store.proxy); redlock's nodes always
	// have one each; etcd gets one in front of each member's client and
	// peer URLs (testserver.Etcd.Partition).
	Proxy bool
	// OwnServer starts a MariaDB or PostgreSQL server for the store alone,
	// for a scenario that stops, kills or restarts it (store.sqlServer);
	// otherwise the store is a database of its own on a server that the
	// package's tests share (sharedMariaDB, sharedPostgres).
	OwnServer bool
}

// store is one store started for one subtest, with the handles that
// inject faults into it.
type store struct {
	spec storeSpec
	name string // the subtest's name: the kind

	// Handles for faults; nil when not this kind.
	mem      *memlock.Backend
	redis    *testserver.Redis   // redis
	nodes    []*testserver.Redis // redlock
	proxies  []*testserver.Proxy // redlock: one per node, in node order
	proxy    *testserver.Proxy   // redis, mariadb, postgres with storeOptions.Proxy
	etcd     *testserver.Etcd    // etcd: the cluster
	maria    *testserver.MariaDB
	pg       *testserver.Postgres
	shared   bool   // mariadb, postgres: maria or pg is shared (no OwnServer)
	database string // mariadb, postgres: the database of the locks
	sqlite   string // sqlite: the file

	// leftovers returns everything left of locks on the store: holds of
	// every mode, queue entries and writer intents, expired or not where
	// the store keeps expired ones (SQL rows); fence counters, kept on
	// purpose, are left out. It reads the servers directly, not through
	// the proxies.
	leftovers func(t *testing.T) []string
	// live is leftovers without what has expired by the store's clock.
	live func(t *testing.T) []string
	// heads reads every name's live holder and queue head (sqlHeads),
	// directly from the server; nil where the test does not read them.
	heads func(ctx context.Context) ([]headSight, error)
	// settle is how long the store may take, after a call returned, to
	// finish it in the background (redlock's late node answers and
	// clean-ups); 0 for the others.
	settle time.Duration

	mu    sync.Mutex
	names []string // lock names used, for memlock's leftovers
}

// startStore starts a fresh store of kind for t and stops it when t ends.
// A missing server program skips the test, or fails it under CI=true.
func startStore(t *testing.T, kind string, o storeOptions) *store {
	t.Helper()
	s := &store{spec: storeSpec{Kind: kind}, name: kind}
	switch kind {
	case kindMemlock:
		s.mem = memlock.New()
		s.spec.DSN = "memlock-" + strconv.FormatInt(memSeq.Add(1), 10)
		memStores.Store(s.spec.DSN, s.mem)
		t.Cleanup(func() { memStores.Delete(s.spec.DSN) })
		s.leftovers = s.memLeftovers
		s.live = s.memLeftovers
	case kindRedis:
		testserver.RequireBinary(t, "redis-server")
		var args []string
		if o.AOF {
			args = []string{"--appendonly", "yes", "--appendfsync", "always"}
		}
		s.redis = testserver.StartRedis(t, args...)
		addr := s.redis.Addr()
		if o.Proxy {
			s.proxy = testserver.StartProxy(t, addr)
			addr = s.proxy.Addr()
		}
		s.spec.Addrs = []string{addr}
		admin := s.redis.Client(t)
		s.leftovers = func(t *testing.T) []string { return redisLeftovers(t, "", admin) }
		s.live = s.leftovers
	case kindRedlock:
		testserver.RequireBinary(t, "redis-server")
		var args []string
		if o.AOF {
			args = []string{"--appendonly", "yes", "--appendfsync", "always"}
		}
		admins := make([]*redis.Client, 3)
		for i := range 3 {
			srv := testserver.StartRedis(t, args...)
			px := testserver.StartProxy(t, srv.Addr())
			s.nodes = append(s.nodes, srv)
			s.proxies = append(s.proxies, px)
			s.spec.Addrs = append(s.spec.Addrs, px.Addr())
			admins[i] = srv.Client(t)
		}
		s.leftovers = func(t *testing.T) []string {
			var left []string
			for i, admin := range admins {
				left = append(left, redisLeftovers(t, fmt.Sprintf("node %d: ", i), admin)...)
			}
			return left
		}
		s.live = s.leftovers
		// A release returns once a quorum answered; the other nodes'
		// calls run on for at most min(4 × node timeout, 1s), and a
		// node client's dial or read timeout when it hangs.
		s.settle = time.Second + redisTimeout
	case kindSQLite:
		s.sqlite = filepath.Join(t.TempDir(), "locks.db")
		s.spec.DSN = "file:" + s.sqlite + "?_pragma=busy_timeout(5000)&_pragma=synchronous(NORMAL)"
		s.sqlLeftovers(t, s.spec, sqllock.SQLite)
	case kindMariaDB:
		if o.OwnServer {
			s.maria, s.database = testserver.StartMariaDB(t), "chaos"
		} else {
			s.maria, s.database, s.shared = sharedMariaDB(t), sharedDatabase(), true
		}
		s.maria.CreateDatabase(t, s.database)
		s.spec.DSN = s.maria.DSN(s.database)
		admin := s.spec
		if o.Proxy {
			s.proxy = testserver.StartProxy(t, s.maria.Addr())
			s.spec.DSN = withAddr(t, s.spec, s.proxy.Addr()).DSN
		}
		s.sqlLeftovers(t, admin, sqllock.MySQL)
	case kindPostgres:
		if o.OwnServer {
			s.pg, s.database = testserver.StartPostgres(t), "chaos"
		} else {
			s.pg, s.database, s.shared = sharedPostgres(t), sharedDatabase(), true
		}
		s.pg.CreateDatabase(t, s.database)
		s.spec.DSN = s.pg.URL(s.database)
		admin := s.spec
		if o.Proxy {
			s.proxy = testserver.StartProxy(t, s.pg.Addr())
			s.spec.DSN = withAddr(t, s.spec, s.proxy.Addr()).DSN
		}
		s.sqlLeftovers(t, admin, sqllock.PostgreSQL)
	case kindEtcd:
		if o.Proxy {
			s.etcd = testserver.StartEtcdClusterProxied(t, 3) // clients through the proxies
		} else {
			s.etcd = testserver.StartEtcdCluster(t, 3)
		}
		s.spec.Addrs = s.etcd.Endpoints()
		admin := s.etcd.ClientOf(t, s.etcd.Endpoint(0), s.etcd.Endpoint(1), s.etcd.Endpoint(2))
		s.leftovers = func(t *testing.T) []string { return etcdLeftovers(t, admin) }
		s.live = s.leftovers // etcd drops keys at their lease's expiry
		// A call that ended in an error may still be applied: a proposal
		// in flight through a leader change commits later (up to the
		// backend's 3s call timeout), and a grant then lives for its
		// lease (a 500ms TTL: 2s, plus etcd's 500ms expiry check).
		s.settle = 6 * time.Second
	default:
		t.Fatalf("unknown store kind %q", kind)
	}
	if s.spec.Kind != kindMemlock && s.spec.Kind != kindRedis && s.spec.Kind != kindRedlock && s.spec.Kind != kindEtcd {
		// Create the tables before any client runs, as an operator
		// would: the scenarios are about locking, not about racing DDL.
		b, closeFn, err := s.spec.open()
		if err != nil {
			t.Fatal(err)
		}
		var sb *sqllock.Backend
		switch b := b.(type) {
		case *sqllock.Backend:
			sb = b
		case *sqllock.PostgresBackend:
			sb = b.Backend
		case *sqllock.SQLiteBackend:
			sb = b.Backend
		}
		if err := sb.CreateTable(t.Context()); err != nil {
			t.Fatalf("create the lock tables: %v", err)
		}
		_ = closeFn()
	}
	return s
}

// server returns the address of the server behind a redis, MariaDB or
// PostgreSQL store (not its proxy).
func (s *store) server() string {
	switch {
	case s.redis != nil:
		return s.redis.Addr()
	case s.maria != nil:
		return s.maria.Addr()
	case s.pg != nil:
		return s.pg.Addr()
	}
	return ""
}

// ownProxy returns a new proxy to the server of a redis, MariaDB or
// PostgreSQL store and a spec that reaches the store through it, for one
// client whose network path alone is to fail (a partition of one client).
// It fails the test for other kinds.
func (s *store) ownProxy(t *testing.T) (storeSpec, *testserver.Proxy) {
	t.Helper()
	upstream := s.server()
	if upstream == "" {
		t.Fatalf("%s store: no single server to proxy", s.name)
	}
	px := testserver.StartProxy(t, upstream)
	return withAddr(t, s.spec, px.Addr()), px
}

// endsIdleTransactions returns spec with the session setting docs/SQL.md
// recommends for clients that can be cut off from a MariaDB or PostgreSQL
// server: a session idle inside a transaction for 2 s is ended, so that a
// client cut off in the middle of one of dlock's transactions holds its
// row locks for that long, not until the server notices the connection is
// gone. Other kinds are returned as they are.
func endsIdleTransactions(t *testing.T, spec storeSpec) storeSpec {
	t.Helper()
	switch spec.Kind {
	case kindMariaDB:
		cfg, err := mysql.ParseDSN(spec.DSN)
		if err != nil {
			t.Fatalf("parse MariaDB DSN: %v", err)
		}
		if cfg.Params == nil {
			cfg.Params = map[string]string{}
		}
		cfg.Params["idle_transaction_timeout"] = "2"
		spec.DSN = cfg.FormatDSN()
	case kindPostgres:
		u, err := url.Parse(spec.DSN)
		if err != nil {
			t.Fatalf("parse PostgreSQL URL: %v", err)
		}
		q := u.Query()
		q.Set("idle_in_transaction_session_timeout", "2000")
		u.RawQuery = q.Encode()
		spec.DSN = u.String()
	}
	return spec
}

// withAddr returns spec with its server address replaced by addr.
func withAddr(t *testing.T, spec storeSpec, addr string) storeSpec {
	t.Helper()
	switch spec.Kind {
	case kindRedis:
		spec.Addrs = []string{addr}
	case kindMariaDB:
		cfg, err := mysql.ParseDSN(spec.DSN)
		if err != nil {
			t.Fatalf("parse MariaDB DSN: %v", err)
		}
		cfg.Addr = addr
		spec.DSN = cfg.FormatDSN()
	case kindPostgres:
		u, err := url.Parse(spec.DSN)
		if err != nil {
			t.Fatalf("parse PostgreSQL URL: %v", err)
		}
		u.Host = addr
		spec.DSN = u.String()
	default:
		t.Fatalf("%s store: no server address to replace", spec.Kind)
	}
	return spec
}

// track records lock names used on the store (memlock's leftovers inspect
// them by name).
func (s *store) track(names ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range names {
		if !slices.Contains(s.names, n) {
			s.names = append(s.names, n)
		}
	}
}

// clientOn returns a dlock client called name, with opts, on a new backend
// made from spec (the store's own, or one through a proxy of its own, see
// ownProxy), as a separate process would have it, observed into rec with
// observe. The client is closed when the test ends, and then its
// connections.
func (s *store) clientOn(t *testing.T, spec storeSpec, rec *chaos.Recorder, name string, observe []chaos.ObserveOption, opts ...dlock.Option) *dlock.Client {
	t.Helper()
	b, closeFn, err := spec.open()
	if err != nil {
		t.Fatalf("client %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := closeFn(); err != nil {
			t.Logf("client %s: close its store connections: %v", name, err)
		}
	})
	c := dlock.New(chaos.Observe(b, rec, name, observe...), opts...)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// memLeftovers describes what the memlock store keeps for the names used:
// live holds, queue entries and writer intents (memlock forgets expired
// ones).
func (s *store) memLeftovers(t *testing.T) []string {
	t.Helper()
	var left []string
	seen := make(map[string]bool)
	infos, err := s.mem.List(t.Context(), "")
	if err != nil {
		t.Fatalf("memlock: list: %v", err)
	}
	s.mu.Lock()
	names := slices.Clone(s.names)
	s.mu.Unlock()
	for _, info := range infos {
		seen[info.Key] = true
		left = append(left, describeInfo(info)...)
	}
	for _, n := range names {
		if seen[n] {
			continue
		}
		info, _, err := s.mem.Inspect(t.Context(), n)
		if err != nil {
			t.Fatalf("memlock: inspect %q: %v", n, err)
		}
		info.Key = n
		left = append(left, describeInfo(info)...)
	}
	return left
}

// describeInfo lists what a LockInfo says is held or waiting.
func describeInfo(info driver.LockInfo) []string {
	var left []string
	if info.Owner != "" {
		left = append(left, fmt.Sprintf("%q: exclusive hold of %q (fence %d, ttl %v)", info.Key, info.Owner, info.Fence, info.TTL))
	}
	for _, h := range info.Shared {
		left = append(left, fmt.Sprintf("%q: shared hold of %q (fence %d, ttl %v)", info.Key, h.Owner, h.Fence, h.TTL))
	}
	if info.Queued > 0 {
		left = append(left, fmt.Sprintf("%q: %d queue entries", info.Key, info.Queued))
	}
	if info.WriterWaiting {
		left = append(left, fmt.Sprintf("%q: a writer intent", info.Key))
	}
	return left
}

// redisLeftovers lists the keys of one server, fence counters left out
// (redis forgets expired keys by itself). A server that cannot be asked is
// one leftover line, so that a caller that waits asks again.
// etcdLeftovers lists the keys of dlock's namespace, without the records
// of released and withdrawn tokens (r and x, which expire by themselves
// within seconds and hold nothing back).
func etcdLeftovers(t *testing.T, admin *clientv3.Client) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := admin.Get(ctx, etcdlock.DefaultNamespace, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatalf("etcd leftovers: %v", err)
	}
	var left []string
	for _, kv := range resp.Kvs {
		if k := string(kv.Key); !strings.Contains(k, "\x00r\x00") && !strings.Contains(k, "\x00x\x00") {
			left = append(left, strconv.Quote(string(kv.Key)))
		}
	}
	return left
}

func redisLeftovers(t *testing.T, prefix string, admin *redis.Client) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	keys, err := admin.Keys(ctx, "*").Result()
	if err != nil {
		return []string{prefix + "KEYS: " + err.Error()}
	}
	var left []string
	for _, k := range keys {
		if !strings.HasSuffix(k, ":fence") && !strings.HasSuffix(k, ":r") && !strings.HasSuffix(k, ":late") { // kept on purpose: fence counters; recent releases (15s); late-request records (5s)
			left = append(left, prefix+k)
		}
	}
	slices.Sort(left)
	return left
}

// sqlLeftovers sets s.leftovers, s.live and s.heads for a SQL store
// reached by admin (directly, not through a proxy).
func (s *store) sqlLeftovers(t *testing.T, admin storeSpec, d sqllock.Dialect) {
	var (
		once sync.Once
		db   *sql.DB
		oerr error
	)
	pool := func(t *testing.T) *sql.DB {
		once.Do(func() {
			db, _, oerr = admin.openDB()
		})
		if oerr != nil {
			t.Fatal(oerr)
		}
		return db
	}
	t.Cleanup(func() {
		if db != nil {
			_ = db.Close()
		}
	})
	s.leftovers = func(t *testing.T) []string { return sqlHeld(t, pool(t), d, false) }
	s.live = func(t *testing.T) []string { return sqlHeld(t, pool(t), d, true) }
	s.heads = func(ctx context.Context) ([]headSight, error) {
		once.Do(func() {
			db, _, oerr = admin.openDB()
		})
		if oerr != nil {
			return nil, oerr
		}
		return sqlHeads(ctx, db, d)
	}
}

// sqlNow is each dialect's current time, in the unit of its lock tables'
// time columns.
var sqlNow = map[sqllock.Dialect]string{
	sqllock.SQLite:     "CAST(round(unixepoch('subsec') * 1000) AS INTEGER)",
	sqllock.MySQL:      "UTC_TIMESTAMP(6)",
	sqllock.PostgreSQL: "now()",
}

// sqlHeld lists what the lock tables keep beyond each name's row and its
// fence: an exclusive holder's token, a writer's intent, a shared_until
// ahead, and every row of the shared-hold and queue tables; with liveOnly,
// only what has not expired by the database's clock. A database that
// cannot be asked is one line, so that a caller that waits asks again.
func sqlHeld(t *testing.T, db *sql.DB, d sqllock.Dialect, liveOnly bool) []string {
	t.Helper()
	now := sqlNow[d]
	main := sqllock.DefaultTable
	cond := "token IS NOT NULL OR intent_token IS NOT NULL OR shared_until > " + now
	side := ""
	if liveOnly {
		cond = "(token IS NOT NULL AND expires_at > " + now + ") OR (intent_token IS NOT NULL AND intent_until > " + now + ") OR shared_until > " + now
		side = " WHERE expires_at > " + now
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var left []string
	q := "SELECT name, COALESCE(token, ''), COALESCE(intent_token, ''), fence FROM " + main + " WHERE " + cond
	err := queryRows(ctx, db, q, func(rows *sql.Rows) error {
		var name, token, intent string
		var fence int64
		if err := rows.Scan(&name, &token, &intent, &fence); err != nil {
			return err
		}
		left = append(left, fmt.Sprintf("%s row %q: token %q, intent %q, fence %d", main, name, token, intent, fence))
		return nil
	})
	if err != nil {
		return []string{q + ": " + err.Error()}
	}
	for _, table := range []string{main + "_shared", main + "_queue"} {
		q := "SELECT name, token FROM " + table + side
		err := queryRows(ctx, db, q, func(rows *sql.Rows) error {
			var name, token string
			if err := rows.Scan(&name, &token); err != nil {
				return err
			}
			left = append(left, fmt.Sprintf("%s row %q: token %q", table, name, token))
			return nil
		})
		if err != nil {
			return []string{q + ": " + err.Error()}
		}
	}
	return left
}

// queryRows runs q and calls fn for each row.
func queryRows(ctx context.Context, db *sql.DB, q string, fn func(*sql.Rows) error) error {
	rows, err := db.QueryContext(ctx, q)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}
