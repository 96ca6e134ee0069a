// The Redis backend URLs (redis://, rediss://, redis+sentinel://,
// redis+cluster://, redlock://) and their parameters.

package cli

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

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
