package etcdlock

import (
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Configure sets the fields of cfg that let a Backend ride out gray
// failures, where cfg leaves them unset: gRPC keep-alives
// (DialKeepAliveTime 10s, the shortest gRPC allows, and
// DialKeepAliveTimeout 3s), so that the connection to a member that froze
// or went half-open is closed within some 13s and the client's calls and
// watches move to the other members. Until then a call that hangs on that
// member ends at the Backend's attempt timeout (see WithTimeout) and is
// tried again on another. Call it before clientv3.New.
func Configure(cfg *clientv3.Config) {
	if cfg.DialKeepAliveTime == 0 {
		cfg.DialKeepAliveTime = keepAliveTime
	}
	if cfg.DialKeepAliveTimeout == 0 {
		cfg.DialKeepAliveTimeout = keepAliveTimeout
	}
}

const (
	keepAliveTime    = 10 * time.Second
	keepAliveTimeout = 3 * time.Second
)
