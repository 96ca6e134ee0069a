package sqllock

import (
	"context"
	"time"
)

// SetHeartbeat sets how often a quiet listener checks its connection, until
// the returned function restores it.
func SetHeartbeat(d time.Duration) (restore func()) {
	old := heartbeat
	heartbeat = d
	return func() { heartbeat = old }
}

// Notification payloads.
var (
	EncodePayload = encodePayload
	DecodePayload = decodePayload
)

// IsTransientError reports whether the Backend would mark err, a database
// error met by a caller whose context is live, as transient.
func IsTransientError(err error) bool { return transient(context.Background(), err) }
