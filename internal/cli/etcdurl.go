// The etcd URL form: etcd:// and etcds:// (TLS), several endpoints, a user
// and password, and the parameters of the client and of etcdlock.

package cli

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dlock-go/dlock/etcdlock"
)

// etcdPort is the default client port of etcd.
const etcdPort = "2379"

// etcdURL is a parsed etcd:// or etcds:// URL.
type etcdURL struct {
	endpoints []string // host:port
	user      string
	password  string
	tls       bool   // etcds://, or tls=1
	ca        string // ca=FILE: trust these roots instead of the system's
	cert, key string // cert=FILE&key=FILE: client certificate
	insecure  bool   // insecure_skip_verify=1
	namespace string // namespace=PREFIX; "" for etcdlock's default
	timeout   time.Duration
	noHandoff bool // handoff=0 (etcdlock.WithHandoff(false))
}

// parseEtcd reads etcd://[user[:pass]@]h1:2379,h2:2379[/][?params] and the
// same with etcds:// (TLS). Parameters: tls=1 (as etcds://), ca=FILE,
// cert=FILE and key=FILE (a client certificate), insecure_skip_verify=1,
// namespace=PREFIX (etcdlock.WithNamespace), op_timeout=3s
// (etcdlock.WithTimeout), handoff=0 (etcdlock.WithHandoff(false)).
func parseEtcd(raw string) (*backendURL, error) {
	scheme, rest, _ := strings.Cut(raw, ":")
	if !strings.HasPrefix(rest, "//") {
		return nil, fmt.Errorf("want %s://host:2379,host:2379, with two slashes", scheme)
	}
	rest = rest[2:]
	if strings.IndexByte(rest, '#') >= 0 {
		return nil, errors.New("a fragment ('#...') has no meaning here; percent-encode '#' in a password as %23")
	}
	e := &etcdURL{tls: scheme == "etcds"}
	// As net/url reads it (RFC 3986): the authority ends at the first '/'
	// or '?', and its user information at its last '@'; an '@' in the
	// query (namespace=a@b) is the query's. net/url itself is not used as
	// it refuses a list of hosts that holds an IPv6 address.
	authority, pathQuery, _ := cutAny(rest, "/?")
	if at := strings.LastIndexByte(authority, '@'); at >= 0 {
		u, p, _ := strings.Cut(authority[:at], ":")
		authority = authority[at+1:]
		var err1, err2 error
		e.user, err1 = url.PathUnescape(u)
		e.password, err2 = url.PathUnescape(p)
		if err1 != nil || err2 != nil {
			return nil, errors.New("bad percent-encoding in the user or password")
		}
		if e.password != "" && e.user == "" {
			return nil, errors.New("a password without a user name; etcd authenticates a user")
		}
	}
	hostPart := authority
	path, rawQuery, _ := strings.Cut(pathQuery, "?")
	if strings.Contains(path, "@") && e.user == "" {
		return nil, errors.New("the password seems to contain '/'; percent-encode it as %2F")
	}
	if strings.Trim(path, "/") != "" {
		return nil, errors.New("an etcd URL has no path; give the key prefix as namespace=PREFIX")
	}
	query, err := url.ParseQuery(rawQuery)
	if err != nil {
		return nil, errors.New("bad query string")
	}
	for h := range strings.SplitSeq(hostPart, ",") {
		addr, err := hostPort(h, etcdPort)
		if err != nil {
			return nil, err
		}
		e.endpoints = append(e.endpoints, addr)
	}
	for k, vs := range query {
		v := vs[len(vs)-1]
		switch k {
		case "tls", "insecure_skip_verify":
			on, err := boolParam(k, v)
			if err != nil {
				return nil, err
			}
			if k == "tls" {
				e.tls = e.tls || on
			} else {
				e.insecure = on
			}
		case "ca":
			e.ca = v
		case "cert":
			e.cert = v
		case "key":
			e.key = v
		case "namespace":
			if v != "" && !strings.HasSuffix(v, "/") {
				return nil, fmt.Errorf("namespace=%q must end with '/' (lock names follow it directly)", printable(v, 40))
			}
			e.namespace = v
		case "handoff":
			on, err := boolParam(k, v)
			if err != nil {
				return nil, err
			}
			e.noHandoff = !on
		case "op_timeout":
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return nil, fmt.Errorf("op_timeout=%q is not a positive duration (like 3s)", printable(v, 20))
			}
			e.timeout = d
		default:
			return nil, fmt.Errorf("unknown parameter %q; etcd takes tls, ca, cert, key, insecure_skip_verify, namespace, op_timeout and handoff", printable(k, 30))
		}
	}
	if (e.cert == "") != (e.key == "") {
		return nil, errors.New("give cert= and key= together")
	}
	if e.ca != "" || e.cert != "" || e.insecure {
		e.tls = true
	}
	b := &backendURL{etcd: e, user: e.user}
	if e.password != "" {
		b.secrets = append(b.secrets, e.password)
	}
	b.where = "etcd at " + strings.Join(e.endpoints, ",")
	return b, nil
}

// boolParam reads a 0/1/true/false parameter.
func boolParam(k, v string) (bool, error) {
	switch strings.ToLower(v) {
	case "1", "true", "yes", "on", "":
		return true, nil
	case "0", "false", "no", "off":
		return false, nil
	}
	return false, fmt.Errorf("%s=%q is not 1 or 0", k, printable(v, 20))
}

// newEtcdClient makes the etcd client for e, with etcdlock's settings for
// gray failures (keep-alives: see etcdlock.Configure). clientv3.New dials
// in the background, but logs in at once when given a user (within
// timeout).
func newEtcdClient(e *etcdURL, timeout time.Duration) (*clientv3.Client, error) {
	cfg := clientv3.Config{
		Endpoints:   e.endpoints,
		Username:    e.user,
		Password:    e.password,
		DialTimeout: timeout,
		Logger:      zap.NewNop(),
	}
	etcdlock.Configure(&cfg)
	if e.tls {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: e.insecure} //nolint:gosec // asked for by insecure_skip_verify=1
		if e.ca != "" {
			pem, err := os.ReadFile(e.ca)
			if err != nil {
				return nil, fmt.Errorf("ca: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("ca: no PEM certificate in %s", e.ca)
			}
			tc.RootCAs = pool
		}
		if e.cert != "" {
			cert, err := tls.LoadX509KeyPair(e.cert, e.key)
			if err != nil {
				return nil, fmt.Errorf("client certificate: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		cfg.TLS = tc
	}
	return clientv3.New(cfg)
}

// etcdOptions are the etcdlock options e asks for.
func etcdOptions(e *etcdURL) []etcdlock.Option {
	var opts []etcdlock.Option
	if e.namespace != "" {
		opts = append(opts, etcdlock.WithNamespace(e.namespace))
	}
	if e.timeout > 0 {
		opts = append(opts, etcdlock.WithTimeout(e.timeout))
	}
	if e.noHandoff {
		opts = append(opts, etcdlock.WithHandoff(false))
	}
	return opts
}
