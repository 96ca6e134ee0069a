package redislock

import (
	"context"
	_ "embed"
	"strconv"

	"github.com/dlock-go/dlock/driver"
	"github.com/redis/go-redis/v9"
)

var _ driver.Proclaimer = (*Backend)(nil)

var (
	//go:embed proclaim.lua
	proclaimLua    string
	proclaimScript = redis.NewScript(proclaimLua)
)

// Proclaim implements driver.Proclaimer in one script on the lock hash: it
// sets the owner of req.Token's unexpired grant with fence req.Fence, when
// req.Seq is above the grant's last applied one. With WithReplicaAck it
// waits for the replicas as a renewal does, and returns a
// *ReplicaAckError when too few acknowledged (the proclaim may then be
// lost in a failover, as an unacknowledged renewal may).
func (b *Backend) Proclaim(ctx context.Context, req driver.ProclaimRequest) (bool, error) {
	if b.err != nil {
		return false, b.err
	}
	call := scriptCall{
		keys: []string{b.lockKey(req.Key)},
		args: []any{req.Token, fenceArg(req.Fence), req.Owner, strconv.FormatUint(req.Seq, 10)},
	}
	if !b.acking() {
		n, err := proclaimScript.Run(ctx, b.rdb, call.keys, call.args...).Int64()
		if err != nil {
			b.movedOn(ctx, err)
			return false, b.storeError(ctx, "proclaim", req.Key, err)
		}
		return n == 1, nil
	}
	conn, err := b.connFor(ctx, call.keys[0])
	if err != nil {
		return false, b.storeError(ctx, "proclaim", req.Key, err)
	}
	cmds, acked, ackErr := b.runAckedAt(ctx, conn, proclaimScript, []scriptCall{call})
	n, err := cmds[0].Int64()
	switch {
	case err != nil:
		b.movedOn(ctx, err)
		return false, b.storeError(ctx, "proclaim", req.Key, err)
	case n != 1:
		return false, nil
	case ackErr != nil:
		return false, b.storeError(ctx, "proclaim", req.Key, ackErr)
	case acked < b.ackReplicas:
		return false, b.storeError(ctx, "proclaim", req.Key,
			&ReplicaAckError{Op: "proclaim", Key: req.Key, Want: b.ackReplicas, Got: acked})
	}
	return true, nil
}
