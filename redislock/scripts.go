package redislock

import (
	"context"
	_ "embed"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The scripts run by EVALSHA; Script.Run falls back to EVAL on NOSCRIPT,
// which also puts the script back in the server's cache.
var (
	// common.lua holds the helpers of the scripts that handle shared holds,
	// writer intents and fair queues. withCommon puts it in the place a
	// script marks, after its fast path when it has one: Lua makes its
	// functions as the script runs, and the fast path needs none of them.
	//go:embed common.lua
	commonLua string

	//go:embed acquire.lua
	acquireLua    string
	acquireScript = redis.NewScript(withCommon(acquireLua))

	//go:embed renew.lua
	renewLua    string
	renewScript = redis.NewScript(withCommon(renewLua))

	//go:embed release.lua
	releaseLua    string
	releaseScript = redis.NewScript(withCommon(releaseLua))

	// inspect.lua and force_release.lua both begin with describe.lua.
	//go:embed describe.lua
	describeLua string

	//go:embed inspect.lua
	inspectLua    string
	inspectScript = redis.NewScript(withCommon(describeLua) + inspectLua)

	//go:embed force_release.lua
	forceReleaseLua    string
	forceReleaseScript = redis.NewScript(withCommon(describeLua) + forceReleaseLua)

	//go:embed raise_fence.lua
	raiseFenceLua    string
	raiseFenceScript = redis.NewScript(withCommon(raiseFenceLua))

	//go:embed fenced_set.lua
	fencedSetLua    string
	fencedSetScript = redis.NewScript(fencedSetLua)

	//go:embed fenced_get.lua
	fencedGetLua    string
	fencedGetScript = redis.NewScript(fencedGetLua)
)

// commonMark is the line of a script that withCommon replaces.
const commonMark = "--#common\n"

// withCommon returns script with common.lua in place of its line
// "--#common", or in front of it when it has no such line.
func withCommon(script string) string {
	if !strings.Contains(script, commonMark) {
		return commonLua + script
	}
	return strings.Replace(script, commonMark, commonLua, 1)
}

// scriptCall is one run of a script in a pipeline.
type scriptCall struct {
	keys []string
	args []any
}

// runPipelined runs script once per call in one pipeline and returns one
// command per call, in order. Calls that fail with NOSCRIPT (the script cache
// was flushed, or a failover reached a node that never saw the script) are
// sent again as EVAL in one more pipeline: EVAL caches the script as it runs
// it, so this costs one extra round trip, against two for SCRIPT LOAD and a
// second EVALSHA. On a ClusterClient go-redis splits both pipelines by node.
func runPipelined(ctx context.Context, rdb redis.Cmdable, script *redis.Script, calls []scriptCall) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(calls))
	pipe := rdb.Pipeline()
	for i, c := range calls {
		cmds[i] = pipe.EvalSha(ctx, script.Hash(), c.keys, c.args...)
	}
	_, _ = pipe.Exec(ctx) // errors are read per command below

	var retry []int
	for i, cmd := range cmds {
		if isNoScript(cmd.Err()) {
			retry = append(retry, i)
		}
	}
	if len(retry) == 0 {
		return cmds
	}
	pipe = rdb.Pipeline()
	for _, i := range retry {
		cmds[i] = script.Eval(ctx, pipe, calls[i].keys, calls[i].args...)
	}
	_, _ = pipe.Exec(ctx)
	return cmds
}

// isNoScript reports whether err says the server does not have the script.
// go-redis normalises the error to redis.ErrNoScript only outside pipelines.
func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}
