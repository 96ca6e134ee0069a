package sqllock

import "time"

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
